#!/usr/bin/env python3
"""A Python LLM server in miniature over kvc, beside examples/embed's C++ one.

transformers is the server's model. Request A is prefilled by transformers
and its KV saved through a kvc Connector; request B comes back with A's
prompt and more: the Connector decides how much to load (or not), loads it
into the server's paged memory, and transformers continues from the
restored cache, prefilling only the tokens kvc left it. The example judges
the restore on transformers' own logits: over the prompt's rest and 16
tokens after it, next-token KL divergence from a full prefill and top-1
agreement (kvc keeps KV in bf16, so a near tie of a random model's logits
may flip where a full-precision prefill's does not).

Usage: serve.py [MODEL_DIR] (a small Llama is generated when none is given).
Exits non-zero on any error or disagreement.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

import torch
import transformers

import kvc
from kvc.transformers import CacheClient, next_token_quality


def generated_model(directory: str) -> str:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=2048, initializer_range=0.3)
    transformers.LlamaForCausalLM(config).save_pretrained(directory)
    return directory


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", help="a model directory")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = args.model or generated_model(f"{scratch}/model")
        model = transformers.LlamaForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32).eval()
        # Saves go to a store on disk; plans are priced for this 2-core CPU.
        connector = kvc.Connector(model_dir, [f"file://{scratch}/store"],
                                  target="cpu-2core", chunk_tokens=64,
                                  policy="always")
        server = CacheClient(model, connector, capacity_tokens=1024)

        # Request A: the server's own prefill, saved through kvc.
        with torch.no_grad():
            a = model.generate(torch.tensor([[1]]), max_new_tokens=299,
                               min_new_tokens=299, do_sample=False)[0].tolist()
        saved = server.save("A", a)
        print(f"request A: prefilled {len(a)} tokens, saved "
              f"{saved['written']} objects in {saved['seconds'] * 1e3:.2f} ms")

        # Request B: A's prompt and 40 tokens more.
        b = a + a[:40]
        found = connector.lookup(b)
        print(f"request B: the store holds {found.tokens} of its {len(b)} tokens")
        start = time.perf_counter()
        restored = server.restore("B", b)
        print(f"request B: {restored.decision.why}")
        print(f"request B: {restored.tokens} tokens restored in "
              f"{(time.perf_counter() - start) * 1e3:.2f} ms; transformers "
              f"prefills the other {len(b) - restored.tokens}")
        with torch.no_grad():
            ids = torch.tensor([b])
            reference = model.generate(ids, max_new_tokens=16,
                                       min_new_tokens=16,
                                       do_sample=False)[0, len(b):].tolist()
        kl, agree = next_token_quality(model, restored, b, reference)
        with torch.no_grad():
            mine = model.generate(ids, past_key_values=restored.cache,
                                  max_new_tokens=16, min_new_tokens=16,
                                  do_sample=False)[0, len(b):].tolist()
        same = next((i for i, (x, y) in enumerate(zip(mine, reference))
                     if x != y), len(mine))
        print(f"request B decodes: {' '.join(map(str, mine))} (the first "
              f"{same} as transformers without a cache)")
        print(f"request B against a full prefill: next-token KL {kl:.2e} "
              f"nats, top-1 agreement {agree:.3f}")
        connector.close()
        if kl > 0.05 or agree < 0.9:
            print("serve.py: the restore changed transformers' predictions",
                  file=sys.stderr)
            return 1
        return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except kvc.Error as error:
        print(f"serve.py: {error}", file=sys.stderr)
        sys.exit(1)
