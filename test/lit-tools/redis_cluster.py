#!/usr/bin/env python3
"""A Redis Cluster of masters without replicas, on loopback, for tests.

    redis_cluster.py [--masters N] COMMAND ARGS...

Starts N masters (default 3) on free loopback ports, with
cluster-require-full-coverage off (the nodes serve their slots while another
master is down, as a cluster without replicas is run), joins them, replaces
"{nodes}" in the arguments with "127.0.0.1:PORT,..." and "{pid0}".."{pidN}"
with each master's PID, runs the command, stops the masters by the PIDs it
started, and exits with the command's status (77 without redis-server).

`RedisCluster` is the same as a context manager, for pytest.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from types import TracebackType


class RedisCluster:
    """Masters without replicas, started on enter and stopped on exit."""

    def __init__(self, masters: int = 3) -> None:
        self.masters = masters
        self.ports: list[int] = []
        self.servers: list[subprocess.Popen[bytes]] = []
        self.directory = ""

    @staticmethod
    def available() -> bool:
        return all(shutil.which(tool) for tool in ("redis-server", "redis-cli"))

    @property
    def nodes(self) -> str:
        """The masters as a redis-cluster:// URL names them."""
        return ",".join(f"127.0.0.1:{port}" for port in self.ports)

    def pid(self, master: int) -> int:
        return self.servers[master].pid

    def kill(self, master: int) -> None:
        """Kills a master (SIGKILL) and reaps it."""
        self.servers[master].send_signal(signal.SIGKILL)
        self.servers[master].wait()

    def __enter__(self) -> RedisCluster:
        self.directory = tempfile.mkdtemp(prefix="kvc-redis-cluster-")
        try:
            self._start()
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None,
                 value: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._stop()

    def _start(self) -> None:
        while len(self.ports) < self.masters:
            port = self._free_port()
            if port not in self.ports:
                self.ports.append(port)
        for port in self.ports:
            self.servers.append(subprocess.Popen(
                ["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                 "--cluster-enabled", "yes", "--cluster-config-file",
                 os.path.join(self.directory, f"nodes-{port}.conf"),
                 "--cluster-node-timeout", "1000",
                 "--cluster-require-full-coverage", "no",
                 "--save", "", "--appendonly", "no", "--dir", self.directory,
                 "--loglevel", "warning"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for port in self.ports:
            self._wait(lambda: self._cli(port, "PING") == "PONG")
        subprocess.run(
            ["redis-cli", "--cluster", "create",
             *(f"127.0.0.1:{port}" for port in self.ports),
             "--cluster-replicas", "0", "--cluster-yes"],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for port in self.ports:
            self._wait(lambda: "cluster_state:ok"
                       in self._cli(port, "CLUSTER", "INFO"))

    def _stop(self) -> None:
        for server in self.servers:
            if server.poll() is None:
                server.kill()
                server.wait()
        if self.directory:
            shutil.rmtree(self.directory, ignore_errors=True)

    @staticmethod
    def _free_port() -> int:
        """A loopback port free now whose cluster bus port (10000 above it,
        which a node binds too) is free as well."""
        while True:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
            if port + 10000 > 65535:
                continue
            try:
                with socket.socket() as bus:
                    bus.bind(("127.0.0.1", port + 10000))
                return port
            except OSError:
                continue

    @staticmethod
    def _cli(port: int, *args: str) -> str:
        done = subprocess.run(["redis-cli", "-p", str(port), *args],
                              capture_output=True, text=True, timeout=10)
        return done.stdout.strip()

    @staticmethod
    def _wait(ready: object, seconds: float = 30) -> None:
        deadline = time.monotonic() + seconds
        while not ready():  # type: ignore[operator]
            if time.monotonic() > deadline:
                raise TimeoutError("redis cluster: not ready in time")
            time.sleep(0.05)


def main() -> int:
    if not RedisCluster.available():
        print("redis_cluster: redis-server is not installed; skipped")
        return 77
    args = sys.argv[1:]
    masters = 3
    if args[:1] == ["--masters"]:
        masters, args = int(args[1]), args[2:]
    with RedisCluster(masters) as cluster:
        def fill(arg: str) -> str:
            arg = arg.replace("{nodes}", cluster.nodes)
            for m in range(masters):
                arg = arg.replace(f"{{pid{m}}}", str(cluster.pid(m)))
            return arg
        return subprocess.call([fill(a) for a in args])


if __name__ == "__main__":
    sys.exit(main())
