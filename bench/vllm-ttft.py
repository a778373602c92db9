#!/usr/bin/env python3
"""bench/vllm-ttft.py - time to first token inside a real vLLM engine.

Runs vLLM's CPU engine (``vllm.LLM``, one process per point through
``python -m kvc.vllm_engine``) on two workloads and reports, per point,
the mean, P50 and P90 time to first token of the reusing round, the share
of its prompt tokens loaded from outside vLLM (vLLM's own
``external_prefix_cache_hits``) and its prompt throughput:

- ``longdoc``: N documents of L tokens; a first round asks one question of
  each (and stores it), a second round asks another (LMCache's long-doc QA);
- ``prefix``: P shared prefixes, several requests per prefix with their own
  suffixes (``vllm bench serve --dataset-name prefix_repetition``); the
  first request of each prefix stores it.

Between the rounds the connector's saves are let finish and vLLM's own
prefix cache is emptied (the KV was evicted, or another replica computed
it): the second round reuses only what a connector holds. Rows: vLLM recomputing (no connector); kvc loading all it
holds (``policy: always``); kvc deciding (``policy: cheapest`` against
vLLM's measured prefill); vLLM's shipped ``ExampleConnector``; LMCache
(not run: its vLLM connector refuses a CPU engine). kvc's store is a
file:// directory behind its ``?gbps=`` throttle at each bandwidth; every
engine first prefills warm-up prompts of several lengths (so that kvc has
measured vLLM's prefill, and every row runs warm).

    .venv/bin/python bench/vllm-ttft.py --out docs/results/vllm-ttft
    .venv/bin/python bench/vllm-ttft.py --toy --out /tmp/ttft   # make check

Writes ``results.json`` (every point's raw per-request numbers and kvc's
decisions), ``table.md`` (the points; kvc deciding's predictions against
what was measured; and kvc deciding against the better of the other two
rows, with each row's spread over its batches) and ``ttft.svg`` (P50 TTFT against bandwidth)
to ``--out``. Needs kvc's package importable (PYTHONPATH=
build/python) and vLLM's CPU build (the project's .venv).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LMCACHE_WHY = ("not run: LMCache 0.5.6's vLLM connector refuses vLLM's CPU "
               "platform (\"No supported cpu connector found\"), and the "
               "lent GPU machine has no vLLM")


@dataclass(frozen=True)
class Scale:
    hidden: int
    layers: int
    doc_tokens: int
    question_tokens: int
    prefixes: int
    per_prefix: int
    concurrency: tuple[int, ...]
    gbps: tuple[str, ...]
    batches: int
    """Rounds of ``concurrency`` requests per point (samples)."""


FULL = Scale(hidden=512, layers=4, doc_tokens=1536, question_tokens=64,
             prefixes=4, per_prefix=4, concurrency=(1, 4, 16),
             gbps=("0.1", "0.5", "1", "2", "inf"), batches=5)
TOY = Scale(hidden=128, layers=2, doc_tokens=256, question_tokens=32,
            prefixes=2, per_prefix=2, concurrency=(2,), gbps=("inf",),
            batches=1)


def write_model(directory: Path, scale: Scale) -> None:
    """A random GQA Llama (heads of 64, KV heads half the heads), bf16."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=256, hidden_size=scale.hidden,
        intermediate_size=2 * scale.hidden,
        num_hidden_layers=scale.layers,
        num_attention_heads=max(2, scale.hidden // 64),
        num_key_value_heads=max(1, scale.hidden // 128),
        max_position_embeddings=4096, initializer_range=0.3)
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(directory)


def tokens(seed: int, n: int) -> list[int]:
    import random

    rng = random.Random(seed)
    return [rng.randrange(1, 256) for _ in range(n)]


def workload(name: str, scale: Scale, concurrency: int
             ) -> tuple[list[list[int]], list[list[list[int]]]]:
    """The storing round's prompts and the reusing round's batches (each
    ``concurrency`` prompts submitted together)."""
    seed = 1000 * concurrency
    q = scale.question_tokens
    if name == "longdoc":
        count = concurrency * scale.batches
        docs = [tokens(seed + i, scale.doc_tokens) for i in range(count)]
        store = [d + tokens(seed + 500 + i, q) for i, d in enumerate(docs)]
        reuse = [d + tokens(seed + 700 + i, q) for i, d in enumerate(docs)]
    else:
        prefixes = [tokens(seed + i, scale.doc_tokens)
                    for i in range(scale.prefixes)]
        store = [p + tokens(seed + 500 + i, q) for i, p in enumerate(prefixes)]
        reuse = [prefixes[i % len(prefixes)] + tokens(seed + 900 + i, q)
                 for i in range(concurrency * scale.batches)]
    batches = [reuse[i:i + concurrency] for i in range(0, len(reuse),
                                                       concurrency)]
    return store, batches


def warmup(scale: Scale) -> list[dict[str, Any]]:
    """Prompts of several lengths, one at a time, each length twice (the
    first step of a size picks vLLM's CPU kernels for it): every engine
    runs them first, and kvc measures vLLM's prefill from them."""
    lengths = [scale.doc_tokens * k // 8 for k in (1, 3, 5, 8, 2, 6, 4, 7)]
    return [{"generate": [{"tokens": tokens(77 + i, n)}], "max_tokens": 1}
            for i, n in enumerate(lengths + lengths)]


def engine_connector(row: str, store: Path, gbps: str) -> dict[str, Any]:
    """The spec keys that give the engine ``row``'s connector."""
    if row == "recompute":
        return {}
    if row == "example":
        return {"transfer": {"kv_connector": "ExampleConnector",
                             "kv_role": "kv_both", "kv_connector_extra_config":
                             {"shared_storage_path": str(store)}}}
    throttle = "" if gbps == "inf" else f"?gbps={gbps}"
    return {"connector": {
        "stores": [f"file://{store}{throttle}"], "chunk_tokens": 256,
        "strategies": ["kv"],
        "policy": "always" if row == "kvc-all" else "cheapest"}}


def run_point(model: Path, scale: Scale, name: str, row: str, gbps: str,
              work: Path) -> dict[str, Any]:
    """One engine: warm-up, then per concurrency the storing round, an
    emptied prefix cache, and the reusing round."""
    store = work / f"store-{name}-{row}-{gbps}"
    phases: list[dict[str, Any]] = warmup(scale)
    rounds = []
    for c in scale.concurrency:
        first, batches = workload(name, scale, c)
        phases.append({"generate": [{"tokens": p} for p in first],
                       "max_tokens": 1})
        phases.append({"settle": True})  # the connector's saves written
        phases.append({"reset_prefix_cache": True})
        rounds.append((c, len(phases), len(batches)))
        phases += [{"generate": [{"tokens": p} for p in batch],
                    "max_tokens": 1} for batch in batches]
    spec: dict[str, Any] = {
        "model": str(model), "prefix_caching": True, "block_size": 32,
        "max_model_len": scale.doc_tokens + 2 * scale.question_tokens + 64,
        "max_num_seqs": max(scale.concurrency), "phases": phases,
        **engine_connector(row, store, gbps)}
    spec_path = work / f"{name}-{row}-{gbps}.spec.json"
    result_path = work / f"{name}-{row}-{gbps}.result.json"
    spec_path.write_text(json.dumps(spec))
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0",
               VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE",
                                                     "2"))
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "kvc.vllm_engine", spec_path,
                           result_path], env=env, capture_output=True,
                          text=True)
    if done.returncode != 0 or not result_path.is_file():
        return {"error": done.stderr[-3000:]}
    result = json.loads(result_path.read_text())
    if "start_error" in result:
        return {"error": result["start_error"]}
    points = {}
    for c, start, count in rounds:
        reuse = result["phases"][start:start + count]
        if any("error" in p for p in reuse) or len(reuse) < count:
            points[str(c)] = {"error": next((p["error"] for p in reuse
                                             if "error" in p), "missing")}
            continue
        ttft = [t for p in reuse for t in p["ttft"]]
        prompt = sum(len(x) for _, batches in [workload(name, scale, c)]
                     for batch in batches for x in batch)
        hits = sum(p["counters"]["vllm:external_prefix_cache_hits"]
                   for p in reuse)
        seconds = sum(p["seconds"] for p in reuse)
        decisions = [d for p in reuse for d in p.get("decisions", [])]
        points[str(c)] = {
            "ttft": ttft, "hit_rate": hits / prompt,
            "prefill_seconds": [t for p in reuse for t in p["prefill_seconds"]],
            "decided": decisions,
            "tokens_per_second": prompt / seconds,
            "loads": sum(1 for d in decisions if d["load_tokens"] >
                         d["tokens_on_device"]),
            "decisions": len(decisions)}
    return {"points": points, "seconds": time.perf_counter() - began,
            "prefill_steps": result.get("prefill_steps"),
            "prefill_fit": result.get("prefill_fit")}


def summarize(ttft: list[float]) -> tuple[float, float, float]:
    ordered = sorted(ttft)
    p90 = ordered[min(len(ordered) - 1, int(round(0.9 * (len(ordered) - 1))))]
    return statistics.fmean(ordered), statistics.median(ordered), p90


ROWS = [("recompute", "vLLM recomputing (no connector)"),
        ("kvc-all", "kvc, loading all it holds"),
        ("kvc-decide", "kvc, deciding"),
        ("example", "vLLM ExampleConnector")]


def table(results: dict[str, Any], scale: Scale) -> str:
    lines = ["| workload | row | store Gbps | concurrency | mean TTFT ms | "
             "P50 ms | P90 ms | hit rate | prompt tok/s | loads/requests |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for key, point in results.items():
        name, row, gbps = key.split("|")
        label = dict(ROWS)[row]
        if "error" in point:
            lines.append(f"| {name} | {label} | {gbps} | - | error: "
                         f"{point['error'].splitlines()[-1][:80]} |||||")
            continue
        for c, p in point["points"].items():
            if "error" in p:
                lines.append(f"| {name} | {label} | {gbps} | {c} | error |||||")
                continue
            mean, p50, p90 = summarize(p["ttft"])
            loads = f"{p['loads']}/{p['decisions']}" if p["decisions"] else "-"
            lines.append(f"| {name} | {label} | {gbps} | {c} | "
                         f"{mean * 1e3:.1f} | {p50 * 1e3:.1f} | "
                         f"{p90 * 1e3:.1f} | {p['hit_rate']:.2f} | "
                         f"{p['tokens_per_second']:.0f} | {loads} |")
    for name in ("longdoc", "prefix"):
        lines.append(f"| {name} | LMCache | - | - | {LMCACHE_WHY} |||||")
    return "\n".join(lines) + "\n"


def predictions(results: dict[str, Any]) -> str:
    """kvc deciding's predictions against what the same run measured, at
    the lowest concurrency (1: one request a step): vLLM's prefill as the connector
    measured and predicted it, against vLLM alone's measured prefill of the
    same prompts; and each loading decision's predicted first token (the
    planner's, times the load clock's ratio) against its measured prefill."""
    lines = ["| workload | store Gbps | predicted recompute ms | vLLM alone's "
             "prefill ms | error | loads | predicted load ms | measured ms |"
             " error |", "|---|---|---|---|---|---|---|---|---|"]
    for key, point in results.items():
        name, row, gbps = key.split("|")
        lowest = min(point.get("points", {"0": 0}), key=int)
        p = point.get("points", {}).get(lowest)
        alone = results.get(f"{name}|recompute|inf", {}).get("points", {}
                                                              ).get(lowest)
        if row != "kvc-decide" or not p or "decided" not in p or not alone:
            continue
        predicted = [d["recompute_seconds"] for d in p["decided"]
                     if d["recompute_seconds"]]
        measured = statistics.fmean(alone["prefill_seconds"])
        loads = [(d["predicted_seconds"] * d.get("load_ratio", 1.0), t)
                 for d, t in zip(p["decided"], p["prefill_seconds"])
                 if d["load_tokens"] > d["tokens_on_device"]]
        cells = ["-"] * 3
        if loads:
            guess = statistics.fmean(g for g, _ in loads)
            real = statistics.fmean(t for _, t in loads)
            cells = [f"{guess * 1e3:.1f}", f"{real * 1e3:.1f}",
                     f"{guess / real - 1:+.0%}"]
        if predicted:
            guess = statistics.fmean(predicted)
            lines.append(f"| {name} | {gbps} | {guess * 1e3:.1f} | "
                         f"{measured * 1e3:.1f} | {guess / measured - 1:+.0%} "
                         f"| {len(loads)}/{len(p['decided'])} | "
                         + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def versus(results: dict[str, Any], scale: Scale) -> str:
    """kvc deciding against the better of vLLM recomputing and kvc loading
    all it holds, per point (mean TTFT), with the spread of each row's
    batch means (the run's noise: min-max over its batches)."""
    lines = ["| workload | concurrency | store Gbps | recompute ms | load-all ms"
             " | kvc deciding ms | deciding / better of the two | recompute /"
             " deciding |", "|---|---|---|---|---|---|---|---|"]

    def cell(key: str, c: str) -> tuple[float, str] | None:
        p = results.get(key, {}).get("points", {}).get(c)
        if not p or "ttft" not in p:
            return None
        ttft = p["ttft"]
        size = int(c)
        means = [statistics.fmean(ttft[i:i + size])
                 for i in range(0, len(ttft), size)]
        mean = statistics.fmean(ttft)
        return mean, (f"{mean * 1e3:.1f} ({min(means) * 1e3:.0f}-"
                      f"{max(means) * 1e3:.0f})")

    for name in ("longdoc", "prefix"):
        for c in map(str, scale.concurrency):
            alone = cell(f"{name}|recompute|inf", c)
            for gbps in scale.gbps:
                every = cell(f"{name}|kvc-all|{gbps}", c)
                decide = cell(f"{name}|kvc-decide|{gbps}", c)
                if not alone or not every or not decide:
                    continue
                better = min(alone[0], every[0])
                lines.append(f"| {name} | {c} | {gbps} | {alone[1]} | "
                             f"{every[1]} | {decide[1]} | "
                             f"{decide[0] / better:.2f} | "
                             f"{alone[0] / decide[0]:.2f} |")
    return "\n".join(lines) + "\n"


def plot(results: dict[str, Any], scale: Scale, path: Path) -> None:
    """P50 TTFT against the store's bandwidth, per row, one panel per
    workload and concurrency: an SVG (log scale), written by hand."""
    import math

    colors = {"recompute": "#444444", "kvc-all": "#1f77b4",
              "kvc-decide": "#d62728", "example": "#2ca02c"}
    bands = list(scale.gbps)
    panels = [(n, c) for n in ("longdoc", "prefix") for c in scale.concurrency]
    width, height, pad = 300, 220, 50
    values = [summarize(p["ttft"])[1] for v in results.values()
              if "points" in v for p in v["points"].values() if "ttft" in p]
    if not values:
        return
    low, high = math.log10(min(values)) - 0.1, math.log10(max(values)) + 0.1
    columns = len(scale.concurrency)
    rows = -(-len(panels) // columns)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width * columns}"'
           f' height="{(height + 40) * rows}" font-family="sans-serif" '
           'font-size="10">']
    for i, (name, c) in enumerate(panels):
        x0, y0 = (i % columns) * width, (i // columns) * (height + 40)
        out.append(f'<text x="{x0 + pad}" y="{y0 + 14}">{name}, concurrency '
                   f'{c}: P50 TTFT (ms, log)</text>')

        def xy(band: int, seconds: float) -> tuple[float, float]:
            x = x0 + pad + band * (width - pad - 10) / max(1, len(bands) - 1)
            y = y0 + 20 + (high - math.log10(seconds)) / (high - low) * \
                (height - 40)
            return x, y
        for b, gbps in enumerate(bands):
            x, _ = xy(b, 1.0)
            out.append(f'<text x="{x - 8:.0f}" y="{y0 + height + 5}">{gbps}'
                       '</text>')
        for e in range(math.ceil(low), math.floor(high) + 1):
            _, y = xy(0, 10.0 ** e)
            out.append(f'<text x="{x0 + 5}" y="{y:.0f}">{10.0 ** e * 1e3:g}'
                       '</text>')
        out.append(f'<text x="{x0 + pad}" y="{y0 + height + 20}">store Gbps'
                   '</text>')
        for row, color in colors.items():
            points = []
            for b, gbps in enumerate(bands):
                key = f"{name}|{row}|{gbps if row.startswith('kvc') else 'inf'}"
                p = results.get(key, {}).get("points", {}).get(str(c))
                if p and "ttft" in p:
                    points.append(xy(b, summarize(p["ttft"])[1]))
            if points:
                line = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
                out.append(f'<polyline fill="none" stroke="{color}" '
                           f'stroke-width="2" points="{line}"/>')
        for j, (row, color) in enumerate(colors.items()):
            out.append(f'<text x="{x0 + pad + 5}" y="{y0 + 30 + 12 * j}" '
                       f'fill="{color}">{dict(ROWS)[row]}</text>')
    out.append("</svg>")
    path.write_text("\n".join(out) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--toy", action="store_true",
                        help="one bandwidth, two documents, a tiny model")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rows", default=",".join(r for r, _ in ROWS))
    parser.add_argument("--workloads", default="longdoc,prefix")
    parser.add_argument("--gbps", help="the store bandwidths of the kvc rows "
                        "(default: the scale's)")
    parser.add_argument("--replot", action="store_true",
                        help="redraw table.md and ttft.svg from --out's "
                        "results.json")
    args = parser.parse_args()
    scale = TOY if args.toy else FULL
    if args.replot:
        saved = json.loads((args.out / "results.json").read_text())
        (args.out / "table.md").write_text(
            table(saved["results"], scale) + "\n" +
            predictions(saved["results"]) + "\n" +
            versus(saved["results"], scale))
        plot(saved["results"], scale, args.out / "ttft.svg")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="kvc-ttft-") as tmp:
        work = Path(tmp)
        model = work / "model"
        write_model(model, scale)
        for name in args.workloads.split(","):
            for row in args.rows.split(","):
                kvc_row = row.startswith("kvc")
                bands = args.gbps.split(",") if args.gbps else scale.gbps
                for gbps in bands if kvc_row else ("inf",):
                    print(f"vllm-ttft: {name} {row} {gbps} Gbps", flush=True)
                    results[f"{name}|{row}|{gbps}"] = run_point(
                        model, scale, name, row, gbps, work)
                    (args.out / "results.json").write_text(json.dumps(
                        {"scale": scale.__dict__, "results": results},
                        indent=1))
    (args.out / "table.md").write_text(table(results, scale) + "\n" +
                                       predictions(results) + "\n" +
                                       versus(results, scale))
    plot(results, scale, args.out / "ttft.svg")
    print(table(results, scale))
    failed = [k for k, v in results.items() if "error" in v or any(
        "error" in p for p in v["points"].values())]
    if failed:
        print(f"vllm-ttft: failed points: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
