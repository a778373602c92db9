#!/usr/bin/env python3
"""Assembles every kernel of a plan bundle's kernel table with ptxas for its
architecture; prints one line per kernel and fails on the first error.

  ptxas-bundle.py PTXAS BUNDLE.json
"""
import json
import os
import subprocess
import sys
import tempfile

ptxas, bundle = sys.argv[1], sys.argv[2]
kernels = json.load(open(bundle)).get("kernels", [])
if not kernels:
    sys.exit("ptxas-bundle: the bundle has no kernels")
with tempfile.TemporaryDirectory() as tmp:
    for kernel in sorted(kernels, key=lambda k: k["name"]):
        src = os.path.join(tmp, kernel["name"] + ".ptx")
        with open(src, "w") as f:
            f.write(kernel["binary"])
        subprocess.run([ptxas, "-arch=" + kernel["target"], src, "-o",
                        src + ".cubin"], check=True)
        print("assembled", kernel["name"], kernel["target"])
