"""A real two-node Ray cluster on this machine for integration tests: token authentication, cleanup.

Starts a head node (``ray start --head``) and a second node that joins it, each with one CPU and its
own temporary folder, and waits until Ray reports both alive. Ray does not let a multi-node cluster
listen on loopback only (it replaces 127.0.0.1 by the host's address), so the cluster requires a
random token (``RAY_AUTH_MODE=token``) that only this process and its children know.

Every ``ray start`` runs in its own session, and the processes it leaves behind (GCS, raylets, agents,
Ray's worker processes) stay in that session. :meth:`LocalRayCluster.stop` ends exactly those
sessions' processes: ``ray stop`` is not used, because it ends every Ray process of the user on the
machine, another test run's or a user's own cluster included.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

BIN = Path(sys.executable).parent


def free_port() -> int:
    """A TCP port that is free now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def auth_env() -> dict[str, str]:
    """Environment variables that make a Ray cluster, and the drivers that join it, use a fresh token."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": uuid.uuid4().hex}


def session_members(sids: set[int]) -> list[int]:
    """Live processes (zombies left out) whose session id is one of ``sids`` (read from /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[3]) in sids:
            out.append(int(entry.name))
    return out


class LocalRayCluster:
    """A Ray head node and ``nodes - 1`` nodes that join it, each with ``cpus`` CPUs.

    Parameters
    ----------
    env
        The environment of the nodes (with :func:`auth_env` in it; a driver needs the same token).
    """

    def __init__(self, env: dict[str, str], nodes: int = 2, cpus: int = 1) -> None:
        self.env = env
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.folder = Path(tempfile.mkdtemp(prefix="fsray"))  # short: Ray's socket paths must fit in 107 bytes
        self.sessions: set[int] = set()
        self.seconds = 0.0  # how long the start took
        t0 = time.perf_counter()
        try:
            self._start(
                "head", "--head", f"--port={self.port}", f"--ray-client-server-port={free_port()}",
                "--include-dashboard=false", f"--dashboard-port={free_port()}", f"--num-cpus={cpus}",
            )
            for k in range(1, nodes):
                self._start(f"node{k}", f"--address={self.address}", f"--num-cpus={cpus}")
            self._wait_for(nodes)
        except BaseException:
            self.stop()
            raise
        self.seconds = time.perf_counter() - t0

    def _start(self, name: str, *args: str) -> None:
        log = self.folder / f"{name}.log"
        temp = self.folder / name
        cmd = [
            str(BIN / "ray"), "start", *args, f"--temp-dir={temp}", "--disable-usage-stats",
            f"--dashboard-agent-listen-port={free_port()}", f"--dashboard-agent-grpc-port={free_port()}",
        ]
        with open(log, "w") as out:
            # Its own session: the daemons it leaves behind stay in it, so stop() can end exactly them.
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        self.sessions.add(proc.pid)
        try:
            code = proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            code = None
        if code != 0:
            raise RuntimeError(f"`ray start` of {name} failed ({code}):\n{log.read_text()[-3000:]}")

    def _wait_for(self, nodes: int, timeout: float = 60.0) -> None:
        import ray

        ray.init(address=self.address, logging_level="WARNING", log_to_driver=False)
        try:
            deadline = time.monotonic() + timeout
            while sum(n["Alive"] for n in ray.nodes()) < nodes:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the Ray cluster did not get {nodes} alive nodes in {timeout} s")
                time.sleep(0.5)
        finally:
            ray.shutdown()

    def stop(self) -> list[int]:
        """End every process of the cluster's sessions; returns those still alive after it (none, normally)."""
        left = session_members(self.sessions)
        for sig, wait in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 5.0)):
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + wait
            while left and time.monotonic() < deadline:
                time.sleep(0.2)
                left = session_members(self.sessions)
            if not left:
                break
        shutil.rmtree(self.folder, ignore_errors=True)
        return left
