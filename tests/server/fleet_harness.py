"""Real processes on loopback for the remote-worker tests (pools, recorded outputs, mounts, TLS, SSH):
``xpufleet start --foreground`` and ``xpufleet agent start --foreground`` as children, a loopback TCP
proxy that can record what crosses it, and a ``fleet`` fixture that stops everything it started (by PID).

Test files use it as ``import fleet_harness as fh`` (tests/server/conftest.py registers it and gives the
``fleet`` fixture: a :class:`Fleet` for the test's temporary folder).
"""

from __future__ import annotations

import copy
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import graph_parts as gp  # registered by tests/conftest.py
import pytest
from processes import stop_process  # registered by tests/conftest.py

from xpufleet.common.client import Client
from xpufleet.common.runtime_file import read_runtime

CLI = [sys.executable, "-m", "xpufleet.server"]
HEARTBEAT_S = "1"

# iris, a small MLP, one epoch, then an Evaluate (an output node): a real run of a few seconds
IRIS: dict[str, Any] = {
    "1": gp.dataset(), "2": gp.loader("1", batch_size=32), "4": gp.mlp("1"), "5": gp.optimizer(), "6": gp.loss(),
    "8": gp.training_loop("4", "2", "5", "6", accumulate_steps=1, grad_clip_norm=0.0, checkpoint_every=0,
                          checkpoint_every_steps=0, seed=0, strategy="single"),
    "9": gp.evaluate("8", "2"),
}


def iris_graph(epochs: int = 1, *, device: str = "auto", **dataset: Any) -> dict[str, Any]:
    """The iris graph (``epochs`` huge = a run that lasts until stopped) training on ``device``; ``dataset``
    replaces the Dataset node's inputs (e.g. ``name="csv", path="datasets:iris.csv"``)."""
    g = copy.deepcopy(IRIS)
    g["8"]["inputs"].update(epochs=epochs, device=device)
    g["1"]["inputs"].update(dataset)
    return g


class LineWatcher(threading.Thread):
    """Reads a process's output lines (so its pipe never fills) and lets a test wait for one."""

    def __init__(self, stream: Any, log_path: Path) -> None:
        super().__init__(daemon=True)
        self.stream = stream
        self.lines: list[str] = []
        self.cond = threading.Condition()
        self.log = open(log_path, "a")  # noqa: SIM115 - closed at EOF

    def run(self) -> None:
        for raw in self.stream:
            line = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
            self.log.write(line)
            self.log.flush()
            with self.cond:
                self.lines.append(line)
                self.cond.notify_all()
        self.log.close()
        with self.cond:
            self.lines.append("<EOF>")
            self.cond.notify_all()

    def wait_for(self, text: str, start: int = 0, timeout: float = 90.0) -> int:
        """Index of the first line at or after ``start`` containing ``text``."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for i in range(start, len(self.lines)):
                    if text in self.lines[i]:
                        return i
                    if self.lines[i] == "<EOF>":
                        raise AssertionError(f"process ended before {text!r}:\n{''.join(self.lines[-30:])}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {text!r} within {timeout} s:\n{''.join(self.lines[-30:])}")
                self.cond.wait(left)

    def text(self) -> str:
        with self.cond:
            return "".join(self.lines)

    def count(self, text: str) -> int:
        with self.cond:
            return sum(1 for line in self.lines if text in line)


def base_env(home: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"XPUFLEET_HOME": str(home), "XPUFLEET_HEARTBEAT_INTERVAL_S": HEARTBEAT_S,
                "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    for var in ("XPUFLEET_RUN_QUEUE_MAX_CONCURRENT", "CUDA_VISIBLE_DEVICES"):
        env.pop(var, None)
    env.update(extra)
    return env


class SidecarProc:
    """``xpufleet start --foreground --port 0 [ARGS]`` as a child; its URL from the ready pipe."""

    def __init__(self, home: Path, env: dict[str, str], *args: str) -> None:
        self.home = home
        self.env = env
        self.args = args
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.token = ""
        self.fingerprint: str | None = None
        self.start()

    def start(self) -> None:
        read_fd, write_fd = os.pipe()
        with open(self.home / "test-sidecar.log", "ab") as log:
            self.proc = subprocess.Popen(
                [*CLI, "start", "--foreground", "--port", "0", "--ready-fd", str(write_fd), *self.args],
                env=self.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, pass_fds=(write_fd,),
            )
        os.close(write_fd)
        ready, _, _ = select.select([read_fd], [], [], 90)
        line = os.read(read_fd, 4096).decode().strip() if ready else ""
        os.close(read_fd)
        assert line.startswith("http"), f"sidecar did not start: {line!r}\n{(self.home / 'test-sidecar.log').read_text()}"
        self.url = line
        runtime = read_runtime(self.home)
        assert runtime is not None, f"no runtime file under {self.home}"
        self.token = runtime["token"]
        self.fingerprint = runtime.get("tls_fingerprint")

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)

    def kill9(self) -> None:
        """SIGKILL the sidecar (its state stays in the home, as after a crash; :meth:`start` takes over)."""
        assert self.proc is not None
        kill9(self.proc.pid)
        self.proc.wait(timeout=10)

    @property
    def client(self) -> Client:
        """The one sidecar client (common/client.py) for this sidecar's current address and token."""
        return Client(self.url, self.token, timeout=60, fingerprint=self.fingerprint)

    def call(self, method: str, path: str, body: Any = None, raw: bool = False) -> tuple[int, Any]:
        """``(status, answer)`` through :attr:`client`."""
        return self.client.call(method, path, body, raw=raw)

    def ok(self, method: str, path: str, body: Any = None, status: int = 200) -> Any:
        code, out = self.call(method, path, body)
        assert code == status, (code, out)
        return out

    def submit(self, graph: dict[str, Any], **options: Any) -> str:
        return self.ok("POST", "/api/runs", {"graph": graph, "options": options}, 201)["run_id"]

    def run(self, run_id: str) -> dict[str, Any]:
        return self.ok("GET", f"/api/runs/{run_id}")

    def events(self, run_id: str) -> list[dict[str, Any]]:
        return self.ok("GET", f"/api/runs/{run_id}/events?limit=1000")["events"]

    def wait_run(self, run_id: str, statuses: set[str], timeout: float = 180.0) -> dict[str, Any]:
        """Long-poll the run's events until its status is one of ``statuses``."""
        deadline = time.monotonic() + timeout
        cursor = 0
        while time.monotonic() < deadline:
            body = self.ok("GET", f"/api/runs/{run_id}/events?cursor={cursor}&wait=5")
            cursor = body["cursor"]
            if body["status"] in statuses:
                return self.run(run_id)
        raise AssertionError(f"run {run_id} is {self.run(run_id)['status']}, not {statuses}, after {timeout} s")

    def wait_reason(self, run_id: str, text: str, timeout: float = 60.0) -> dict[str, Any]:
        """The queued run once its waiting_reason contains ``text`` (bounded poll: no push channel)."""
        deadline = time.monotonic() + timeout
        run: dict[str, Any] = {}
        while time.monotonic() < deadline:
            run = self.run(run_id)
            if run["status"] == "queued" and text in (run.get("waiting_reason") or ""):
                return run
            time.sleep(0.2)
        raise AssertionError(f"run {run_id} never waited with {text!r}: {run}")

    def worker(self, name: str) -> dict[str, Any]:
        return self.ok("GET", f"/api/workers/{name}")

    def wait_worker(self, name: str, status: str, timeout: float = 60.0, field: str = "status") -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        w: Any = None
        while time.monotonic() < deadline:
            code, w = self.call("GET", f"/api/workers/{name}")
            if code == 200 and w[field] == status:
                return w
            time.sleep(0.2)  # worker status has no push channel; bounded poll
        raise AssertionError(f"worker {name} not {field}={status} after {timeout} s: {w}")

    def rejected(self) -> list[dict[str, Any]]:
        return self.ok("GET", "/api/workers/rejected")["rejected"]


class AgentProc:
    """``xpufleet agent start --foreground ARGS`` as a child (output watched)."""

    def __init__(self, home: Path, env: dict[str, str], *args: str, label: str = "agent") -> None:
        self.proc = subprocess.Popen([*CLI, "agent", "start", "--foreground", *args], env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.out = LineWatcher(self.proc.stdout, home / f"test-{label}-{self.proc.pid}.log")
        self.out.start()

    def wait_connected(self, start: int = 0, timeout: float = 90.0) -> int:
        return self.out.wait_for("connected to", start, timeout)

    def wait_exit(self, timeout: float = 120.0) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        stop_process(self.proc)


def websocket_plaintext(stream: bytes) -> bytes:
    """What one direction of a plain HTTP WebSocket connection says: the HTTP head and every frame's
    payload, unmasked (a client masks its frames, so its bytes never show literally on the wire). b''
    for a stream that is not plain HTTP (TLS records)."""
    end = stream.find(b"\r\n\r\n")
    if end < 0 or not stream.startswith((b"GET ", b"HTTP/")):
        return b""
    out = bytearray(stream[:end])
    i = end + 4
    while i + 2 <= len(stream):
        masked, n = stream[i + 1] & 0x80, stream[i + 1] & 0x7F
        i += 2
        if n == 126:
            n, i = int.from_bytes(stream[i:i + 2], "big"), i + 2
        elif n == 127:
            n, i = int.from_bytes(stream[i:i + 8], "big"), i + 8
        key = stream[i:i + 4] if masked else b""
        i += len(key)
        payload = stream[i:i + n]
        i += n
        out += bytes(b ^ key[j % 4] for j, b in enumerate(payload)) if key else payload
    return bytes(out)


class Proxy:
    """A loopback TCP proxy; it records every byte that crosses it (each direction of each connection), and
    a test can cut it (every connection closed, new ones refused) and restore it."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.blocked = False
        self.streams: list[bytearray] = []
        self.lock = threading.Lock()
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def captured(self) -> bytes:
        with self.lock:
            return b"".join(bytes(s) for s in self.streams)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.blocked:
                client.close()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()
                continue
            with self.lock:
                self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                buf = bytearray()
                with self.lock:
                    self.streams.append(buf)
                threading.Thread(target=self._pump, args=(a, b, buf), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, buf: bytearray) -> None:
        try:
            while data := src.recv(65536):
                with self.lock:
                    buf += data
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def seen(self, secret: str) -> bool:
        """Whether ``secret`` crossed in clear: in the raw bytes, or in a plain WebSocket's frames."""
        with self.lock:
            streams = [bytes(s) for s in self.streams]
        needle = secret.encode()
        return any(needle in s or needle in websocket_plaintext(s) for s in streams)

    def cut(self) -> None:
        """Close every connection and refuse new ones until :meth:`restore`."""
        self.blocked = True
        with self.lock:
            conns, self.conns = self.conns, []
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def restore(self) -> None:
        self.blocked = False

    def close(self) -> None:
        self.listener.close()
        self.cut()


class Fleet:
    """What a test starts; everything is stopped at the end (agents first, by PID)."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.home = tmp_path / "home"
        self.started: list[Any] = []

    def env(self, home: Path | None = None, **extra: str) -> dict[str, str]:
        return base_env(home or self.home, **extra)

    def sidecar(self, *args: str, **extra: str) -> SidecarProc:
        self.home.mkdir(exist_ok=True)
        sc = SidecarProc(self.home, self.env(**extra), *args)
        self.started.append(sc)
        return sc

    def agent(self, *args: str, home: Path | None = None, env: dict[str, str] | None = None,
              label: str = "agent") -> AgentProc:
        a = AgentProc(home or self.home, env or self.env(home), *args, label=label)
        self.started.append(a)
        return a

    def proxy(self, port: int) -> Proxy:
        p = Proxy(port)
        self.started.append(p)
        return p

    def sshd(self) -> SshServer:
        s = SshServer(self.tmp / "sshd")
        self.started.append(s)
        return s

    def cli(self, *args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([*CLI, *args], env=env or self.env(), capture_output=True, text=True, timeout=timeout)

    def close(self) -> None:
        for thing in reversed(self.started):
            if isinstance(thing, AgentProc):
                thing.stop()
        for thing in reversed(self.started):
            if isinstance(thing, SidecarProc):
                thing.stop()
            elif isinstance(thing, Proxy):
                thing.close()
            elif hasattr(thing, "close") and not isinstance(thing, AgentProc):
                thing.close()


def kill9(pid: int) -> None:
    """SIGKILL one process this test started (by its PID)."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SshServer:
    """A real OpenSSH server (Debian's ``/usr/sbin/sshd``) on 127.0.0.1 for one test: a throw-away host key
    and user key, its own sshd_config (no PAM, keys only, this test's authorized_keys), never the system's
    sshd or port 22; stopped by its PID. ``ssh_config`` is a client config file that knows the host key
    (``StrictHostKeyChecking yes``: nothing is accepted blindly); the sidecar gets it through
    ``XPUFLEET_SSH_CONFIG``."""

    SSHD = "/usr/sbin/sshd"

    def __init__(self, folder: Path) -> None:
        import shutil

        if not Path(self.SSHD).is_file() or shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
            pytest.skip("OpenSSH (openssh-server, openssh-client) is not installed: apt-get install -y "
                        "openssh-server openssh-client")
        if not Path("/run/sshd").is_dir():  # sshd's privilege-separation folder (the package's service makes it)
            try:
                Path("/run/sshd").mkdir(mode=0o755, parents=True)
            except OSError as exc:
                pytest.skip(f"sshd needs /run/sshd and it cannot be made here: {exc}")
        self.dir = folder
        folder.mkdir(parents=True, exist_ok=True)
        for key in ("host_key", "user_key"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(folder / key)], check=True)
        auth = folder / "authorized_keys"
        auth.write_text((folder / "user_key.pub").read_text())
        auth.chmod(0o600)
        self.port = free_port()
        self.user = os.environ.get("USER") or __import__("getpass").getuser()
        (folder / "sshd_config").write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {folder / 'host_key'}\n"
            f"AuthorizedKeysFile {auth}\nPidFile {folder / 'sshd.pid'}\nStrictModes no\nUsePAM no\n"
            f"PasswordAuthentication no\nKbdInteractiveAuthentication no\nPubkeyAuthentication yes\n"
            f"PermitRootLogin prohibit-password\nAllowStreamLocalForwarding yes\nLogLevel VERBOSE\n")
        host_key = (folder / "host_key.pub").read_text().split()
        (folder / "known_hosts").write_text(f"[127.0.0.1]:{self.port} {host_key[0]} {host_key[1]}\n")
        self.ssh_config = folder / "ssh_config"
        self.ssh_config.write_text(
            f"Host 127.0.0.1\n  UserKnownHostsFile {folder / 'known_hosts'}\n  StrictHostKeyChecking yes\n"
            f"  GlobalKnownHostsFile /dev/null\n")
        self.log = open(folder / "sshd.log", "ab")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen([self.SSHD, "-D", "-e", "-f", str(folder / "sshd_config")],
                                     stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"sshd exited: {(folder / 'sshd.log').read_text()}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    break
            time.sleep(0.05)  # sshd has no ready signal in -D mode: bounded poll of its port
        else:
            raise AssertionError("sshd did not listen")

    @property
    def target(self) -> str:
        return f"{self.user}@127.0.0.1"

    def ssh(self, command: str) -> subprocess.CompletedProcess:
        """Run a command on the "host" the way the sidecar does (the test's keys and config)."""
        return subprocess.run(["ssh", "-F", str(self.ssh_config), "-o", "BatchMode=yes", "-p", str(self.port),
                               "-i", str(self.dir / "user_key"), "-o", "IdentitiesOnly=yes", self.target, command],
                              capture_output=True, text=True, timeout=60)

    def close(self) -> None:
        stop_process(self.proc, grace_s=20)
        self.log.close()
