#!/usr/bin/env python3
"""The same prefill in PyTorch: transformers' LlamaForCausalLM with SDPA.

    prefill-torch.py --model DIR [--tokens N] [--repeat R]

Loads the model directory kvc-gpu-bench measured (config.json and
safetensors) in bf16 on the GPU with attn_implementation="sdpa", runs a
forward of N random tokens from position 0 (its KV cache kept, as a
server's prefill keeps it), and prints the fastest of R runs after a
warm-up with the FLOPs kvc-gpu-bench counts (projections, MLP and causal
attention; the output layer left out), so the two lines compare.

Exits 77 where PyTorch, transformers or a GPU is missing.
"""

import argparse
import sys
import time

try:
    import torch
    from transformers import LlamaForCausalLM
except ImportError as missing:
    print(f"prefill-torch: skipped ({missing})")
    sys.exit(77)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("prefill-torch: skipped (no GPU)")
        sys.exit(77)
    model = LlamaForCausalLM.from_pretrained(
        args.model, torch_dtype=torch.bfloat16,
        attn_implementation="sdpa").cuda().eval()
    c = model.config
    generator = torch.Generator().manual_seed(7)
    ids = torch.randint(0, c.vocab_size, (1, args.tokens),
                        generator=generator).cuda()

    def run():
        with torch.inference_mode():
            # The decoder layers alone: kvc's prefill computes no logits.
            model.model(input_ids=ids, use_cache=True)
        torch.cuda.synchronize()

    run()
    best = float("inf")
    for _ in range(args.repeat):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    n, h, layers = args.tokens, c.hidden_size, c.num_hidden_layers
    head_dim = getattr(c, "head_dim", None) or h // c.num_attention_heads
    kv = c.num_key_value_heads * head_dim
    dense = 2.0 * n * layers * (2 * h * h + 2 * h * kv +
                                3 * h * c.intermediate_size)
    attention = (4.0 * c.num_attention_heads * head_dim * n * (n + 1) / 2 *
                 layers)
    print(f"prefill-torch: {args.model}, {n} tokens, fastest of "
          f"{args.repeat} runs")
    print(f"prefill  {best * 1e3:.2f} ms, "
          f"{(dense + attention) / best / 1e12:.1f} TFLOP/s "
          f"(transformers {__import__('transformers').__version__}, "
          f"torch {torch.__version__}, SDPA)")


if __name__ == "__main__":
    main()
