"""What determines a model's KV, as a digest the engine fingerprint carries (docs/vllm.md
§ model): the model config as the engine parsed it and every byte of the checkpoint's
weight files. Two engines under the same ``model_id`` with other weights, or a checkpoint
replaced in place, then differ in ``extras.model_digest`` and their transfers are refused.

The weights are hashed once per file version: xxh3-128 over the mapped file (safetensors:
its header, i.e. names, dtypes, shapes and offsets, and the tensor bytes), kept in
memory and in a small JSON cache keyed by (real path, size, mtime, inode), so a restart
with the same files reads nothing again.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import mmap
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import xxhash

from hurray_wire.errors import ArgumentTypeError

__all__ = ["WEIGHT_SUFFIXES", "checkpoint_digest", "engine_model_digest", "file_digest"]

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
_CHUNK = 64 << 20
#: Keys of a config that name where it was loaded from, not what it computes.
_WHERE = ("_name_or_path", "name_or_path", "_commit_hash", "transformers_version")
_memo: dict[tuple[str, int, int, int], str] = {}


def _cache_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hurray_wire" / "model_digests.json"


def _load_cache() -> dict[str, str]:
    with contextlib.suppress(OSError, ValueError):
        data = json.loads(_cache_path().read_text())
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)}
    return {}


def _store_cache(entries: Mapping[str, str]) -> None:
    path = _cache_path()
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        kept = dict(list({**_load_cache(), **entries}.items())[-4096:])  # bounded
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(kept))
        tmp.replace(path)


def file_digest(path: Path, cache: dict[str, str] | None = None) -> str:
    """xxh3-128 of a file's bytes, hex; remembered by (real path, size, mtime, inode)."""
    real = path.resolve()
    st = real.stat()
    key = (str(real), st.st_size, st.st_mtime_ns, st.st_ino)
    text = json.dumps(key)
    if key in _memo:
        return _memo[key]
    if cache is not None and text in cache:
        _memo[key] = cache[text]
        return _memo[key]
    digest = xxhash.xxh3_128()
    if st.st_size:
        with real.open("rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as m:
            view = memoryview(m)
            try:
                for start in range(0, len(view), _CHUNK):
                    digest.update(view[start : start + _CHUNK])
            finally:
                view.release()
    _memo[key] = digest.hexdigest()
    if cache is not None:
        cache[text] = _memo[key]
    return _memo[key]


def _where_left_out(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _where_left_out(v) for k, v in value.items() if k not in _WHERE}
    return value


def checkpoint_digest(directory: Path | str | None, config: Mapping[str, Any] | None = None) -> str:
    """xxh3-128 over ``config`` (canonical JSON, the keys that only say where it was loaded
    from left out) and each weight file of ``directory`` (its name relative to the
    directory, its size and its bytes' digest), in name order. A directory without weight
    files digests its config alone."""
    root = Path(directory or ".")
    files = (
        []
        if directory is None
        else sorted(p for p in root.rglob("*") if p.suffix in WEIGHT_SUFFIXES and p.is_file())
    )
    cache = _load_cache()
    before = dict(cache)
    digest = xxhash.xxh3_128()
    shown = _where_left_out(config or {})
    digest.update(json.dumps(shown, sort_keys=True, default=str).encode())
    for path in files:
        name = path.relative_to(root).as_posix()
        line = f"\n{name}\t{path.stat().st_size}\t{file_digest(path, cache)}"
        digest.update(line.encode())
    if cache != before:
        _store_cache({k: v for k, v in cache.items() if k not in before})
    return digest.hexdigest()


def _model_directory(model_config: Any) -> Path | None:
    """The local directory vLLM loads the weights from: ``--model`` itself, or the hub
    cache's snapshot of it (looked up offline: nothing is downloaded here)."""
    name = str(model_config.model)
    if os.path.isdir(name):
        return Path(name)
    with contextlib.suppress(Exception):  # not a hub id, not cached, no huggingface_hub
        hub = importlib.import_module("huggingface_hub")  # vLLM's dependency, not ours
        revision = getattr(model_config, "revision", None)
        return Path(hub.snapshot_download(name, revision=revision, local_files_only=True))
    return None


def engine_model_digest(vllm_config: Any, mode: str = "weights") -> str:
    """The digest of what determines this engine's KV: vLLM's parsed model config
    (``hf_config``), the dtype it runs in, its quantization, and (``mode="weights"``) the
    checkpoint's weight files (``checkpoint_digest``). ``mode="config"``, or a model whose
    files cannot be found locally, digests the config alone, and says so (a
    ``config-only:`` prefix)."""
    if mode not in ("weights", "config"):
        raise ArgumentTypeError("model_digest must be 'weights' or 'config'",
                                field="model_digest", found=repr(mode))  # fmt: skip
    model = vllm_config.model_config
    config: dict[str, Any] = {}
    with contextlib.suppress(Exception):
        config = dict(model.hf_config.to_dict())
    config["hurray.dtype"] = str(getattr(model, "dtype", ""))
    config["hurray.quantization"] = str(getattr(model, "quantization", ""))
    directory = _model_directory(model) if mode == "weights" else None
    if directory is None:
        return "config-only:" + checkpoint_digest(None, config)
    return checkpoint_digest(directory, config)
