"""The ssh command lines an SSH worker needs and the Python scripts run on its host (pure: no I/O).

The sidecar runs the user's ``ssh`` (``XPUFLEET_SSH``, default ``ssh``) with ``BatchMode=yes`` (it never
prompts: a key that needs a passphrase needs an ssh-agent, an unknown host key must be accepted once by
the user; host-key checking is never turned off), plus ``-F $XPUFLEET_SSH_CONFIG`` when set, and the
worker's ``--port`` / ``--identity``.

On the host everything lives in the worker's folder ``DIR`` (default ``~/.xpufleet-ssh/<name>``)::

    DIR/.xpufleet-ssh-worker   marker: the worker's name (remove deletes DIR only when it is there)
    DIR/BUILD                  the build id of the copy in DIR/pkg (a mismatch updates it)
    DIR/pkg/xpufleet/...       the package, run with PYTHONPATH=DIR/pkg by the host's python
    DIR/bin/xpufleet           a launcher for the copy (handy when logged in there)
    DIR/home/                  the agent's XPUFLEET_HOME (credential, state, runs, recorded outputs)
    DIR/agent.sock             the tunnel's end on the host (a Unix socket, owner only), DIR/agent.log

Each script is passed with ``python -c`` and its data (the bundle, the credential) on stdin, so nothing
secret is ever on a command line. Every value on the remote command line is ``shlex.quote``d (one
argument each, nothing expanded by the remote shell), and the launcher the host script writes quotes
the folder and the python the same way (docs/export.md).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

MARKER = ".xpufleet-ssh-worker"
SOCKET = "agent.sock"
DEFAULT_REMOTE_DIR = ".xpufleet-ssh/{name}"  # relative to the remote home
REQUIRED_MODULES = ("aiohttp", "torch", "safetensors", "psutil", "yaml", "numpy")
_TARGET_RE = re.compile(r"^(?:[A-Za-z0-9._][A-Za-z0-9._-]*@)?[A-Za-z0-9._:\[\]-]+$")


class SshConfigError(ValueError):
    """An SSH worker's settings that cannot be used (the text says what to fix)."""


@dataclass(frozen=True)
class SshTarget:
    """How to reach one SSH worker's host."""

    target: str  # user@host, host, or a Host alias of the ssh config
    port: int | None = None
    identity: str | None = None
    python: str = "python3"
    remote_dir: str = ""


def check_target(target: str) -> str:
    """``user@host`` as given, or SshConfigError (never an option: a leading ``-`` is refused)."""
    target = str(target or "").strip()
    if not target or target.startswith("-") or not _TARGET_RE.match(target):
        raise SshConfigError(f"invalid ssh target {target!r}: write user@host, host, or a Host of your ssh config")
    return target


def check_remote_dir(path: str) -> str:
    """The worker's folder on the host: relative to the remote home, or absolute; never the home or /."""
    path = str(path or "").strip()
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if not parts or ".." in parts or path in ("~", "~/") or ":" in path or not path.isprintable():
        raise SshConfigError(f"invalid --remote-dir {path!r}: a folder of its own, e.g. .xpufleet-ssh/gpu-box "
                             f"(no '..', no ':' (ssh's -R would split there), no control characters; not the "
                             f"home folder or /)")
    return path


def forward_spec(remote_dir_abs: str, local: str) -> str:
    """The ``-R`` value tunnelling ``REMOTE_DIR/agent.sock`` to ``local``. The folder is what the host
    reported: one with ``:`` (where ssh splits the value), a control character or no leading ``/``
    could point the tunnel elsewhere, so it is refused (SshConfigError)."""
    if not remote_dir_abs.startswith("/") or ":" in remote_dir_abs or not remote_dir_abs.isprintable():
        raise SshConfigError(f"the host reported the folder {remote_dir_abs!r}, which an ssh tunnel cannot name "
                             f"(it must be absolute, without ':' or control characters): choose another --remote-dir")
    return f"{remote_dir_abs}/{SOCKET}:{local}"


def check_python(python: str) -> str:
    python = str(python or "").strip()
    if not python or python.startswith("-") or any(c.isspace() for c in python):
        raise SshConfigError(f"invalid --python {python!r}: the host's Python executable, e.g. python3 or "
                             f"/opt/conda/bin/python")
    return python


def ssh_argv(ssh: str, t: SshTarget, config: str | None, remote: Sequence[str], *, forward: str | None = None,
             keepalive_s: int = 15) -> list[str]:
    """The ssh command line that runs ``remote`` (quoted for the remote shell) on the host.

    ``forward``: ``"REMOTE_SOCKET:LOCAL_SOCKET_OR_HOST:PORT"`` for ``-R`` (the agent's tunnel); with it,
    ssh exits when the forwarding cannot be set up instead of running without it."""
    argv = [ssh, "-o", "BatchMode=yes", "-o", f"ServerAliveInterval={keepalive_s}", "-o", "ServerAliveCountMax=3",
            "-o", "ConnectTimeout=20"]
    if config:
        argv += ["-F", config]
    if t.port:
        argv += ["-p", str(t.port)]
    if t.identity:
        argv += ["-i", t.identity, "-o", "IdentitiesOnly=yes"]
    if forward:
        argv += ["-o", "ExitOnForwardFailure=yes", "-R", forward]
    return [*argv, "--", t.target, " ".join(shlex.quote(part) for part in remote)]


def script_command(t: SshTarget, script: str, *args: str) -> list[str]:
    """``python -c SCRIPT ARGS`` on the host (what :func:`ssh_argv` quotes)."""
    return [t.python, "-c", script, *args]


def ssh_failure(returncode: int, stderr: str) -> str:
    """What an ssh failure means for the user (its last line, and a hint for the usual causes)."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip() and not ln.startswith("Warning: Permanently")]
    last = lines[-1] if lines else f"ssh exited with code {returncode}"
    hint = ""
    if "Host key verification failed" in last or "REMOTE HOST IDENTIFICATION HAS CHANGED" in stderr:
        hint = " (the host's key is not in known_hosts, or changed: connect once with ssh and check it)"
    elif "Permission denied" in last:
        hint = " (no key the host accepts: pass --identity, or load the key into ssh-agent)"
    elif "remote port forwarding failed" in stderr or "forwarding failed" in last:
        hint = " (the host's sshd refused the tunnel: AllowStreamLocalForwarding must not be 'no')"
    return last + hint


# --- the scripts run on the host (stdlib only: xpufleet may not be there yet) ------------------------------

_COMMON = r'''
import json, os, signal, sys, time
D = os.path.abspath(os.path.expanduser(sys.argv[1]))
NAME = sys.argv[2]
MARKER = os.path.join(D, ".xpufleet-ssh-worker")
def ours():
    try:
        with open(MARKER) as f:
            return f.read().strip() == NAME
    except OSError:
        return False
def agent_pid():
    try:
        pid = int(open(os.path.join(D, "agent.pid")).read().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            if b"xpufleet" not in f.read():
                return None
    except OSError:
        pass
    return pid
def stop_agent(wait=60.0):
    pid = agent_pid()
    if pid is None:
        return None
    os.kill(pid, signal.SIGTERM)
    end = time.time() + wait
    while time.time() < end and agent_pid() == pid:
        time.sleep(0.1)
    if agent_pid() == pid:
        os.kill(pid, signal.SIGKILL)
    return pid
'''

PROBE = _COMMON + r'''
import importlib.util
out = {"dir": D, "python": sys.version.split()[0], "python_ok": sys.version_info >= (3, 10),
       "exists": os.path.isdir(D), "ours": ours()}
out["foreign"] = out["exists"] and not out["ours"] and bool(os.listdir(D))
try:
    out["build"] = open(os.path.join(D, "BUILD")).read().strip() if out["ours"] else None
except OSError:
    out["build"] = None
out["missing"] = [m for m in json.loads(sys.argv[3]) if importlib.util.find_spec(m) is None]
out["agent_pid"] = agent_pid() if out["ours"] else None
sock = os.path.join(D, "agent.sock")
if out["ours"] and os.path.exists(sock):
    os.unlink(sock)  # the last tunnel's end: sshd leaves it behind, and would not bind over it
print(json.dumps(out), flush=True)
'''

INSTALL = _COMMON + r'''
import io, shlex, shutil, tarfile
BUILD, PY = sys.argv[3], sys.argv[4]
if os.path.isdir(D) and not ours() and os.listdir(D):
    print(json.dumps({"ok": False, "error": "%s exists and is not this SSH worker's folder" % D}), flush=True)
    sys.exit(3)
os.makedirs(D, mode=0o700, exist_ok=True)
with open(MARKER, "w") as f:
    f.write(NAME + "\n")
stopped = stop_agent()  # the old copy's agent (its runs end interrupted)
data = sys.stdin.buffer.read()
new = os.path.join(D, "pkg.new")
shutil.rmtree(new, ignore_errors=True)
os.makedirs(new)
with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
    for m in tar.getmembers():
        parts = m.name.split("/")
        if not m.isfile() or parts[0] != "xpufleet" or ".." in parts or m.name.startswith("/"):
            raise SystemExit("unexpected member %r in the bundle" % m.name)
        path = os.path.join(new, *parts)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(tar.extractfile(m).read())
shutil.rmtree(os.path.join(D, "pkg"), ignore_errors=True)
os.rename(new, os.path.join(D, "pkg"))
os.makedirs(os.path.join(D, "bin"), exist_ok=True)
launcher = os.path.join(D, "bin", "xpufleet")
with open(launcher, "w") as f:
    f.write('#!/bin/sh\nXPUFLEET_HOME=%s PYTHONPATH=%s exec %s -m xpufleet.server "$@"\n'
            % (shlex.quote(os.path.join(D, "home")), shlex.quote(os.path.join(D, "pkg")), shlex.quote(PY)))
os.chmod(launcher, 0o755)
with open(os.path.join(D, "BUILD"), "w") as f:
    f.write(BUILD + "\n")
print(json.dumps({"ok": True, "dir": D, "stopped_agent": stopped}), flush=True)
'''

START = _COMMON + r'''
import subprocess
cfg = json.loads(sys.stdin.readline())
home = os.path.join(D, "home")
agents = os.path.join(home, "agents")
os.makedirs(agents, mode=0o700, exist_ok=True)
sock = os.path.join(D, "agent.sock")
cred = os.path.join(agents, NAME + ".credential.json")
tmp = cred + ".tmp"
fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
with os.fdopen(fd, "w") as f:
    json.dump({"server": "unix:" + sock, "name": NAME, "credential": cfg["credential"]}, f)
os.replace(tmp, cred)
pid = agent_pid()
if pid is None:
    env = dict(os.environ, PYTHONPATH=os.path.join(D, "pkg"), XPUFLEET_HOME=home, PYTHONUNBUFFERED="1")
    env.update(cfg.get("env") or {})
    with open(os.path.join(D, "agent.log"), "ab") as log:
        p = subprocess.Popen([sys.executable, "-m", "xpufleet.server", "agent", "start", "--foreground",
                              "--name", NAME, "--server", "unix:" + sock] + list(cfg.get("args") or []),
                             stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=D,
                             start_new_session=True)
    pid = p.pid
    with open(os.path.join(D, "agent.pid"), "w") as f:
        f.write(str(pid))
    print("started agent pid %d" % pid, flush=True)
else:
    print("agent running pid %d" % pid, flush=True)
print("ready", flush=True)
sys.stdin.read()  # hold the ssh session, and with it the tunnel, until the sidecar ends it
'''

STOP = _COMMON + r'''
print(json.dumps({"stopped": stop_agent(float(sys.argv[3]))}), flush=True)
'''

CLEANUP = _COMMON + r'''
import shutil
if not os.path.isdir(D):
    print(json.dumps({"removed": False, "dir": D, "detail": "nothing there"}), flush=True)
elif not ours():
    print(json.dumps({"removed": False, "dir": D, "detail": "not this SSH worker's folder (no marker): left alone"}),
          flush=True)
else:
    stopped = stop_agent(float(sys.argv[3]))
    shutil.rmtree(D)
    print(json.dumps({"removed": True, "dir": D, "stopped_agent": stopped}), flush=True)
'''
