#!/usr/bin/env python3
"""Interrupts a save once its first object is in the store, and says what is left.

  interrupt-save.py STORE_DIR COMMAND [ARGS...]

Starts COMMAND, waits until STORE_DIR holds an object (a regular file outside
its .tmp/ directory of objects being written), sends it SIGINT, waits for it
and prints its exit code, the last line of its standard error, and how many
objects and temporaries the store still holds.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path


def files(store: Path) -> tuple[int, int]:
    """(objects, temporaries) under `store`."""
    objects = temporaries = 0
    if store.is_dir():
        for path in store.rglob("*"):
            if path.is_file():
                top = path.relative_to(store).parts[0]
                if top == ".tmp" or ".tmp." in path.name:
                    temporaries += 1
                elif top != "layouts":  # The store's layout records.
                    objects += 1
    return objects, temporaries


def main(argv: list[str]) -> int:
    store, command = Path(argv[1]), argv[2:]
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True)
    deadline = time.monotonic() + 60
    while files(store)[0] == 0:
        if child.poll() is not None:
            print(f"the save ended ({child.returncode}) before it wrote an object")
            return 1
        if time.monotonic() > deadline:
            child.kill()
            print("no object appeared within 60 s")
            return 1
        time.sleep(0.005)
    child.send_signal(signal.SIGINT)
    try:
        _, stderr = child.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        child.kill()
        print("the save did not end within 60 s of SIGINT")
        return 1
    lines = [line for line in stderr.splitlines() if line.strip()]
    print(f"exit code {child.returncode}")
    print(lines[-1] if lines else "(no error)")
    objects, temporaries = files(store)
    print(f"objects left: {objects}, temporaries left: {temporaries}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
