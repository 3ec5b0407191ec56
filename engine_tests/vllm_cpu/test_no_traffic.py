"""Every engine process the suite started runs with ``NO_TRAFFIC`` set (no usage report, no
model hub), whatever the shell that ran pytest had: read from the processes themselves."""

from __future__ import annotations

from pathlib import Path

from engine_tests import NO_TRAFFIC

from .conftest import Engine


def test_engines_start_with_no_traffic(engines: dict[str, Engine]) -> None:
    assert engines
    for name, engine in engines.items():
        raw = Path(f"/proc/{engine.proc.pid}/environ").read_bytes().split(b"\0")
        env = dict(entry.decode().partition("=")[::2] for entry in raw if entry)
        assert {key: env.get(key) for key in NO_TRAFFIC} == NO_TRAFFIC, name
