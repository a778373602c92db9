#!/usr/bin/env python3
"""An independent reference for kvc's model loader and decode.

Loads a model directory (config.json + safetensors, e.g. what
`kvc-run import-llama2c` writes) with Hugging Face transformers'
LlamaForCausalLM in float32, decodes greedily after the prompt, and
compares each token with the ones kvc decoded (`kvc-run generate` prints
them):

  hf-reference.py --model DIR --prompt-ids "1" --expect "403 407 261 ..."

Prints both sequences and, per step, the margin between the top two
logits, so that a difference can be told apart from a near tie. Exits 0
when every token agrees, 1 when one differs, 77 when torch or transformers
is missing (a test then reports itself skipped).
"""

import argparse
import sys


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--prompt-ids", required=True,
                        help="the prompt's token ids, space-separated")
    parser.add_argument("--expect", required=True,
                        help="kvc's greedy tokens, space-separated")
    args = parser.parse_args()
    try:
        import torch
        from transformers import LlamaForCausalLM
    except ImportError as error:
        print(f"hf-reference: {error}; skipped")
        return 77

    prompt = [int(t) for t in args.prompt_ids.split()]
    expect = [int(t) for t in args.expect.split()]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = LlamaForCausalLM.from_pretrained(args.model,
                                             dtype=torch.float32).to(device)
    model.eval()

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


if __name__ == "__main__":
    sys.exit(main())
