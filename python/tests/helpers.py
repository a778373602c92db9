"""Helpers shared by kvc's Python tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def tiny_llama_config(transformers: Any) -> Any:
    """The small random Llama of the Python tests and the worker harness:
    2 layers, 4 heads and 2 KV heads of 16, hidden 64, a vocabulary of
    256."""
    return transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=1024, initializer_range=0.3)


def corrupt_one_object(store: Path) -> Path:
    """Flips 16 bytes in the middle of one stored object of a file:// store
    (not a layout record); returns its path."""
    objects = sorted(p for p in store.rglob("*")
                     if p.is_file() and "layouts" not in p.parts)
    victim = objects[len(objects) // 2]
    data = bytearray(victim.read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + 16):
        data[i] ^= 0xFF
    victim.write_bytes(bytes(data))
    return victim
