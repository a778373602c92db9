#!/usr/bin/env python3
"""Checks that the runtime's headers include only layers below their own.

Usage: check-layers.py INCLUDE_DIR

The runtime's folders (include/kvc/Runtime/<folder>) are layers: a header
may include its own folder's headers and those of lower layers, never a
higher one's (a Device knows nothing of the models that run on it, the
executor nothing of the saves and transfers built on it). Prints each
violation and a summary line.
"""

import pathlib
import re
import sys

# Rank of each folder: a header may include ranks up to its own.
RANKS = {
    "Base": 0,
    "Desc": 1,
    "Codec": 2,
    "Device": 2,
    "Model": 3,
    "Store": 3,
    "Cuda": 3,
    "Exec": 4,
    "Save": 5,
    "Net": 6,
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"kvc/Runtime/([A-Za-z]+)/')


def main() -> int:
    root = pathlib.Path(sys.argv[1]) / "kvc" / "Runtime"
    checked = 0
    violations = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        if folder.name not in RANKS:
            violations.append(f"{folder.name}: a folder with no layer")
            continue
        for header in sorted(folder.glob("*.h")):
            checked += 1
            for number, line in enumerate(header.read_text().splitlines(), 1):
                match = INCLUDE.match(line)
                if not match:
                    continue
                included = match.group(1)
                if included == folder.name:
                    continue
                if RANKS.get(included, 99) >= RANKS[folder.name]:
                    violations.append(
                        f"{folder.name}/{header.name}:{number}: includes "
                        f"{included}, a layer not below {folder.name}")
    for violation in violations:
        print(violation)
    print(f"{checked} headers checked, {len(violations)} violations")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
