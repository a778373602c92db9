"""Helpers shared by kvc's Python tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["corrupt_one_object", "engine_llama_config", "family_model",
           "tiny_llama_config", "write_lora_adapter"]


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


def family_model(transformers: Any, torch: Any, family: str,
                 shape: Any) -> Any:
    """A random model of ``family`` ("llama", "llama3-rope", "mistral",
    "mistral-window", "qwen2", "qwen2-yarn", "qwen3") of the
    Llama config ``shape``'s sizes (:func:`tiny_llama_config`,
    :func:`engine_llama_config`), with what sets the family apart drawn at
    random too (transformers starts biases at zero and norms at one, which
    would hide a missing one): Qwen2's q/k/v biases; Qwen3's per-head q/k
    norms, and its ``attention_bias`` (q/k/v/o biases) turned on."""
    shape = shape.to_dict()
    keep = ("vocab_size", "hidden_size", "intermediate_size",
            "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "max_position_embeddings", "initializer_range")
    fields = {key: shape[key] for key in keep}
    if family == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**fields))
    elif family == "qwen2":
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**fields))
    elif family == "llama3-rope":
        # Llama 3.1's RoPE scaling, as transformers 5 writes it
        # (rope_parameters).
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            rope_parameters={"rope_type": "llama3", "factor": 8.0,
                             "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 128,
                             "rope_theta": 500000.0}, **fields))
    elif family == "mistral-window":
        # Mistral 7B v0.1's sliding window, here 64 tokens.
        model = transformers.MistralForCausalLM(
            transformers.MistralConfig(sliding_window=64, **fields))
    elif family == "mistral":
        # Mistral's window (transformers' default 4096) spans the context.
        model = transformers.MistralForCausalLM(
            transformers.MistralConfig(**fields))
    elif family == "qwen2-yarn":
        # Qwen2.5's long-context RoPE (YaRN) over a context of 256.
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
            rope_parameters={"rope_type": "yarn", "factor": 4.0,
                             "original_max_position_embeddings": 256,
                             "rope_theta": 10000.0}, **fields))
    elif family == "qwen3":
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
            head_dim=fields["hidden_size"] // fields["num_attention_heads"],
            attention_bias=True, **fields))
    else:
        raise ValueError(f"unknown family {family!r}")
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(".bias"):
                parameter.normal_(0.0, 0.3)
            elif name.endswith(("q_norm.weight", "k_norm.weight")):
                parameter.normal_(1.0, 0.3)
    return model


def engine_llama_config(transformers: Any) -> Any:
    """The random Llama the vLLM engine tests run: 2 layers, 4 heads and 2
    KV heads of 32 (vLLM's CPU attention takes heads of 32 and more),
    hidden 128, a vocabulary of 256."""
    return transformers.LlamaConfig(
        vocab_size=256, hidden_size=128, intermediate_size=256,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=2048, initializer_range=0.3)


def write_lora_adapter(directory: Path, config: Any, seed: int,
                       rank: int = 8) -> Path:
    """A random LoRA adapter (PEFT's files: adapter_config.json and
    adapter_model.safetensors) on every layer's k_proj and v_proj of a
    Llama of ``config``: it changes the KV the model computes."""
    import json

    import torch
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    kv = config.num_key_value_heads * (config.hidden_size //
                                       config.num_attention_heads)
    tensors = {}
    for layer in range(config.num_hidden_layers):
        for module in ("k_proj", "v_proj"):
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(
                rank, config.hidden_size, generator=g) * 0.3
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(
                kv, rank, generator=g) * 0.3
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    (directory / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": rank, "lora_alpha": rank,
        "target_modules": ["k_proj", "v_proj"], "bias": "none",
        "lora_dropout": 0.0, "fan_in_fan_out": False,
        "task_type": "CAUSAL_LM"}))
    return directory
