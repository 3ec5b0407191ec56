"""One vLLM engine in its own process, driven by JSON lines on stdin (one answer per line).

The engine tests start a prefill engine and a decode engine this way (vLLM's connector and
parallel state are per process, so two engines cannot share one). Commands:
``{"generate": [{"prompt": [ids], "max_tokens": n, "params": {...}|null}, ...]}`` ->
``[{"tokens", "finish_reason", "params"}]`` plus the call's wall time in ``"seconds"``
of the first entry; ``{"stats": true}`` -> the connector's totals;
``{"corrupt": {"layer", "delta"}}`` adds ``delta`` to that layer's whole cache (a control);
``{"quit": true}``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")


def main() -> None:
    spec: dict[str, Any] = json.loads(sys.argv[1])
    os.environ.update(spec.get("env", {}))
    # Answers go to the original stdout; everything vLLM prints goes to stderr.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    kv = spec.get("kv_transfer_config")
    llm = LLM(
        model=spec["model"],
        skip_tokenizer_init=True,
        dtype=spec.get("dtype", "float32"),
        block_size=spec.get("block_size", 32),
        max_model_len=spec.get("max_model_len", 512),
        max_num_seqs=8,
        max_num_batched_tokens=spec.get("max_num_batched_tokens", 2048),
        enable_prefix_caching=spec.get("prefix_caching", True),
        kv_transfer_config=KVTransferConfig(**kv) if kv else None,
        seed=0,
        enforce_eager=spec.get("enforce_eager", True),
        # TP > 1: vLLM's multiprocessing executor, one worker process (and connector
        # worker) per rank; the engine core itself stays in this process.
        tensor_parallel_size=spec.get("tp", 1),
        distributed_executor_backend="mp" if spec.get("tp", 1) > 1 else None,
    )
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd.get("quit"):
            break
        if "generate" in cmd:
            prompts, params = [], []
            for req in cmd["generate"]:
                extra = {"kv_transfer_params": req["params"]} if req.get("params") else None
                params.append(
                    SamplingParams(
                        max_tokens=req["max_tokens"],
                        temperature=0.0,
                        ignore_eos=True,
                        detokenize=False,
                        extra_args=extra,
                    )
                )
                prompts.append({"prompt_token_ids": req["prompt"]})
            start = time.perf_counter()
            results = llm.generate(prompts, params, use_tqdm=False)
            seconds = time.perf_counter() - start
            answer: Any = [
                {
                    "tokens": list(r.outputs[0].token_ids),
                    "finish_reason": r.outputs[0].finish_reason,
                    "params": r.kv_transfer_params,
                }
                for r in results
            ]
            answer[0]["seconds"] = seconds
        elif "corrupt" in cmd:
            # A control: every page of one layer's cache in the decode engine's pool made
            # stale (+delta), as a poisoned or stale prefix-cache page would be; blocks in
            # use later are overwritten by vLLM or the connector, the cached ones are not.
            from vllm.distributed.kv_transfer import get_kv_transfer_group

            cache = get_kv_transfer_group()._caches[cmd["corrupt"]["layer"]]
            cache.add_(cmd["corrupt"]["delta"])
            answer = {"ok": True}
        elif cmd.get("stats"):
            from vllm.distributed.kv_transfer import get_kv_transfer_group

            answer = get_kv_transfer_group().totals
        else:
            answer = {"error": f"unknown command {sorted(cmd)}"}
        out.write(json.dumps(answer) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
