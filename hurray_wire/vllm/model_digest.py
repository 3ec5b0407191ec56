"""What determines a model's KV, as a digest the engine fingerprint carries (docs/vllm.md
§ model): the parsed model config and every byte of the weight files, so that two engines
under one ``model_id`` with other weights are refused. Each file version is hashed once,
remembered in memory and in a JSON cache file, so a restart reads nothing again.
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
#: File versions remembered, in memory (``_memo``, by the cache file's keys) and in the file.
MAX_FILES = 4096
_memo: dict[str, str] = {}


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
        kept = dict(list({**_load_cache(), **entries}.items())[-MAX_FILES:])
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(kept))
        tmp.replace(path)


def file_digest(path: Path, cache: dict[str, str] | None = None) -> str:
    """xxh3-128 of a file's bytes, hex; remembered by (real path, size, mtime, inode)."""
    real = path.resolve()
    st = real.stat()
    key = json.dumps((str(real), st.st_size, st.st_mtime_ns, st.st_ino))
    found = _memo.pop(key, None) or (cache or {}).get(key)
    if found is None:
        digest = xxhash.xxh3_128()
        if st.st_size:
            with real.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as m:
                view = memoryview(m)
                try:
                    for start in range(0, len(view), _CHUNK):
                        digest.update(view[start : start + _CHUNK])
                finally:
                    view.release()
        found = digest.hexdigest()
    if cache is not None:
        cache[key] = found
    _memo[key] = found  # the most recent last, the oldest dropped past MAX_FILES
    while len(_memo) > MAX_FILES:
        del _memo[next(iter(_memo))]
    return found


def _where_left_out(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _where_left_out(v) for k, v in value.items() if k not in _WHERE}
    return value


def checkpoint_digest(directory: Path | str | None, config: Mapping[str, Any] | None = None) -> str:
    """xxh3-128 over ``config`` (canonical JSON, without the keys that say only where it was
    loaded from) and each weight file of ``directory`` in name order (name, size, digest)."""
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
    """The digest of vLLM's parsed model config, dtype, quantization and (``mode="weights"``)
    weight files; the config alone (``mode="config"``, or no local files) is marked with a
    ``config-only:`` prefix."""
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
