"""HurrayConnector driven by vLLM 0.33.0's own v1 ``Scheduler`` (no forward pass: the model
runner's outputs are stated by the test): the decode side's asynchronous load, the block ids
it hands the worker, and ``kv_load_failure_policy`` acting on the block ids the connector
reports; the prefill side's save plan and the ``kv_transfer_params`` it returns."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm.v1.core.sched.scheduler")

ROOT = Path(__file__).resolve().parents[2]
PROMPT = [(i * 37) % 500 + 3 for i in range(70)]  # 70 tokens: 3 blocks of 32


@pytest.fixture(scope="module")
def model_dir() -> Path:
    sys.path.insert(0, str(ROOT / "tools"))
    from make_tiny_llama import make_tiny_llama

    default = Path(tempfile.gettempdir()) / "hurray-tiny-llama"
    return make_tiny_llama(Path(os.environ.get("HURRAY_TINY_LLAMA", default)))


def scheduler(model_dir: Path, role: str, policy: str = "fail", log_stats: bool = False) -> Any:
    import torch
    from vllm.config import (
        CacheConfig,
        DeviceConfig,
        KVTransferConfig,
        ModelConfig,
        SchedulerConfig,
        VllmConfig,
    )
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    model = ModelConfig(model=str(model_dir), skip_tokenizer_init=True, max_model_len=512,
                        dtype="float32")  # fmt: skip
    config = VllmConfig(
        model_config=model,
        cache_config=CacheConfig(block_size=32),
        scheduler_config=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=2048,
                                         max_model_len=512, is_encoder_decoder=False),
        kv_transfer_config=KVTransferConfig(
            kv_connector="HurrayConnector", kv_connector_module_path="hurray_wire.vllm",
            kv_role=role, kv_load_failure_policy=policy,
            kv_connector_extra_config={"port": 24999, "model_id": "tiny-llama"},
        ),
        device_config=DeviceConfig("cpu"),
    )  # fmt: skip
    config.cache_config.num_gpu_blocks = 64  # what the engine sets after profiling
    spec = FullAttentionSpec(block_size=32, num_kv_heads=2, head_size=32, dtype=torch.float32)
    layers = [f"model.layers.{i}.self_attn.attn" for i in range(2)]
    kv = KVCacheConfig(num_blocks=64, kv_cache_tensors=[],
                       kv_cache_groups=[KVCacheGroupSpec(layers, spec)])  # fmt: skip
    return Scheduler(config, kv, StructuredOutputManager(config), block_size=32,
                     log_stats=log_stats)  # fmt: skip


def request(rid: str, max_tokens: int, params: dict[str, Any] | None) -> Any:
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    extra = {"kv_transfer_params": params} if params else None
    sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0, extra_args=extra)
    return Request(rid, list(PROMPT), sampling, None)


def runner_output(req_ids: list[str], tokens: int = 0, **connector: Any) -> Any:
    from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput

    return ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={r: i for i, r in enumerate(req_ids)},
        sampled_token_ids=[[tokens]] * len(req_ids) if tokens else [[] for _ in req_ids],
        kv_connector_output=KVConnectorOutput(**connector) if connector else None,
    )


def decode_params() -> dict[str, Any]:
    from hurray_wire.vllm.transfer import prompt_digest

    return {"do_remote_prefill": True, "do_remote_decode": False,
            "hurray_transfer_id": "t" * 32, "remote_request_id": "p-1",
            "remote_host": "127.0.0.1", "remote_port": 24998, "remote_block_ids": [4, 5, 6],
            "remote_num_tokens": len(PROMPT), "remote_block_size": 32,
            "prompt_digest": prompt_digest(PROMPT), "remote_tp_size": 1}  # fmt: skip


def waiting_load(model_dir: Path, policy: str) -> tuple[Any, Any, list[int]]:
    """A decode request whose load the scheduler has handed to the worker."""
    sched = scheduler(model_dir, "kv_consumer", policy)
    sched.add_request(request("d-1", 4, decode_params()))
    out = sched.schedule()
    meta = out.kv_connector_metadata
    assert [load.request_id for load in meta.loads] == ["d-1"]
    load = meta.loads[0]
    assert load.first_block == 0 and len(load.block_ids) == 3  # 70 prompt tokens
    assert load.digest == decode_params()["prompt_digest"]
    assert out.num_scheduled_tokens == {}  # nothing computed while the KV is in flight
    return sched, out, load.block_ids


@pytest.mark.parametrize("policy", ["fail", "recompute"])
def test_load_errors_drive_the_failure_policy(model_dir: Path, policy: str) -> None:
    from vllm.v1.request import RequestStatus

    sched, out, blocks = waiting_load(model_dir, policy)
    # the worker reports the request received, its blocks from the second on failed
    sched.update_from_output(
        out, runner_output([], finished_recving={"d-1"}, invalid_block_ids=set(blocks[1:]))
    )
    nxt = sched.schedule()
    req = sched.requests.get("d-1")
    if policy == "fail":
        assert req is None or req.status == RequestStatus.FINISHED_ERROR
        assert "d-1" not in nxt.num_scheduled_tokens
    else:
        # recomputed from the first failed block: only the first block's 32 tokens are kept
        assert nxt.num_scheduled_tokens.get("d-1") == len(PROMPT) - 32


def test_a_clean_load_computes_only_the_last_token(model_dir: Path) -> None:
    sched, out, _ = waiting_load(model_dir, "fail")
    sched.update_from_output(out, runner_output([], finished_recving={"d-1"}))
    nxt = sched.schedule()
    assert nxt.num_scheduled_tokens.get("d-1") == 1


def test_prefill_side_plans_the_save_and_returns_params(model_dir: Path) -> None:
    sched = scheduler(model_dir, "kv_producer")
    sched.add_request(request("p-1", 1, {"do_remote_decode": True}))
    out = sched.schedule()
    saves = out.kv_connector_metadata.saves
    assert [s.request_id for s in saves] == ["p-1"] and saves[0].num_tokens == len(PROMPT)
    assert len(saves[0].block_ids) == 3
    outputs = sched.update_from_output(out, runner_output(["p-1"], tokens=7))
    finished = [o for eco in outputs.values() for o in eco.outputs if o.request_id == "p-1"]
    params = finished[0].kv_transfer_params
    assert params["hurray_transfer_id"] == saves[0].transfer_id
    assert params["remote_block_ids"] == saves[0].block_ids
    assert params["remote_num_tokens"] == len(PROMPT) and params["remote_port"] == 24999
    # the copy was taken while computing: the blocks are free again at once
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == 63


HOSTILE = [
    ["not", "a", "mapping"],
    {**decode_params(), "do_remote_decode": True},  # both flags
    {**decode_params(), "remote_host": "a" * 64 + ".example"},  # a DNS label over 63
    {**decode_params(), "remote_block_ids": [4, 5]},  # fewer than the tokens need
    {**decode_params(), "remote_port": True},
    {"do_remote_prefill": "yes"},
]


@pytest.mark.parametrize("params", HOSTILE, ids=range(len(HOSTILE)))
@pytest.mark.parametrize("policy", ["fail", "recompute"])
def test_refused_params_are_a_failed_load_the_policy_ends(
    model_dir: Path, params: Any, policy: str
) -> None:
    """Refused in get_num_new_matched_tokens as a load the worker fails at once: vLLM 0.33
    waits on it (not skipped forever, as a None would be), then applies the policy."""
    from vllm.v1.request import RequestStatus

    sched = scheduler(model_dir, "kv_consumer", policy)
    sched.add_request(request("d-1", 4, params))
    out = sched.schedule()
    (load,) = out.kv_connector_metadata.loads
    assert load.refused and load.params == {}
    assert sched.requests["d-1"].status == RequestStatus.WAITING_FOR_REMOTE_KVS
    sched.update_from_output(
        out, runner_output([], finished_recving={"d-1"}, invalid_block_ids=set(load.block_ids))
    )
    nxt = sched.schedule()
    req = sched.requests.get("d-1")
    if policy == "fail":
        assert req is None or req.status == RequestStatus.FINISHED_ERROR
    else:  # computed locally, and not asked again (one pull per request)
        assert nxt.num_scheduled_tokens.get("d-1") == len(PROMPT)
        assert not nxt.kv_connector_metadata.loads


def test_an_aborted_load_holds_its_blocks_until_the_worker_reports_it(model_dir: Path) -> None:
    """vLLM 0.33 frees an aborted request's blocks only when the worker reports its load
    received (finish_requests: delay_free while WAITING_FOR_REMOTE_KVS), which is what the
    connector's worker does in the step that names it finished (pulls.Pulls.collect)."""
    from vllm.v1.request import RequestStatus

    sched, _out, _ = waiting_load(model_dir, "fail")
    free = sched.kv_cache_manager.block_pool.get_num_free_blocks()
    sched.finish_requests("d-1", RequestStatus.FINISHED_ABORTED)
    nxt = sched.schedule()
    assert "d-1" in nxt.finished_req_ids  # what the worker's get_finished is given
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == free
    sched.update_from_output(nxt, runner_output([], finished_recving={"d-1"}))
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == free + 3
