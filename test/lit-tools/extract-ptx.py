#!/usr/bin/env python3
"""Writes the PTX of the first gpu.binary object in an MLIR file to stdout.

MLIR prints the assembly as an escaped string ("\\0A" for a newline) that ends
with a NUL byte; ptxas wants the plain text without it.
"""
import re
import sys

text = sys.stdin.read()
match = re.search(r'assembly = "((?:[^"\\]|\\.)*)"', text)
if not match:
    sys.exit("extract-ptx: no gpu.object assembly found")
ptx = re.sub(r"\\([0-9A-Fa-f]{2})", lambda m: chr(int(m.group(1), 16)),
             match.group(1))
sys.stdout.write(ptx.replace("\\\\", "\\").rstrip("\0"))
