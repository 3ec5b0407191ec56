"""One vLLM engine in its own process, driven by JSON lines on stdin (one answer per line).

The engine tests start a prefill engine and a decode engine this way (vLLM's connector and
parallel state are per process, so two engines cannot share one). Commands:
``{"generate": [{"prompt": [ids], "max_tokens": n, "params": {...}|null}, ...]}`` ->
``[{"tokens", "finish_reason", "params"}]`` plus the call's wall time in ``"seconds"``
of the first entry; ``{"stats": true}`` -> the connector's totals; ``{"metrics": true}`` ->
the engine's Prometheus samples (``"log_stats": true`` in the spec starts vLLM's stat
loggers, as a server does), ``{name: value}`` without labels;
``{"corrupt": {"layer", "delta"}}`` adds ``delta`` to that layer's whole cache (a control);
``{"abort": {"requests": [...], "after": s}}`` runs requests step by step and aborts them
all after ``s`` seconds, as a client that disconnects -> ``{"seconds", "reasons"}``;
``{"free_blocks": true}`` -> vLLM's own free-block count once the scheduler has nothing
left to do; ``{"fingerprint": true}`` -> the connector's fingerprint extras;
``{"quit": true}``. ``"trace": path`` in the spec appends one line per call of the
connector's methods and of the engine's steps to ``path`` (``tools/profile_vllm_connector.py``).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any, TextIO

from engine_tests import NO_TRAFFIC  # started with PYTHONPATH at the clone

os.environ.update(NO_TRAFFIC)
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")


def _traced(owner: Any, name: str, log: TextIO) -> None:
    """Wrap ``owner.name`` to log ``start duration name thread`` (wall clock) per call."""
    inner = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.time()
        try:
            return inner(*args, **kwargs)
        finally:
            end = time.time()
            thread = threading.current_thread().name
            log.write(f"{start:.6f} {end - start:.6f} {owner.__name__}.{name} {thread}\n")

    setattr(owner, name, wrapper)


def trace(path: str, kv: dict[str, Any] | None) -> None:
    from vllm.v1.engine.core import EngineCore

    log = open(path, "a", buffering=1)  # noqa: SIM115 (open for the process' life)
    _traced(EngineCore, "step", log)
    if kv and kv.get("kv_connector") == "HurrayConnector":
        from hurray_wire.vllm import connector, transfer

        cls: Any = connector.HurrayConnector
        for name in ("_pull", "_land", "_save"):
            _traced(cls, name, log)
        _traced(transfer, "serve_one", log)
    else:
        from vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector import NixlConnector

        cls = NixlConnector
    for name in ("get_num_new_matched_tokens", "update_state_after_alloc",
                 "build_connector_meta", "request_finished", "start_load_kv",
                 "save_kv_layer", "wait_for_save", "get_finished"):  # fmt: skip
        _traced(cls, name, log)


def metrics() -> dict[str, float]:
    """The process' Prometheus samples (what a server's /metrics shows), labels dropped
    (one engine per process)."""
    import prometheus_client

    samples: dict[str, float] = {}
    for line in prometheus_client.generate_latest().decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name.split("{", 1)[0] if "_bucket{" not in name else name] = float(value)
    return samples


def main() -> None:
    spec: dict[str, Any] = json.loads(sys.argv[1])
    os.environ.update(spec.get("env", {}))
    # Answers go to the original stdout; everything vLLM prints goes to stderr.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    kv = spec.get("kv_transfer_config")
    if spec.get("trace"):
        trace(spec["trace"], kv)
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
        disable_log_stats=not spec.get("log_stats", False),
    )
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    core = llm.llm_engine.engine_core.engine_core  # in process: the EngineCore itself

    def sampling(req: dict[str, Any]) -> Any:
        extra = {"kv_transfer_params": req["params"]} if req.get("params") else None
        return SamplingParams(max_tokens=req["max_tokens"], temperature=0.0, ignore_eos=True,
                              detokenize=False, extra_args=extra)  # fmt: skip

    def settle(limit: float = 120.0) -> None:
        """Step while the scheduler holds anything (finished requests not yet reported,
        blocks waiting for the connector), as a server's busy loop does; bounded."""
        start = time.monotonic()
        while core.scheduler.has_requests() and time.monotonic() - start < limit:
            llm.llm_engine.step()
            time.sleep(0.005)

    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd.get("quit"):
            break
        if "generate" in cmd:
            prompts, params = [], []
            for req in cmd["generate"]:
                params.append(sampling(req))
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
        elif cmd.get("metrics"):
            answer = metrics()
        elif "abort" in cmd:
            engine, reasons = llm.llm_engine, {}
            ids = [f"abort-{time.monotonic_ns()}-{i}" for i in range(len(cmd["abort"]["requests"]))]
            for rid, req in zip(ids, cmd["abort"]["requests"], strict=True):
                engine.add_request(rid, {"prompt_token_ids": req["prompt"]}, sampling(req))
            start, aborted = time.perf_counter(), False
            while engine.has_unfinished_requests() and time.perf_counter() - start < 300:
                if not aborted and time.perf_counter() - start >= cmd["abort"]["after"]:
                    engine.abort_request(ids)
                    aborted = True
                for output in engine.step():
                    if output.finished:
                        reasons[output.request_id] = output.outputs[0].finish_reason
                time.sleep(0.005)
            settle()
            answer = {"seconds": time.perf_counter() - start, "reasons": reasons}
        elif cmd.get("free_blocks"):
            settle()
            answer = {"free": core.scheduler.kv_cache_manager.block_pool.get_num_free_blocks()}
        elif cmd.get("fingerprint"):  # its extras: the model digest (model_digest.py)
            from vllm.distributed.kv_transfer import get_kv_transfer_group

            answer = dict(get_kv_transfer_group()._engine_fingerprint().extras)
        else:
            answer = {"error": f"unknown command {sorted(cmd)}"}
        out.write(json.dumps(answer) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
