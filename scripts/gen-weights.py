#!/usr/bin/env python3
"""Random weights for a model config, as `kvc-run gen-model` writes them.

    gen-weights.py CONFIG OUT [--seed S]

Reads a Llama config.json (kvc-run gen-model's, or any with the same
fields) and writes OUT/config.json and OUT/model.safetensors with the
tensors kvc's LlamaModel loads: every projection and the embedding drawn
from N(0, 0.02), the norms ones, in the config's torch_dtype. The draws
run on the GPU when there is one: a Llama-3-8B-shaped model takes seconds
here where gen-model's single-threaded generator takes minutes. Its weights
are not gen-model's for the same seed (another generator); the model's
fingerprint tells them apart.

Exits 77 where PyTorch or safetensors is missing.
"""

import argparse
import json
import os
import shutil
import sys

try:
    import torch
    from safetensors.torch import save_file
except ImportError as missing:
    print(f"gen-weights: skipped ({missing})")
    sys.exit(77)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    parser.add_argument("out")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    with open(args.config) as f:
        c = json.load(f)
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16,
             "float32": torch.float32}[c.get("torch_dtype", "bfloat16")]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    generator = torch.Generator(device=device).manual_seed(args.seed)
    h, vocab, f = c["hidden_size"], c["vocab_size"], c["intermediate_size"]
    heads, kv_heads = c["num_attention_heads"], c["num_key_value_heads"]
    d = c.get("head_dim", h // heads)

    def normal(*shape):
        x = torch.empty(shape, device=device, dtype=torch.float32)
        x.normal_(0.0, 0.02, generator=generator)
        return x.to(dtype).cpu()

    def ones(size):
        return torch.ones(size, dtype=dtype)

    tensors = {"model.embed_tokens.weight": normal(vocab, h)}
    for layer in range(c["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        tensors[p + "input_layernorm.weight"] = ones(h)
        tensors[p + "self_attn.q_proj.weight"] = normal(heads * d, h)
        tensors[p + "self_attn.k_proj.weight"] = normal(kv_heads * d, h)
        tensors[p + "self_attn.v_proj.weight"] = normal(kv_heads * d, h)
        tensors[p + "self_attn.o_proj.weight"] = normal(h, heads * d)
        tensors[p + "post_attention_layernorm.weight"] = ones(h)
        tensors[p + "mlp.gate_proj.weight"] = normal(f, h)
        tensors[p + "mlp.up_proj.weight"] = normal(f, h)
        tensors[p + "mlp.down_proj.weight"] = normal(h, f)
    tensors["model.norm.weight"] = ones(h)
    if not c.get("tie_word_embeddings", False):
        tensors["lm_head.weight"] = normal(vocab, h)

    os.makedirs(args.out, exist_ok=True)
    if os.path.abspath(args.config) != os.path.abspath(
            os.path.join(args.out, "config.json")):
        shutil.copyfile(args.config, os.path.join(args.out, "config.json"))
    save_file(tensors, os.path.join(args.out, "model.safetensors"))
    count = sum(t.numel() for t in tensors.values())
    print(f"gen-weights: {count / 1e9:.2f}B parameters ({device}) in "
          f"{args.out}")


if __name__ == "__main__":
    main()
