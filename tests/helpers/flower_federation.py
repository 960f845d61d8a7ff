"""A real Flower federation on 127.0.0.1 for integration tests: TLS, SuperNode authentication, cleanup.

Starts ``flower-superlink`` with TLS and ``--enable-supernode-auth``, registers one key pair per
SuperNode with ``flwr supernode register``, starts the ``flower-supernode`` processes and submits runs
with ``flwr run``. Every process is started in its own session, and :meth:`LocalFederation.stop`
kills each session and every descendant (Flower's own helper processes start their own sessions), so
nothing outlives the test, also when it fails.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

BIN = Path(sys.executable).parent
CONNECTION = "fedskew-test"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    path.chmod(0o600)


def make_tls(folder: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for ``127.0.0.1``/``localhost`` signed by it: (ca, cert, key)."""
    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedskew test CA")])
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = folder / "ca.crt", folder / "server.pem", folder / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key, paths[2])
    return paths


def make_node_keys(folder: Path, name: str) -> tuple[Path, Path]:
    """A SuperNode's authentication key pair (P-384, OpenSSH format): (private, public)."""
    folder.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    private, public = folder / name, folder / f"{name}.pub"
    private.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption())
    )
    private.chmod(0o600)
    public_key = key.public_key()
    public.write_bytes(public_key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH))
    return private, public


def descendants(pid: int) -> list[int]:
    """All live descendants of ``pid`` (read from /proc; Flower's helpers start new sessions)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


class LocalFederation:
    """A SuperLink and SuperNodes on 127.0.0.1, with TLS and SuperNode authentication.

    Parameters
    ----------
    root
        Folder for certificates, keys, logs and ``FLWR_HOME``.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.logs = root / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.ca, self.cert, self.key = make_tls(root / "tls")
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "FLWR_HOME": str(root / "flwr-home"),
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.2",  # start apps promptly (default 1 s)
            "PYTHONUNBUFFERED": "1",
            "FLWR_TELEMETRY_ENABLED": "0",
        }
        home = root / "flwr-home"
        home.mkdir(parents=True, exist_ok=True)
        (home / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
            f'address = "{self.address}"\nroot-certificates = "{self.ca}"\n'
        )
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    # ---- processes -------------------------------------------------------------------------------
    def _start(self, name: str, cmd: list[str]) -> subprocess.Popen[bytes]:
        with open(self.logs / f"{name}.log", "ab") as log:
            p = subprocess.Popen(
                cmd, env=self.env, cwd=self.root, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.procs[name] = p
        return p

    def start_superlink(self) -> None:
        self._start("superlink", [
            str(BIN / "flower-superlink"), "--ssl-ca-certfile", str(self.ca), "--ssl-certfile", str(self.cert),
            "--ssl-keyfile", str(self.key), "--enable-supernode-auth", "--disable-runtime-dependency-installation",
            "--host", "127.0.0.1", "--port", str(self.port),
        ])
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                if self.procs["superlink"].poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"flower-superlink did not start:\n{self.log('superlink')}") from None
                time.sleep(0.2)

    def flwr(self, *args: str, timeout: float = 120) -> dict[str, object]:
        """Run ``flwr ARGS --format json`` against this SuperLink and return its JSON answer."""
        res = subprocess.run(
            [str(BIN / "flwr"), *args, "--format", "json"], env=self.env, cwd=self.root, capture_output=True,
            text=True, timeout=timeout, check=False,
        )
        try:
            out: dict[str, object] = json.loads(res.stdout)
        except json.JSONDecodeError:
            raise RuntimeError(f"flwr {' '.join(args)} failed:\n{res.stdout}\n{res.stderr}") from None
        if res.returncode != 0 or not out.get("success", False):
            raise RuntimeError(f"flwr {' '.join(args)} failed:\n{res.stdout}\n{res.stderr}")
        return out

    def start_supernodes(self, node_configs: dict[str, Mapping[str, int | str]]) -> None:
        """Register a fresh key pair per SuperNode (concurrently: each ``flwr`` call takes seconds), start them.

        ``node_configs`` maps a process name to that node's ``--node-config`` settings.
        """
        keys = {name: make_node_keys(self.root / "keys", name) for name in node_configs}
        registrations = [
            subprocess.Popen(
                [str(BIN / "flwr"), "supernode", "register", str(public), CONNECTION], env=self.env, cwd=self.root,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            )
            for _, public in keys.values()
        ]
        for reg in registrations:
            out, _ = reg.communicate(timeout=120)
            if reg.returncode != 0:
                raise RuntimeError(f"flwr supernode register failed:\n{out.decode(errors='replace')}")
        for name, node_config in node_configs.items():
            config = " ".join(f"{k}={json.dumps(v)}" for k, v in node_config.items())
            self._start(name, [
                str(BIN / "flower-supernode"), "--root-certificates", str(self.ca), "--superlink", self.address,
                "--auth-supernode-private-key", str(keys[name][0]), "--node-config", config,
                "--host", "127.0.0.1", "--port", str(free_port()), "--max-retries", "0",
            ])

    def wait_for_log(self, name: str, text: str, count: int, timeout: float) -> None:
        """Until ``text`` has appeared ``count`` times in the log of process ``name`` (bounded)."""
        deadline = time.monotonic() + timeout
        while self.log_text(name).count(text) < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{text!r} did not appear {count} times in the log of {name} within {timeout} s")
            time.sleep(0.1)

    def _signal(self, names: list[str], sig: signal.Signals) -> list[int]:
        """Send ``sig`` to the named processes and all their descendants; return the pids signalled."""
        victims = []
        for name in names:
            pid = self.procs[name].pid
            victims += [pid, *descendants(pid)]  # collected first: killing a parent orphans its children
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        return victims

    def kill(self, name: str, sig: signal.Signals) -> None:
        """Send ``sig`` to a process and its descendants, and reap it (SIGKILL after 10 s)."""
        victims = self._signal([name], sig)
        p = self.procs.pop(name)
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            for pid in victims:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            p.wait(timeout=10)

    def stop(self) -> None:
        """Stop every process this federation started, and all their descendants (SIGTERM, then SIGKILL)."""
        victims = self._signal(list(self.procs), signal.SIGTERM)
        deadline = time.monotonic() + 5
        for p in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(deadline - time.monotonic(), 0.1))
        for pid in [*victims, *(d for v in victims for d in descendants(v))]:  # and any spawned meanwhile
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for p in self.procs.values():
            p.wait(timeout=10)
        self.procs.clear()

    def run_log(self, run_id: str) -> str:
        """What the run's ServerApp printed (``flwr log``), and the tails of the process logs."""
        res = subprocess.run(
            [str(BIN / "flwr"), "log", run_id, CONNECTION, "--show"], env=self.env, cwd=self.root,
            capture_output=True, text=True, timeout=120, check=False,
        )
        return "\n".join([f"--- flwr log {run_id} ---", res.stdout[-8000:], res.stderr[-2000:],
                          *(self.log(name) for name in self.procs)])

    def log_text(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def log(self, name: str) -> str:
        path = self.logs / f"{name}.log"
        return f"--- {name} ---\n" + (path.read_text(errors="replace")[-4000:] if path.exists() else "(no log)")
