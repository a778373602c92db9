#!/usr/bin/env python3
"""Every diagnostic the kvc dialect's verifiers emit has a negative lit case.

Reads each `emitOpError(...)`/`emitError(...)` statement of the dialect's
sources (lib/Dialect/KVC/IR/*.cpp), takes the first string literal of the
statement (the message's fixed words), and looks for it in the
`expected-error` lines of the lit tests (test/**/*.mlir). Prints the
diagnostics no test expects, with their file and line, and exits 1 if any;
prints the count and exits 0 otherwise.

  check-diagnostics.py SOURCE_ROOT
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

CALL = re.compile(r"\bemit(?:Op)?Error\s*\(")
LITERAL = re.compile(r'"((?:[^"\\]|\\.)*)"')


def diagnostics(source: Path):
    """(line, fixed words) of each diagnostic statement with a literal."""
    text = source.read_text()
    for match in CALL.finditer(text):
        end = text.find(";", match.end())
        statement = text[match.start():end]
        literal = LITERAL.search(statement)
        if not literal:
            continue  # A helper's lambda: its callers carry the words.
        words = literal.group(1).replace('\\"', '"').strip(" '")
        if len(words) < 4:
            continue  # A quote or separator; the rest is computed.
        yield text.count("\n", 0, match.start()) + 1, words


def main(argv: list[str]) -> int:
    root = Path(argv[1])
    expected = []
    for test in (root / "test").rglob("*.mlir"):
        for line in test.read_text().splitlines():
            if "expected-error" in line:
                expected.append(line.split("expected-error", 1)[1])
    missing, total = [], 0
    for source in sorted((root / "lib/Dialect/KVC/IR").glob("*.cpp")):
        for line, words in diagnostics(source):
            total += 1
            if not any(words in text for text in expected):
                missing.append(f"{source.relative_to(root)}:{line}: \"{words}\"")
    for entry in missing:
        print(f"no negative lit case: {entry}")
    if missing:
        return 1
    print(f"every one of {total} diagnostics has a negative lit case")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
