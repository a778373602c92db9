#!/usr/bin/env python3
"""Renders a kvc-run Chrome trace (--trace FILE) as an SVG timeline.

    scripts/trace-svg.py TRACE.json OUT.svg [--title TEXT]

One row per resource worker (the trace's threads, in their sort order), one
bar per task, coloured by the step it starts with, with a millisecond axis:
a picture of a run for docs, where chrome://tracing or Perfetto is not at
hand.
"""

import argparse
import html
import json

COLOURS = {
    "chunk_compute": "#4c72b0",
    "scatter": "#55a868",
    "fetch": "#dd8452",
    "decompress": "#ccb974",
    "transfer_to_device": "#8172b3",
    "project": "#64b5cd",
}
LANE_HEIGHT, BAR_HEIGHT, LEFT, TOP, WIDTH = 34, 24, 110, 40, 900


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("out")
    parser.add_argument("--title", default="")
    args = parser.parse_args()

    with open(args.trace) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    names, order = {}, {}
    for e in events:
        if e.get("ph") == "M" and e["name"] == "thread_name":
            names[e["tid"]] = e["args"]["name"]
        elif e.get("ph") == "M" and e["name"] == "thread_sort_index":
            order[e["tid"]] = e["args"]["sort_index"]
    tasks = [e for e in events if e.get("ph") == "X"]
    lanes = sorted(names, key=lambda tid: order.get(tid, tid))
    row = {tid: i for i, tid in enumerate(lanes)}
    end_us = max(e["ts"] + e["dur"] for e in tasks)
    scale = (WIDTH - LEFT - 20) / end_us

    height = TOP + LANE_HEIGHT * len(lanes) + 60
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
        f'height="{height}" font-family="sans-serif" font-size="11">',
        f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
        f'<text x="{LEFT}" y="22" font-size="13">{html.escape(args.title)}</text>',
    ]
    for tid in lanes:
        y = TOP + row[tid] * LANE_HEIGHT
        out.append(f'<text x="8" y="{y + BAR_HEIGHT / 2 + 4}">'
                   f"{html.escape(names[tid])}</text>")
        out.append(f'<line x1="{LEFT}" y1="{y + BAR_HEIGHT + 4}" '
                   f'x2="{WIDTH - 20}" y2="{y + BAR_HEIGHT + 4}" '
                   'stroke="#eee"/>')
    for e in tasks:
        op = e["name"].split()[0].split("+")[0]
        x = LEFT + e["ts"] * scale
        w = e["dur"] * scale
        y = TOP + row[e["tid"]] * LANE_HEIGHT
        label = html.escape(e["name"])
        # Sub-pixel tasks (scatters, copies) still show, as 2 px ticks.
        edge = 'stroke="white"' if w > 4 else ""
        out.append(f'<rect x="{x:.1f}" y="{y}" width="{max(w, 2.0):.1f}" '
                   f'height="{BAR_HEIGHT}" fill="{COLOURS.get(op, "#999")}" '
                   f'{edge}><title>{label}: {e["dur"] / 1e3:.2f} ms'
                   "</title></rect>")
        if w > 6.5 * len(e["name"]):
            out.append(f'<text x="{x + 4:.1f}" y="{y + BAR_HEIGHT / 2 + 4}" '
                       f'fill="white">{label}</text>')
    axis_y = TOP + LANE_HEIGHT * len(lanes) + 10
    step_ms = next(s for s in (10, 20, 50, 100, 200, 500, 1000, 2000)
                   if end_us / 1e3 / s <= 10)
    tick = 0
    while tick * 1e3 <= end_us:
        x = LEFT + tick * 1e3 * scale
        out.append(f'<line x1="{x:.1f}" y1="{axis_y}" x2="{x:.1f}" '
                   f'y2="{axis_y + 5}" stroke="black"/>')
        out.append(f'<text x="{x:.1f}" y="{axis_y + 18}" '
                   f'text-anchor="middle">{tick} ms</text>')
        tick += step_ms
    out.append(f'<line x1="{LEFT}" y1="{axis_y}" x2="{WIDTH - 20}" '
               f'y2="{axis_y}" stroke="black"/>')
    legend_x = LEFT
    for op, colour in COLOURS.items():
        if any(e["name"].startswith(op) for e in tasks):
            out.append(f'<rect x="{legend_x}" y="{axis_y + 28}" width="10" '
                       f'height="10" fill="{colour}"/>')
            out.append(f'<text x="{legend_x + 14}" y="{axis_y + 37}">{op}'
                       "</text>")
            legend_x += 20 + 7 * len(op)
    out.append("</svg>")
    with open(args.out, "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
