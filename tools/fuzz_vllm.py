#!/usr/bin/env python3
"""atheris fuzz harness for the vLLM connector's wire inputs that need no vLLM and no torch
(``hurray_wire.vllm.params``, ``hurray_wire.vllm.transfer``; docs/vllm.md).

``check_vllm(data)`` takes its first byte as the target and the rest as its input:

* 0, **kv_transfer_params**: the input as JSON (a decode request's ``kv_transfer_params``
  come from a client); a JSON object goes through ``TransferParams.from_params``, which
  accepts or raises ``ArgumentTypeError``; accepted params give ``to_params`` values equal
  to the input's and parse back to equal params;
* 1, **the prefill side's control line**: the input is what a puller sends to
  ``serve_one`` (over a socket pair) for a store holding one complete transfer: a refusal
  (0 bytes sent, a JSON refusal line) or our error; the transfer is served only to an ask
  that names its id, request, prompt digest and block ids with a valid ``first_page``, and
  only once;
* 2, **the decode side's pull**: the input is what the prefill worker answers (a control
  line, then a hurray-wire stream) to ``pull`` over TCP on localhost: ``pull`` returns a
  ``LoadResult`` (never raises); pages only from a stream ``StreamReader`` reads whole, with
  the transfer's identity, and equal to that stream's pages.

Every exception must be a ``HurrayWireError`` (``pull`` catches ours and ``OSError`` into
its result, so anything it lets through is foreign). ``--fix-checksums``: target-2 inputs
have their stream mutated by ``fuzz_containers``' structure-aware mutator (checksums
fixed); other targets get libFuzzer's mutations.

Usage (``pip install atheris``)::

    mkdir -p /tmp/hw-vllm
    python tools/fuzz_vllm.py -max_total_time=300 -timeout=20 /tmp/hw-vllm
"""

from __future__ import annotations

import json
import random
import socket
import sys
import threading
from pathlib import Path
from typing import Any

try:
    import atheris  # type: ignore[import-untyped]
except ImportError:
    atheris = None

if atheris is not None and __name__ == "__main__":
    with atheris.instrument_imports(include=["hurray_wire"]):
        import _instrumented  # the lazy package: every module now, instrumented
        import numpy as np

        import hurray_wire as hw
        from hurray_wire.containers import StreamReader
        from hurray_wire.fingerprint import EngineFingerprint
        from hurray_wire.vllm import receive as vr, transfer as vt
        from hurray_wire.vllm.params import TransferParams, prompt_digest

        _instrumented.import_all()
else:
    import numpy as np

    import hurray_wire as hw
    from hurray_wire.containers import StreamReader
    from hurray_wire.fingerprint import EngineFingerprint
    from hurray_wire.vllm import receive as vr, transfer as vt
    from hurray_wire.vllm.params import TransferParams, prompt_digest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fuzz_blob
import fuzz_containers

FINGERPRINT = EngineFingerprint("tiny", "vllm", "0.33.0", "LBNHC", "float32", 16, 0, 1)
PROMPT = list(range(20))
BLOCK_IDS = [5, 9]
LAYERS = 2


def _store() -> Any:
    """A prefill store holding one complete transfer: 20 tokens in two 16-token blocks."""
    store = vt.TransferStore(FINGERPRINT, "tiny", LAYERS)
    store.begin("t1", "r1", BLOCK_IDS, len(PROMPT), prompt_digest(PROMPT))
    for layer in range(LAYERS):
        pages = np.arange(2 * 16 * 1 * 4, dtype=np.float32).reshape(2, 16, 1, 4) + layer
        store.add_layer("t1", layer, pages, -pages)
    return store


ASK = {
    "transfer_id": "t1",
    "request_id": "r1",
    "prompt_digest": prompt_digest(PROMPT),
    "block_ids": BLOCK_IDS,
    "first_page": 0,
}


def _typed(call: Any) -> Any:
    """``call()``, or None when it raises our error (an open finding counts as ours)."""
    return fuzz_blob.outcome(call)[0]


def _params(body: bytes) -> None:
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        return  # not JSON: vLLM's server would not hand it over
    if not isinstance(obj, dict):
        return
    params = _typed(lambda: TransferParams.from_params(obj))
    if params is None:
        return
    again = params.to_params()
    flags = ("do_remote_prefill", "do_remote_decode")
    for key in (k for k in again if k in obj and k not in flags):
        if again[key] != obj[key]:
            raise AssertionError(f"from_params changed {key}: {obj[key]!r} -> {again[key]!r}")
    if TransferParams.from_params(again) != params:
        raise AssertionError("to_params does not parse back to the same params")


def _serve(body: bytes) -> None:
    store = _store()
    ours, theirs = socket.socketpair()
    with ours, theirs:
        ours.settimeout(5)
        theirs.settimeout(5)
        theirs.sendall(body[: vt.MAX_LINE + 2])
        theirs.shutdown(socket.SHUT_WR)
        sent = _typed(lambda: vt.serve_one(store, ours))
        ours.shutdown(socket.SHUT_WR)
        reply = b""
        while chunk := theirs.recv(1 << 16):
            reply += chunk
    if not sent:
        return
    line = body.split(b"\n", 1)[0]
    ask = json.loads(line)
    if any(ask.get(k) != v for k, v in ASK.items() if k != "first_page"):
        raise AssertionError(f"serve_one served an ask that is not the transfer's: {ask!r}")
    if not reply.startswith(b'{"ok":true}\n'):
        raise AssertionError("serve_one served without its acceptance line")
    if _typed(lambda: store.take(ASK)) is not None:
        raise AssertionError("a served transfer can be taken again")


class _Peer:
    """A localhost listener that answers one connection with the given bytes; one per input,
    closed when the input is done (a listener kept for the process was never closed)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]

    def __enter__(self) -> _Peer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def answer(self, data: bytes) -> threading.Thread:
        def run() -> None:
            self.sock.settimeout(5)
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    while not conn.recv(1 << 16).endswith(b"\n"):
                        pass
                    conn.sendall(data)
                    conn.shutdown(socket.SHUT_WR)
                except OSError:
                    pass

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread


def _pull(body: bytes) -> None:
    with _Peer() as peer:
        params = TransferParams(
            "t1", "r1", "127.0.0.1", peer.port, tuple(BLOCK_IDS), len(PROMPT), 16,
            prompt_digest(PROMPT),
        )  # fmt: skip
        thread = peer.answer(body)
        result = vr.pull(params, FINGERPRINT, LAYERS, timeout=5)
        thread.join()
    if result.pages is None:
        if not isinstance(result.error, hw.HurrayWireError):
            raise AssertionError(f"pull failed without our error: {result.error!r}")
        return
    stream = body.split(b"\n", 1)[1]
    tensors = list(StreamReader(stream))  # a stream pull accepts reads whole
    header = StreamReader(stream).header
    if header is None or header.metadata.get("vllm.transfer_id") != "t1":
        raise AssertionError("pull accepted a stream without the transfer's identity")
    for layer, pair in enumerate(result.pages.layers):
        for role, pages in enumerate(pair):
            tensor = tensors[2 * layer + role]
            expected = np.asarray(tensor.page_pool)[np.asarray(tensor.block_table).reshape(-1)]
            if not np.array_equal(pages, expected):
                raise AssertionError(f"pull's pages differ from the stream's (layer {layer})")


TARGETS = (_params, _serve, _pull)


def check_vllm(data: bytes) -> None:
    """One input: first byte the target, the rest its input."""
    if data:
        TARGETS[data[0] % len(TARGETS)](bytes(data[1:]))


test_one_input = check_vllm


def generated_seeds() -> dict[str, bytes]:
    """A valid input of each target: params, the ask, the prefill side's whole answer."""
    params = TransferParams("t1", "r1", "h", 8000, (5, 9), 20, 16, prompt_digest(PROMPT))
    ask = json.dumps(ASK, separators=(",", ":")).encode() + b"\n"
    ours, theirs = socket.socketpair()
    with ours, theirs:
        theirs.sendall(ask)
        vt.serve_one(_store(), ours)
        ours.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := theirs.recv(1 << 16):
            answer += chunk
    return {
        "vllm-params.json": b"\x00" + json.dumps(params.to_params()).encode(),
        "vllm-ask.jsonl": b"\x01" + ask,
        "vllm-answer.bin": b"\x02" + answer,
    }


def seed_inputs() -> dict[str, bytes]:
    return generated_seeds()


MUTATOR_ERRORS: list[str] = []


def _mutate(data: bytes, max_size: int, seed: int) -> bytes:
    if data[:1] == b"\x02" and b"\n" in data:  # the stream after the answer line
        line, stream = data[1:].split(b"\n", 1)
        stream = fuzz_containers.mutate(stream, max_size, seed)
        return (b"\x02" + line + b"\n" + stream)[:max_size]
    return fuzz_blob.byte_mutate(data, random.Random(seed), max_size)


def mutate(data: bytes, max_size: int, seed: int) -> bytes:
    """The ``--fix-checksums`` custom mutator (streams: checksums fixed after mutating)."""
    return fuzz_blob.guarded_mutate(
        "fuzz_vllm", MUTATOR_ERRORS, _mutate, lambda d: d, data, max_size, seed
    )


def main() -> None:
    fix, argv = fuzz_blob.fix_mode(sys.argv)
    argv = fuzz_blob.seeded_argv(argv, "vllm", [], generated_seeds)
    if fix:
        fuzz_blob._IN_LIBFUZZER.append(True)
        fuzz_containers._IN_LIBFUZZER.append(True)
        atheris.Setup(argv, check_vllm, custom_mutator=mutate)
    else:
        atheris.Setup(argv, check_vllm)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
