#!/usr/bin/env python3
"""Prints a file's contents once it exists and is not empty (a port a
background process writes), waiting at most TIMEOUT seconds (default 30)."""

import os
import sys
import time

path = sys.argv[1]
timeout = float(sys.argv[2]) if len(sys.argv) > 2 else 30.0
deadline = time.monotonic() + timeout
while not (os.path.exists(path) and os.path.getsize(path) > 0):
    if time.monotonic() > deadline:
        sys.exit(f"wait-for-file: {path} did not appear in {timeout} s")
    time.sleep(0.05)
sys.stdout.write(open(path).read().strip())
