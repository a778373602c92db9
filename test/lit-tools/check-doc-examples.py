#!/usr/bin/env python3
"""Checks that every ```mlir example in the given Markdown files or folders
parses, verifies and round-trips through kvc-opt.

usage: check-doc-examples.py KVC_OPT PATH...
"""
import pathlib
import re
import subprocess
import sys

BLOCK = re.compile(r"^```mlir\n(.*?)^```", re.S | re.M)


def run(kvc_opt, text):
    return subprocess.run([kvc_opt, "-"], input=text, capture_output=True,
                          text=True)


def main():
    kvc_opt, paths = sys.argv[1], sys.argv[2:]
    files = []
    for path in map(pathlib.Path, paths):
        files += sorted(path.rglob("*.md")) if path.is_dir() else [path]
    count, failures = 0, 0
    for md in files:
        text = md.read_text()
        for match in BLOCK.finditer(text):
            line = text.count("\n", 0, match.start()) + 2
            first = run(kvc_opt, match.group(1))
            second = run(kvc_opt, first.stdout) if first.returncode == 0 else first
            count += 1
            if first.returncode or second.returncode or first.stdout != second.stdout:
                failures += 1
                print(f"{md}:{line}: example does not round-trip\n"
                      f"{first.stderr}{second.stderr}", file=sys.stderr)
    print(f"{count} examples checked, {failures} failed")
    return 1 if failures or count == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
