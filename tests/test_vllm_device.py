"""The connector's device path (hurray_wire.vllm.device) and its reading and landing of every
backend's cache (hurray_wire.vllm.backends), with torch only (no vLLM): each test takes the
device as a parameter, "cpu" here and "cuda" wherever torch sees one. Caches are built as
vLLM lays them out: the logical view ``[num_blocks, H, block_size, C]`` with the layout in
its strides (vllm/v1/kv_cache_interface.py ``create_kv_cache_views``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from hurray_wire.adapters import _vllm_forms as forms
from hurray_wire.errors import HurrayWireError, IndexBufferError, TransportError
from hurray_wire.vllm import device
from hurray_wire.vllm.backends import CacheForm, kernel_ids
from hurray_wire.vllm.device import gather, land, memory_order, needs_staging

torch = pytest.importorskip("torch")

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
H, D, MLA_DIM = 2, 32, 48
# (backend, layout, isa, manager block, kernel block)
FORMS = [
    ("FLASH_ATTN", "LBNHC", None, 16, 16),
    ("FLASH_ATTN", "LBHNC", None, 16, 16),
    ("FLASHINFER", "LBHNC", None, 32, 16),  # vLLM split the 32-token blocks
    ("TRITON_ATTN", "LHBNC", None, 16, 16),
    ("FLEX_ATTENTION", "LBNHC", None, 16, 16),
    ("FLASHMLA", "LBNHC", None, 128, 64),  # FlashMLA takes 64-token kernel blocks only
    ("TRITON_MLA", "LBHNC", None, 16, 16),
    ("CPU_ATTN", "LBHNC", "vec", 32, 32),
]
NUM_BLOCKS = 9  # scheduler blocks


def cache_of(
    backend: str, layout: str, kernel: int, ratio: int, device: str, dtype: Any = None
) -> Any:
    """A random cache of ``NUM_BLOCKS * ratio`` kernel blocks, memory in ``layout``'s order."""
    dtype = dtype or torch.float16
    heads, width = (1, MLA_DIM) if backend in forms.MLA_BACKENDS else (H, 2 * D)
    shape = (NUM_BLOCKS * ratio, heads, kernel, width)
    physical = forms.LAYOUTS[layout]
    gen = torch.Generator().manual_seed(7)
    memory = torch.randn([shape[a] for a in physical], generator=gen).to(dtype)
    return memory.permute([physical.index(a) for a in range(4)]).to(device)


def form_of(backend: str, layout: str, isa: str | None, block: int, kernel: int) -> CacheForm:
    return CacheForm(backend, layout, isa, block, kernel, None, "float16")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("split", [False, True], ids=["blocks", "pages"])
@pytest.mark.parametrize("spec", FORMS, ids=lambda s: f"{s[0]}-{s[1]}-{s[3]}/{s[4]}")
def test_gathered_pages_equal_the_direct_reading(
    device: str, split: bool, spec: tuple[Any, ...]
) -> None:
    """Gather on the device, one host copy, read: the same pages as reading the whole cache
    on the host; whole blocks keep the cache's memory order (its layout), pages gathered
    with the backend's views (the role split on the device) come in the wire's C order."""
    backend, layout, _isa, block, kernel = spec
    form = form_of(*spec)
    if split and form.page_views is None:
        pytest.skip("CPU_ATTN's slabs are never on a device")
    cache = cache_of(backend, layout, kernel, form.ratio, device)
    blocks = [5, 2, 7]
    views = form.page_views if split else None
    staged = gather(cache, kernel_ids([0, *blocks], form.ratio), views=views).host()
    if split:
        assert len(staged) == len(form.roles)
        assert all(t.device.type == "cpu" and t.is_contiguous() for t in staged)
    else:
        assert staged.device.type == "cpu" and memory_order(staged) == memory_order(cache)
    got = form.read(staged, range(1, 4), fresh=True)
    want = form.read(cache.cpu(), blocks)
    assert len(got) == len(form.roles) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == (3, block, *w.shape[2:])
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["bfloat16", "fp8"])
def test_pages_gathered_on_the_device_keep_the_element_type(device: str, dtype: str) -> None:
    """bf16 pages, and fp8 pages from vLLM's uint8 storage, split on the device: the same
    elements and element type as the host's reading (FlashInfer's split 32 -> 16 blocks)."""
    spec = ("FLASHINFER", "LBHNC", None, 32, 16)
    storage = torch.uint8 if dtype == "fp8" else torch.bfloat16
    form = CacheForm(*spec, "fp8" if dtype == "fp8" else None,
                     "float8_e4m3" if dtype == "fp8" else "bfloat16")  # fmt: skip
    cache = cache_of(spec[0], spec[1], spec[4], form.ratio, device, storage)
    staged = gather(cache, kernel_ids([0, 6, 3], form.ratio), views=form.page_views).host()
    got = form.read(staged, [2, 1], fresh=True)
    want = form.read(cache.cpu(), [3, 6])
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and str(g.dtype).startswith(form.cache_dtype)
        np.testing.assert_array_equal(g.view(np.uint8), w.view(np.uint8))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("spec", FORMS, ids=lambda s: f"{s[0]}-{s[1]}-{s[3]}/{s[4]}")
def test_pages_are_the_backends_view(device: str, spec: tuple[Any, ...]) -> None:
    """Token t of scheduler block b is kernel block b * ratio + t // kernel, row t % kernel,
    of the backend's own view (``kv_cache.transpose(1, 2).split(D, -1)``; MLA
    ``kv_cache.squeeze(1)``)."""
    backend, layout, _isa, block, kernel = spec
    form = form_of(*spec)
    if backend == "CPU_ATTN":
        pytest.skip("CPU_ATTN's slabs: engine_tests/oracle_vllm/test_cpu_attn.py")
    cache = cache_of(backend, layout, kernel, form.ratio, device).cpu()
    pages = form.read(cache, [4, 1])
    if backend in forms.MLA_BACKENDS:
        views = [cache.squeeze(1)[:, :, None, :]]
    else:
        views = list(cache.transpose(1, 2).split(D, dim=-1))
    for role_pages, view in zip(pages, views, strict=True):
        for i, b in enumerate((4, 1)):
            for t in (0, kernel - 1, block - 1):
                kb, row = b * form.ratio + t // kernel, t % kernel
                np.testing.assert_array_equal(role_pages[i, t], view[kb, row].numpy())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("spec", FORMS, ids=lambda s: f"{s[0]}-{s[1]}-{s[3]}/{s[4]}")
def test_staged_landing_equals_the_direct_one(device: str, spec: tuple[Any, ...]) -> None:
    """Landing through a host copy (one host-to-device copy per layer) writes exactly what
    into_vllm writes in place, the partial last block's tail kept, block 0 untouched."""
    backend, layout, _isa, block, kernel = spec
    form = form_of(*spec)
    source = cache_of(backend, layout, kernel, form.ratio, "cpu")
    pages = form.read(source, [3, 6])
    tokens = block + block // 2 + 1  # the second block partial
    direct = cache_of(backend, layout, kernel, form.ratio, "cpu", torch.float16) * 0 + 1
    form.write(pages, tokens, direct, [2, 8])
    staged_cache = (direct * 0 + 1).to(device)
    before = staged_cache.clone()
    ids = kernel_ids([0, 2, 8], form.ratio)
    commit = land(staged_cache, ids, lambda host: form.write(pages, tokens, host, [1, 2]),
                  skip=form.ratio)  # fmt: skip
    assert torch.equal(staged_cache, before)  # nothing lands before the commit
    commit()
    if device != "cpu":
        torch.cuda.synchronize()
    assert torch.equal(staged_cache.cpu(), direct)
    assert not torch.equal(direct, before.cpu())


@pytest.mark.parametrize("device", DEVICES)
def test_a_refused_landing_writes_nothing(device: str) -> None:
    form = form_of("FLASH_ATTN", "LBNHC", None, 16, 16)
    cache = cache_of("FLASH_ATTN", "LBNHC", 16, 1, device)
    before = cache.clone()
    pages = form.read(cache.cpu(), [1, 2])

    def bad(host: Any) -> None:
        form.write(pages, 32, host, [1, 0])  # block 0: the null block

    with pytest.raises(IndexBufferError, match="null block"):
        land(cache, kernel_ids([0, 3, 4], 1), bad, skip=1)
    with pytest.raises(IndexBufferError, match="null block"):  # the device's landing
        form.checked(pages, 32, cache, [1, 0], device=True)
    with pytest.raises(HurrayWireError):
        form.checked(pages, 32, cache, [1, NUM_BLOCKS], device=True)  # past the last block
    assert torch.equal(cache, before)


def test_staging_is_for_devices_only() -> None:
    assert not needs_staging(torch.zeros(1))
    if torch.cuda.is_available():
        assert needs_staging(torch.zeros(1, device="cuda"))


def test_the_engines_cache_is_never_shared_with_the_pages() -> None:
    """An MLA cache's pool is C-contiguous (from_vllm shares it): the saved pages are a
    copy, so the engine reusing its blocks cannot change a transfer."""
    form = form_of("TRITON_MLA", "LBNHC", None, 16, 16)
    cache = cache_of("TRITON_MLA", "LBNHC", 16, 1, "cpu").contiguous()
    (pages,) = form.read(cache, [2])
    keep = pages.copy()
    cache.zero_()
    np.testing.assert_array_equal(pages, keep)


@pytest.mark.parametrize("field", ["layout", "dtype"])
def test_a_cache_that_contradicts_the_form_is_refused(field: str) -> None:
    form = form_of("FLASH_ATTN", "LBNHC", None, 16, 16)
    cache = cache_of("FLASH_ATTN", "LBHNC", 16, 1, "cpu")
    if field == "dtype":
        cache = cache.to(torch.int8)
    with pytest.raises(HurrayWireError):
        form.check(cache)


PAIRS = [
    (("FLASHINFER", "LBHNC", None, 32, 16), ("FLASH_ATTN", "LBNHC", None, 32, 32)),
    (("FLASHMLA", "LBNHC", None, 128, 64), ("TRITON_MLA", "LBHNC", None, 128, 128)),
]


@pytest.mark.parametrize("transport", ["socket", "nixl"])
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("ours", "theirs"), PAIRS, ids=["flashinfer-flash", "flashmla-triton"])
def test_a_transfer_between_backends_over_each_transport(
    ours: tuple[Any, ...], theirs: tuple[Any, ...], device: str, transport: str
) -> None:
    """The connector's transfer path without vLLM: a prefill cache of one backend (split
    into kernel blocks) gathered on the device, saved, served and pulled over the socket
    or NIXL into a decode cache of another backend and layout; the decode backend's view
    of every prompt token equals the prefill backend's (MLA: one fused role)."""
    from hurray_wire.fingerprint import EngineFingerprint
    from hurray_wire.vllm import receive as rc, transfer as tr
    from hurray_wire.vllm.peers import NixlPeers

    if transport == "nixl":
        pytest.importorskip("nixl_cu12")
    prefill, decode = form_of(*ours), form_of(*theirs)
    source = cache_of(ours[0], ours[1], ours[4], prefill.ratio, device)
    target = cache_of(theirs[0], theirs[1], theirs[4], decode.ratio, device)
    before = target.clone()

    def fp(form: CacheForm) -> EngineFingerprint:
        return EngineFingerprint("m", "vllm", "0.33.0", form.fingerprint_layout, "float16",
                                 form.block_size, 0, 1)  # fmt: skip

    size = prefill.block_size
    blocks, tokens = [6, 2, 4], 2 * size + 5
    nixl = transport == "nixl"
    peers = [NixlPeers(f"d-{n}", timeout=20, arena_bytes=8 << 20) for n in "pd"] if nixl else []
    ends: list[Any] = peers or [None, None]
    store = tr.TransferStore(fp(prefill), "m", 1)
    server = tr.TransferServer(store, "127.0.0.1", 0, timeout=20, nixl=ends[0])
    try:
        params = tr.TransferParams("t" * 32, "r", "127.0.0.1", server.port, tuple(blocks),
                                   tokens, size, tr.prompt_digest(range(tokens)))  # fmt: skip
        store.begin(params.transfer_id, "r", blocks, tokens, params.prompt_digest)
        staged = gather(source, kernel_ids([0, *blocks], prefill.ratio)).host()
        store.add_layer(params.transfer_id, 0, *prefill.read(staged, range(1, 4), fresh=True))
        result = rc.pull(params, fp(decode), 1, timeout=20, nixl=ends[1])
        assert result.pages is not None, result.error
        (roles,) = result.pages.layers
        land(
            target,
            kernel_ids([0, 3, 7, 1], decode.ratio),
            lambda host: decode.write(roles, tokens, host, [1, 2, 3]),
            skip=decode.ratio,
        )()
    finally:
        server.close()
        for p in peers:
            p.close()
    views = {}
    for name, form, cache, ids in (
        ("p", prefill, source, blocks),
        ("d", decode, target, [3, 7, 1]),
    ):
        cache = cache.cpu()
        if form.backend in forms.MLA_BACKENDS:
            per_role = [cache.squeeze(1)]  # mla_attention.py: kv_cache.squeeze(1)
        else:
            per_role = list(cache.transpose(1, 2).split(D, dim=-1))  # flash_attn.py
        t = torch.arange(tokens)
        kernel = torch.tensor(ids)[t // size] * form.ratio + (t % size) // form.kernel_block_size
        views[name] = [v[kernel, t % form.kernel_block_size] for v in per_role]
    for p, d in zip(views["p"], views["d"], strict=True):
        assert torch.equal(p, d)
    untouched = [b for b in range(NUM_BLOCKS) if b not in (3, 7, 1)]
    kernel_blocks = kernel_ids(untouched, decode.ratio).tolist()
    assert torch.equal(target.cpu()[kernel_blocks], before.cpu()[kernel_blocks])


class _Backend:
    def __init__(self, name: str) -> None:
        self.name = name

    def get_name(self) -> str:
        return self.name


def _learn(caches: dict[str, Any], backends: dict[str, str], **config: Any) -> CacheForm:
    from types import SimpleNamespace

    from hurray_wire.vllm.backends import learn

    settings = {"block_size": 32, "cache_dtype": "auto", "layout": "LBNHC", **config}
    layout = settings.pop("layout")
    cache_config = SimpleNamespace(get_resolved_kv_cache_layout=lambda: layout, **settings)
    layers = {n: SimpleNamespace(get_attn_backend=lambda b=b: _Backend(b), isa="vec")
              for n, b in backends.items()}  # fmt: skip
    return learn(cache_config, layers, caches)


def test_learn_reads_the_engine_and_the_tensors() -> None:
    """vLLM split the 32-token blocks into 16 (the tensors' own block axis); fp8 from the
    uint8 storage and the engine's cache_dtype."""
    cache = cache_of("FLASHINFER", "LBNHC", 16, 2, "cpu")
    form = _learn({"a": cache, "b": cache.clone()}, {"a": "FLASHINFER", "b": "FLASHINFER"})
    assert (form.backend, form.layout, form.block_size, form.kernel_block_size) == (
        "FLASHINFER", "LBNHC", 32, 16)  # fmt: skip
    assert form.fingerprint_layout == "FLASHINFER/LBNHC/kernel16" and form.roles == ("key", "value")
    fp8 = cache_of("FLASH_ATTN", "LBNHC", 32, 1, "cpu", torch.uint8)
    form = _learn({"a": fp8}, {"a": "FLASH_ATTN"}, cache_dtype="fp8")
    assert form.cache_dtype == "float8_e4m3" and form.kv_cache_dtype == "fp8"


def _case(backends: dict[str, str], dtype: Any = None) -> dict[str, Any]:
    cache = cache_of("FLASH_ATTN", "LBNHC", 16, 1, "cpu", dtype)
    return {"caches": {name: cache.clone() for name in ("a", "b")}, "backends": backends}


SAME = {"a": "FLASH_ATTN", "b": "FLASH_ATTN"}
REFUSALS = [
    (_case({"a": "FLASHMLA_SPARSE", "b": "FLASHMLA_SPARSE"}), {}, "backend", "FLASHMLA_SPARSE"),
    (_case({"a": "FLASH_ATTN", "b": "TRITON_ATTN"}), {}, "backend", "one attention backend"),
    (_case({"a": "FLASH_ATTN"}), {}, "kv_caches", "without an attention layer"),
    (_case(SAME), {"block_size": 24}, "block_size", "does not divide"),
    (_case(SAME), {"layout": "LBHNC"}, "kv_caches", "strides"),
    (_case(SAME, torch.int8), {}, "kv_caches", "integer"),
    ({"caches": {}, "backends": SAME}, {}, "kv_caches", "no KV caches"),
]


@pytest.mark.parametrize(("case", "config", "field", "words"), REFUSALS,
                         ids=[r[3].split()[0] for r in REFUSALS])  # fmt: skip
def test_learn_refuses_what_cannot_move_naming_it(
    case: dict[str, Any], config: dict[str, Any], field: str, words: str
) -> None:
    from hurray_wire.errors import InvalidTensorError

    with pytest.raises(InvalidTensorError, match=words) as info:
        _learn(case["caches"], case["backends"], **config)
    assert info.value.field == field


DEVICE_LANDINGS = [  # (spec, storage dtype, source blocks, targets, tokens)
    (FORMS[0], "float16", [3, 6], [2, 8], 16 + 9),  # partial last page, non-consecutive
    (FORMS[1], "bfloat16", [1, 2, 3], [7, 4, 5], 48),  # whole pages, out of order
    (FORMS[2], "float16", [3, 6], [2, 8], 32 + 5),  # kernel split: last block's 1st half
    (FORMS[2], "fp8", [4, 1], [5, 3], 32 + 17),  # fp8 uint8 cache, 2nd kernel block partial
    (FORMS[3], "float16", [5], [1], 1),  # one token
    (FORMS[5], "bfloat16", [2, 3], [6, 4], 128 + 64 + 3),  # MLA, 64-token kernel blocks
    (FORMS[6], "fp8", [1, 8], [8, 1], 16 + 15),  # MLA fp8, one slot short
]


def _storage(dtype: str) -> tuple[Any, str | None, str]:
    """(torch storage dtype, kv_cache_dtype setting, CacheForm dtype) of a table row."""
    if dtype == "fp8":
        return torch.uint8, "fp8", "float8_e4m3"
    return getattr(torch, dtype), None, dtype


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", DEVICE_LANDINGS, ids=lambda c: f"{c[0][0]}-{c[1]}-{c[4]}")
def test_device_landing_equals_the_host_staged_one(device: str, case: tuple[Any, ...]) -> None:
    """Pages landed by the device (wire layout copied once, scattered into the views) give
    exactly the cache the host-staged landing gives: tails kept, other blocks untouched."""
    spec, dtype, sources, targets, tokens = case
    storage, setting, name = _storage(dtype)
    backend, layout, isa, block, kernel = spec
    form = CacheForm(backend, layout, isa, block, kernel, setting, name)
    pages = form.read(cache_of(backend, layout, kernel, form.ratio, "cpu", storage), sources)
    fresh = cache_of(backend, layout, kernel, form.ratio, device, storage)
    cache = fresh + 1
    assert cache.stride() == fresh.stride()  # the layout's memory order kept
    staged, landed = cache.clone(), cache.clone()
    write = lambda host: form.write(pages, tokens, host, range(1, len(targets) + 1))  # noqa: E731
    land(staged, kernel_ids([0, *targets], form.ratio), write, skip=form.ratio)()
    commit = form.checked(pages, tokens, landed, targets, device=True)
    assert torch.equal(landed, cache)  # nothing lands before the commit
    commit()
    if device != "cpu":
        torch.cuda.synchronize()
    assert torch.equal(landed.cpu(), staged.cpu())
    assert not torch.equal(landed.cpu(), cache.cpu())


def test_a_stand_in_without_address_space_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """No host address space for the checks' stand-in (overcommit off): a TransportError
    naming the cache, not the OSError of mmap."""
    import mmap

    def refuse(*args: object, **kwargs: object) -> mmap.mmap:
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(mmap, "mmap", refuse)  # the module device.py maps with
    with pytest.raises(TransportError) as err:
        device.stand_in(torch.zeros(4, 8))
    assert err.value.field == "kv_cache" and isinstance(err.value.__cause__, OSError)
