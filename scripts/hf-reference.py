#!/usr/bin/env python3
"""An independent reference for kvc's model loader, decode and restores.

Loads a model directory (config.json + safetensors: what `kvc-run
gen-model` or `import-llama2c` writes) with Hugging Face transformers'
LlamaForCausalLM in float32, then

  --prompt-ids "1" --expect "403 407 261 ..."
      decodes greedily after the prompt and compares each token with the
      ones kvc decoded (`kvc-run generate` prints them), printing per step
      the margin between the top two logits, so that a difference can be
      told apart from a near tie;

  --kv A.safetensors B.safetensors ...
      runs the tokens of each `kvc-run restore --dump-kv` file and holds
      the K and V kvc restored against transformers' own past_key_values:
      the largest difference relative to the largest |K| or |V|, within
      --kv-bound (default 1/64: kvc rounds K and V to bf16 where it makes
      them, as the paged cache holds them, and its later layers attend over
      those; transformers in float32 rounds nothing).

Exits 0 when every token agrees and every restore is within the bound, 1
otherwise, 77 when torch or transformers is missing (a test then reports
itself skipped).
"""

import argparse
import sys


def layer_kv(cache, layer):
    """K and V of `layer` in a transformers cache, [batch, heads, seq, dim]."""
    if hasattr(cache, "layers"):  # transformers >= 4.56
        return cache.layers[layer].keys, cache.layers[layer].values
    if hasattr(cache, "key_cache"):
        return cache.key_cache[layer], cache.value_cache[layer]
    return cache[layer][0], cache[layer][1]


def decode(torch, model, device, prompt_ids, expect_ids):
    prompt = [int(t) for t in prompt_ids.split()]
    expect = [int(t) for t in expect_ids.split()]
    got, margins = [], []
    with torch.no_grad():
        out = model(torch.tensor([prompt], device=device), use_cache=True)
        for _ in expect:
            logits = out.logits[0, -1]
            top = torch.topk(logits, 2)
            token = int(top.indices[0])
            got.append(token)
            margins.append(float(top.values[0] - top.values[1]))
            out = model(torch.tensor([[token]], device=device),
                        past_key_values=out.past_key_values, use_cache=True)

    agree = next((i for i, (a, b) in enumerate(zip(got, expect)) if a != b),
                 len(expect))
    print(f"transformers on {device}: {' '.join(map(str, got))}")
    print(f"kvc:                {' '.join(map(str, expect))}")
    print(f"smallest top-2 logit margin: {min(margins):.3f}")
    if agree == len(expect):
        print(f"all {len(expect)} tokens agree")
        return 0
    print(f"first difference at step {agree}: transformers {got[agree]}, "
          f"kvc {expect[agree]} (top-2 margin there {margins[agree]:.3f})")
    return 1


def compare_kv(torch, model, device, paths, bound):
    from safetensors.torch import load_file
    status = 0
    references = {}
    for path in paths:
        dump = load_file(path)
        tokens = dump["tokens"].to(torch.int64)
        key = tuple(tokens.tolist())
        if key not in references:
            with torch.no_grad():
                out = model(tokens[None].to(device), use_cache=True)
            references[key] = out.past_key_values
        cache = references[key]
        error = largest = 0.0
        for layer in range(model.config.num_hidden_layers):
            for name, ref in zip(("key", "value"), layer_kv(cache, layer)):
                ref = ref[0].permute(1, 0, 2).float().cpu()  # [seq, heads, dim]
                mine = dump[f"layers.{layer}.{name}"]
                error = max(error, float((mine - ref).abs().max()))
                largest = max(largest, float(ref.abs().max()))
        relative = error / largest if largest else float("inf")
        verdict = "ok" if relative <= bound else "FAILED"
        print(f"{path}: {len(key)} tokens against transformers' "
              f"past_key_values: max error {relative:.3g} (bound {bound:g}): "
              f"{verdict}")
        status |= verdict != "ok"
    return status


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--prompt-ids",
                        help="the prompt's token ids, space-separated")
    parser.add_argument("--expect",
                        help="kvc's greedy tokens, space-separated")
    parser.add_argument("--kv", nargs="+", default=[],
                        help="kvc-run restore --dump-kv files")
    parser.add_argument("--kv-bound", type=float, default=1 / 64)
    args = parser.parse_args()
    if bool(args.prompt_ids) != bool(args.expect):
        parser.error("--prompt-ids and --expect go together")
    if not args.prompt_ids and not args.kv:
        parser.error("give --prompt-ids and --expect, or --kv")
    try:
        import torch
        from transformers import LlamaForCausalLM
    except ImportError as error:
        print(f"hf-reference: {error}; skipped")
        return 77

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = LlamaForCausalLM.from_pretrained(args.model,
                                             dtype=torch.float32).to(device)
    model.eval()
    status = 0
    if args.prompt_ids:
        status |= decode(torch, model, device, args.prompt_ids, args.expect)
    if args.kv:
        status |= compare_kv(torch, model, device, args.kv, args.kv_bound)
    return status


if __name__ == "__main__":
    sys.exit(main())
