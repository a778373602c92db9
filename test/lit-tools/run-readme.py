#!/usr/bin/env python3
"""Runs every command of the README's ```sh blocks in order, as a newcomer
would on a fresh build: `build/bin/` is the build's tools, `/tmp/` a scratch
directory, the working directory the source tree. `make` lines (which
install packages and build) are left out: the test runs inside that build.

  run-readme.py README.md BUILD_DIR SCRATCH_DIR
"""
import os
import re
import subprocess
import sys


def commands(readme):
    text = open(readme).read()
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        for command in block.replace("\\\n", " ").splitlines():
            command = command.split("  #")[0].strip()
            if command and not command.startswith("make "):
                yield " ".join(command.split())


def main():
    readme, build, scratch = map(os.path.abspath, sys.argv[1:4])
    source = os.path.dirname(readme)
    os.makedirs(scratch, exist_ok=True)
    ran = failed = 0
    for command in commands(readme):
        # Only paths as the README writes them: a word starting there (the
        # build or scratch directory may itself lie under /tmp).
        run = command.replace("file:///tmp/", "file://" + scratch + "/")
        run = re.sub(r"(?<![\w/.-])/tmp/", scratch + "/", run)
        run = re.sub(r"(?<![\w/.-])build/bin/", build + "/bin/", run)
        result = subprocess.run(["bash", "-c", run], cwd=source,
                                capture_output=True, text=True)
        ran += 1
        if result.returncode:
            failed += 1
            print(f"FAILED ({result.returncode}): {command}")
            print(result.stdout[-2000:] + result.stderr[-2000:])
        else:
            print(f"ok: {command}")
    print(f"{ran} commands, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
