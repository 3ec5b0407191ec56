"""Write a random-weight Llama (no hub, no tokenizer) that vLLM's CPU backend can serve.

The engine tests and the connector benchmark run on it: ``python tools/make_tiny_llama.py DIR``.
Weights are N(0, 0.2) from a fixed seed; the RMSNorm weights stay at 1, because random norm
weights collapse greedy output into one repeated token and a token comparison then proves
nothing. ``head_dim`` 32 and the block sizes the tests use (multiples of 32) are what vLLM's
CPU_ATTN backend accepts. Needs torch and transformers (the engine venv), not the core.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

CONFIG: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": 512,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
}


def make_tiny_llama(path: str | Path, *, seed: int = 0, dtype: str = "float32") -> Path:
    """Write the model to ``path`` (idempotent: an existing model with the same stamp is kept)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(path)
    stamp = out / "hurray-tiny-llama.json"
    want = {"config": CONFIG, "seed": seed, "dtype": dtype}
    if stamp.is_file() and json.loads(stamp.read_text()) == want:
        return out
    torch.manual_seed(seed)
    config = LlamaConfig(**CONFIG, torch_dtype=dtype)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.fill_(1.0)
            else:
                param.normal_(0.0, 0.2)
    model = model.to(getattr(torch, dtype))
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    stamp.write_text(json.dumps(want))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    args = parser.parse_args(argv)
    make_tiny_llama(args.path, seed=args.seed, dtype=args.dtype)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
