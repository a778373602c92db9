#!/usr/bin/env python3
"""The main job's plans beside the server's own recompute.

    main-vs-sdpa.py --grid MAIN.json --sdpa SDPA.json --tokens 8192,32768 \
        --links 7,32,100 [--out TABLE.md]

Reads what one `gpu-check.sh all` call wrote: `kvc-run grid`'s cells
(every plan's run times at each context and link) and prefill-torch.py's
(transformers' SDPA prefill of as many tokens of the same model, timed in
the same call), and prints two Markdown tables: every plan's median and
spread beside SDPA's, and for each cell the joint plan's speedup over the
better of SDPA's recompute and loading everything (the `kv` plan). A cell
the call did not reach, or a context SDPA was not timed at, is listed as
not run, never dropped. Uses only the standard library (the GPU machine
has no kvc package).
"""

import argparse
import json
import statistics
import sys
from typing import Dict, List, Optional, Tuple


def spread(runs: List[float]) -> str:
    """`median (fastest to slowest, n runs)` of run times in ms."""
    if not runs:
        return "not run"
    median = statistics.median(runs)
    if len(runs) == 1:
        return f"{median:.1f} (1 run)"
    return f"{median:.1f} ({min(runs):.1f} to {max(runs):.1f}, {len(runs)} runs)"


def load_json(path: Optional[str]) -> Optional[dict]:
    """The JSON object at ``path``; None (and a line on stderr) when there
    is none to read."""
    if not path:
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        print(f"main-vs-sdpa: no {path}: its cells are listed as not run",
              file=sys.stderr)
    except (OSError, ValueError) as error:
        print(f"main-vs-sdpa: {path}: {error}", file=sys.stderr)
    return None


def plan_runs(plan: dict) -> List[float]:
    """A plan's run times in ms (a grid from before runs_ms: its median)."""
    runs = plan.get("runs_ms")
    if runs:
        return [float(r) for r in runs]
    return [float(plan["median_ms"])] if "median_ms" in plan else []


def tables(grid: Optional[dict], sdpa: Optional[dict], tokens: List[int],
           links: List[int]) -> str:
    cells: Dict[Tuple[int, int], dict] = {}
    for cell in (grid or {}).get("cells", []):
        if cell.get("step") == "compare":
            cells[(int(cell["tokens"]), int(cell["gbps"]))] = cell
    recompute: Dict[int, List[float]] = {}
    for prefill in (sdpa or {}).get("prefills", []):
        recompute[int(prefill["tokens"])] = [float(r) for r in prefill["runs_ms"]]
    lines = [
        "| tokens | link Gbps | plan | kvc ms: median (spread) | "
        "SDPA recompute ms: median (spread) | time over SDPA's |",
        "|---|---|---|---|---|---|",
    ]
    summary = [
        "| tokens | link Gbps | joint ms | SDPA recompute ms | load-all (kv) ms "
        "| better of the two | joint's speedup over it |",
        "|---|---|---|---|---|---|---|",
    ]
    failed: List[str] = []
    for n in tokens:
        sdpa_runs = recompute.get(n, [])
        sdpa_median = statistics.median(sdpa_runs) if sdpa_runs else None
        for gbps in links:
            cell = cells.get((n, gbps))
            if cell is None or not cell.get("plans"):
                why = "not run" if cell is None else f"failed: {cell['status']}"
                lines.append(f"| {n} | {gbps} | - | {why} | {spread(sdpa_runs)} | - |")
                summary.append(f"| {n} | {gbps} | {why} | {spread(sdpa_runs)} | - | - | - |")
                continue
            medians: Dict[str, float] = {}
            for plan in cell["plans"]:
                runs = plan_runs(plan)
                if not runs:
                    continue
                medians[plan["plan"]] = statistics.median(runs)
                ratio = (f"{medians[plan['plan']] / sdpa_median:.2f}"
                         if sdpa_median else "-")
                mark = "" if cell["status"] == "ok" else " *"
                lines.append(f"| {n} | {gbps} | {plan['plan']} | "
                             f"{spread(runs)}{mark} | {spread(sdpa_runs)} | {ratio} |")
            if cell["status"] != "ok":
                failed.append(f"{n} tokens at {gbps} Gbps: {cell['status']}")
            joint, kv = medians.get("joint"), medians.get("kv")
            if joint is None or kv is None or sdpa_median is None:
                shown = [f"{v:.1f}" if v is not None else "-" for v in (joint, kv)]
                summary.append(f"| {n} | {gbps} | {shown[0]} | "
                               f"{spread(sdpa_runs)} | {shown[1]} | - | - |")
                continue
            better, name = min((sdpa_median, "SDPA"), (kv, "kv"))
            summary.append(f"| {n} | {gbps} | {joint:.1f} | {sdpa_median:.1f} | "
                           f"{kv:.1f} | {name} | {better / joint:.2f}x |")
    notes = "".join(f"\n\\* the cell's compare failed: {why}" for why in failed)
    return ("\n".join(lines) + "\n" + (notes + "\n" if notes else "") + "\n" +
            "\n".join(summary) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--grid", required=True)
    parser.add_argument("--sdpa")
    parser.add_argument("--tokens", required=True)
    parser.add_argument("--links", required=True)
    parser.add_argument("--out")
    args = parser.parse_args()
    table = tables(load_json(args.grid), load_json(args.sdpa),
                   [int(t) for t in args.tokens.split(",")],
                   [int(g) for g in args.links.split(",")])
    if args.out:
        with open(args.out, "w") as f:
            f.write(table)
    print(table, end="")


if __name__ == "__main__":
    main()
