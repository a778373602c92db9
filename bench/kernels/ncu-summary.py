#!/usr/bin/env python3
"""Where the generated kernels spend their time, from Nsight Compute: one
line per profiled kernel, read from the CSV of `ncu --import REPORT --csv
--page raw` (scripts/gpu-check.sh profile writes one per kernel).

  python3 bench/kernels/ncu-summary.py RAW.csv [RAW.csv ...]

Columns: duration; DRAM and SM throughput as a share of their peaks
(memory-bound kernels sit near the first); issue slots busy (near 100%:
instruction-bound); achieved occupancy; registers per thread; warp cycles
per issued instruction; and the three stall reasons that keep a warp
waiting most, in warps per issue cycle. A metric a report lacks prints as
"-" (sections and metric names vary across Nsight Compute versions).
"""
import csv
import re
import sys

METRICS = [  # (column, metric or its names across versions, format)
    ("us", "gpu__time_duration.sum", "{:.1f}"),
    ("dram%", ("dram__throughput.avg.pct_of_peak_sustained_elapsed",
               "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"),
     "{:.0f}"),
    ("sm%", "sm__throughput.avg.pct_of_peak_sustained_elapsed", "{:.0f}"),
    ("issue%", "smsp__issue_active.avg.pct_of_peak_sustained_active", "{:.0f}"),
    ("occupancy%", "sm__warps_active.avg.pct_of_peak_sustained_active", "{:.0f}"),
    ("regs", "launch__registers_per_thread", "{:.0f}"),
    ("cycles/issue", "smsp__average_warp_latency_per_inst_issued.ratio", "{:.1f}"),
]
STALL = re.compile(r"^smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio$")
TO_US = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6}


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def rows(path):
    """(kernel name, {metric: (value, unit)}) per profiled launch."""
    with open(path, newline="") as f:
        # ncu may print its own lines (==PROF==) before the table.
        lines = [line for line in f if not line.startswith("==")]
    table = list(csv.reader(lines))
    if len(table) < 3:
        return
    header, units = table[0], table[1]
    for values in table[2:]:
        record = {name: (number(value), unit)
                  for name, unit, value in zip(header, units, values)}
        name = dict(zip(header, values)).get("Kernel Name", "?")
        yield name.split("(")[0], record


def summarize(name, record):
    cells = []
    for column, metrics, form in METRICS:
        if isinstance(metrics, str):
            metrics = (metrics,)
        value, unit = next((record[m] for m in metrics if m in record),
                           (None, ""))
        if value is not None and column == "us":
            value *= TO_US.get(unit, 1.0)
        cells.append("-" if value is None else form.format(value))
    stalls = sorted(((value, STALL.match(metric).group(1))
                     for metric, (value, _) in record.items()
                     if STALL.match(metric) and value is not None),
                    reverse=True)[:3]
    cells.append(" ".join(f"{reason} {value:.2f}" for value, reason in stalls)
                 or "-")
    return [name] + cells


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__.split("\n\n")[1])
    lines = [summarize(name, record)
             for path in sys.argv[1:] for name, record in rows(path)]
    header = ["kernel"] + [column for column, _, _ in METRICS] + ["top stalls"]
    widths = [max(len(str(line[i])) for line in [header] + lines)
              for i in range(len(header) - 1)]
    for line in [header] + lines:
        print(" ".join(str(cell).ljust(w) if i == 0 else str(cell).rjust(w)
                       for i, (cell, w) in enumerate(zip(line, widths)))
              + "  " + line[-1])


if __name__ == "__main__":
    main()
