#!/usr/bin/env python3
"""Rewrites the PTX of a plan bundle's kernels: a mutant for a test to catch.

mutate-ptx.py BUNDLE KERNEL PATTERN REPLACEMENT > MUTANT

replaces the first match of PATTERN (a Python regular expression) with
REPLACEMENT in the PTX of every kernel whose name KERNEL (a regular
expression) matches, and writes the bundle to stdout. Fails where a matching
kernel's PTX has no match, or no kernel matches, so that a test cannot go on
checking an unchanged bundle.
"""
import json
import re
import sys

path, kernel, pattern, replacement = sys.argv[1:5]
with open(path) as f:
    bundle = json.load(f)
mutated = 0
for k in bundle.get("kernels", []):
    if not re.search(kernel, k["name"]):
        continue
    ptx, n = re.subn(pattern, replacement, k["binary"], count=1)
    if not n:
        sys.exit(f"mutate-ptx: {k['name']} has no match of {pattern!r}")
    k["binary"] = ptx
    mutated += 1
if not mutated:
    sys.exit(f"mutate-ptx: no kernel of {path} matches {kernel!r}")
json.dump(bundle, sys.stdout)
