#!/usr/bin/env python3
"""Runs a command beside a redis-server of its own.

    with-redis.py [--password SECRET] COMMAND ARGS...

Starts redis-server on a free loopback port (requiring SECRET when given),
replaces every "{port}" in the arguments with it, runs the command, stops the server by the PID it
started, and exits with the command's status (77 without redis-server).
"""

import shutil
import socket
import subprocess
import sys
import time


def main() -> int:
    if shutil.which("redis-server") is None:
        print("with-redis: redis-server is not installed; skipped")
        return 77
    args = sys.argv[1:]
    password = []
    if args[:1] == ["--password"]:
        password = ["--requirepass", args[1]]
        args = args[2:]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1",
         "--save", "", "--appendonly", "no", "--loglevel", "warning",
         *password],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), 0.1).close()
                break
            except OSError:
                time.sleep(0.05)
        command = [a.replace("{port}", str(port)) for a in args]
        return subprocess.call(command)
    finally:
        server.kill()
        server.wait()


if __name__ == "__main__":
    sys.exit(main())
