#!/usr/bin/env python3
"""What the generated restore kernels cost per value, read off their PTX
without a GPU: for each restore kernel of a plan bundle, the PTX
instructions along one thread's path, per value it writes, the shuffles and
FMAs among them, and the registers and spills ptxas reports for sm_90.

A restore kernel's thread runs its K or V branch without loops, so one
thread's instructions are those along the longest path through the entry;
its values are the matrix's values over the threads the grid gives a
matrix. PTX is not SASS (ptxas schedules, renames and drops moves), so the
count is a proxy for issue slots: it tracks what Nsight Compute measures
closely enough to compare code generations (docs/kernels.md, "Cost per
value").

  python3 bench/kernels/ptx-stats.py build/bench/kernels.json [--tokens 1024]
      [--ptxas /usr/local/cuda/bin/ptxas]
"""
import argparse
import collections
import json
import os
import re
import subprocess
import tempfile

def longest_path(ptx):
    """Opcode counts along the longest path through the entry's blocks (a
    restore kernel's body has branches but no loops)."""
    body = ptx[ptx.index("{", ptx.index(".entry")):]
    blocks = [["entry", collections.Counter(), []]]  # label, ops, successors
    for line in body.splitlines():
        line = line.strip().rstrip(";")
        if line.startswith("$") and line.endswith(":"):
            if blocks[-1][1] and not blocks[-1][2]:  # Falls through.
                blocks[-1][2].append(line[:-1])
            blocks.append([line[:-1], collections.Counter(), []])
            continue
        if not line or line.startswith(("//", ".", "{", "}")):
            continue
        guarded = line.startswith("@")
        if guarded:
            line = line.split(None, 1)[1]
        op = line.split()[0]
        if op.startswith("bra"):
            blocks[-1][2].append(line.split()[-1])
            if guarded:
                continue
            blocks.append([None, collections.Counter(), []])  # Unreachable.
            continue
        blocks[-1][1][op.split(".")[0]] += 1
    index = {label: i for i, (label, _, _) in enumerate(blocks) if label}
    best = {}

    def walk(i):
        if i not in best:
            label, ops, successors = blocks[i]
            tails = [walk(index[s]) for s in successors]
            best[i] = ops + max(tails, key=lambda c: sum(c.values()),
                                default=collections.Counter())
        return best[i]

    return walk(0)


def registers(ptxas, ptx, arch):
    """(registers, spill store bytes) from ptxas -v."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        out = subprocess.run(
            [ptxas, f"-arch={arch}", "-v", path, "-o", os.path.join(tmp, "k.cubin")],
            capture_output=True, text=True, check=True).stderr
    regs = re.search(r"Used (\d+) registers", out)
    spills = re.search(r"(\d+) bytes spill stores", out)
    return int(regs.group(1)), int(spills.group(1)) if spills else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle")
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--ptxas", default="/usr/local/cuda/bin/ptxas")
    args = parser.parse_args()
    with open(args.bundle) as f:
        kernels = json.load(f)["kernels"]
    print(f"{'kernel':56} {'instr/value':>11} {'shfl/value':>10} "
          f"{'fma/value':>9} {'registers':>9} {'spills':>6}")
    for k in kernels:
        if k["kind"] != "restore" or k["tokens"] != args.tokens:
            continue
        ops = longest_path(k["binary"])
        threads = k["grid"][0] // (2 * k["layers"]) * k["block"][0]
        values = k["tokens"] * k["kv_heads"] * k["head_dim"] / threads
        per = lambda n: n / values
        regs, spills = registers(args.ptxas, k["binary"], k["target"])
        print(f"{k['name']:56} {per(sum(ops.values()) - ops['ret']):11.1f} "
              f"{per(ops['shfl']):10.1f} {per(ops['fma']):9.1f} {regs:9} {spills:6}")


if __name__ == "__main__":
    main()
