#!/usr/bin/env python3
"""The same prefill in PyTorch: transformers' LlamaForCausalLM with SDPA.

    prefill-torch.py --model DIR [--tokens N[,N...]] [--repeat R] [--json OUT]

Loads the model directory kvc measured (config.json and safetensors) in
bf16 on the GPU with attn_implementation="sdpa" once, and for each N runs
a forward of N random tokens from position 0 (its KV cache kept, as a
server's prefill keeps it): a warm-up, then R timed runs. Prints the
fastest and the median with the spread and the FLOPs kvc-gpu-bench counts
(projections, MLP and causal attention; the output layer left out), so the
two tools' lines compare; --json writes every run's time per N, for the
main job's table (bench/main-vs-sdpa.py). This is the recompute a server
has: transformers' fastest attention on that GPU, not kvc's prefill.

Exits 77 where PyTorch, transformers or a GPU is missing.
"""

import argparse
import json
import statistics
import sys
import time

try:
    import torch
    import transformers
    from transformers import LlamaForCausalLM
except ImportError as missing:
    print(f"prefill-torch: skipped ({missing})")
    sys.exit(77)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--tokens", default="2048",
                        help="token counts, comma-separated")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", help="where to write every run's time")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("prefill-torch: skipped (no GPU)")
        sys.exit(77)
    model = LlamaForCausalLM.from_pretrained(
        args.model, torch_dtype=torch.bfloat16,
        attn_implementation="sdpa").cuda().eval()
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    kv = c.num_key_value_heads * head_dim
    versions = (f"transformers {transformers.__version__}, "
                f"torch {torch.__version__}, SDPA")
    results = {"model": args.model, "versions": versions,
               "gpu": torch.cuda.get_device_name(), "prefills": []}
    for n in (int(t) for t in args.tokens.split(",")):
        generator = torch.Generator().manual_seed(7)
        ids = torch.randint(0, c.vocab_size, (1, n),
                            generator=generator).cuda()

        def run() -> None:
            with torch.inference_mode():
                # The decoder layers alone: kvc's prefill computes no logits.
                model.model(input_ids=ids, use_cache=True)
            torch.cuda.synchronize()

        run()
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
        times.sort()
        h, layers = c.hidden_size, c.num_hidden_layers
        dense = 2.0 * n * layers * (2 * h * h + 2 * h * kv +
                                    3 * h * c.intermediate_size)
        attention = (4.0 * c.num_attention_heads * head_dim * n * (n + 1) /
                     2 * layers)
        best, median = times[0], statistics.median(times)
        print(f"prefill-torch: {args.model}, {n} tokens, {layers} layers, "
              f"{args.repeat} runs")
        print(f"prefill  {best * 1e3:.2f} ms fastest, {median * 1e3:.2f} ms "
              f"median ({best * 1e3:.2f} to {times[-1] * 1e3:.2f}), "
              f"{(dense + attention) / best / 1e12:.1f} TFLOP/s ({versions})",
              flush=True)
        results["prefills"].append(
            {"tokens": n, "layers": layers, "runs_ms": [t * 1e3 for t in times]})
        if args.json:
            # Rewritten after each count: a later one stopped by a time
            # limit leaves the earlier ones.
            with open(args.json, "w") as out:
                json.dump(results, out, indent=1)


if __name__ == "__main__":
    main()
