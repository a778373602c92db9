"""Helpers shared by kvc's Python tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["corrupt_one_object", "engine_llama_config", "tiny_llama_config"]


def corrupt_one_object(store: Path) -> Path:
    """Flips 16 bytes in the middle of one stored object of a file:// store
    (kvc.vllm_engine's, imported when called: scripts that import these
    helpers find kvc only later)."""
    from kvc.vllm_engine import corrupt_one_object as corrupt

    return corrupt(store)


def tiny_llama_config(transformers: Any) -> Any:
    """The small random Llama of the Python tests and the worker harness:
    2 layers, 4 heads and 2 KV heads of 16, hidden 64, a vocabulary of
    256."""
    return transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=1024, initializer_range=0.3)


def engine_llama_config(transformers: Any) -> Any:
    """The random Llama the vLLM engine tests run: 2 layers, 4 heads and 2
    KV heads of 32 (vLLM's CPU attention takes heads of 32 and more),
    hidden 128, a vocabulary of 256."""
    return transformers.LlamaConfig(
        vocab_size=256, hidden_size=128, intermediate_size=256,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=2048, initializer_range=0.3)
