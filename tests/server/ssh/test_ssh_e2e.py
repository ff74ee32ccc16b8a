"""End to end (docs/workers.md): an SSH worker against a real OpenSSH server the test starts on 127.0.0.1 (Debian's
openssh-server, a throw-away host key and user key, its own sshd_config). The sidecar puts its own xpufleet
in the worker's folder on the "host" (replacing an older copy found there), starts the agent, and the
agent's connection comes back through the ssh tunnel (Unix sockets at both ends: no port opens). A run
executes there; ``kill -9`` of the ssh client reconnects while the agent and its run go on; disable stops
the agent (its run ends interrupted) and the worker shows Disabled and takes no run; enable connects it
again; remove ends ssh and deletes the folder. A host whose key is not known is refused, never accepted.
"""

from __future__ import annotations

import os
import signal
import stat
import sys
import time
from pathlib import Path

import fleet_harness as fh
import psutil
import pytest

from xpufleet.server.ssh.bundle import bundle

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

TERMINAL = {"succeeded", "failed", "cancelled", "interrupted"}


def _agent_pid(folder: Path) -> int | None:
    try:
        pid = int((folder / "agent.pid").read_text())
    except (OSError, ValueError):
        return None
    return pid if psutil.pid_exists(pid) else None


@pytest.fixture
def remote_agent_reaper():
    """The agent the sidecar starts on the "host" runs in its own session: end it by its PID if a test
    fails before remove stopped it."""
    folders: list[Path] = []
    yield folders
    for folder in folders:
        pid = _agent_pid(folder)
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
            try:
                psutil.Process(pid).wait(60)
            except psutil.Error:
                pass


def _wait(pred, what: str, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    value = None
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.2)  # another machine's state has no push channel to the test: bounded poll
    raise AssertionError(f"{what} not reached within {timeout} s (last: {value})")


def test_ssh_worker_installs_runs_reconnects_disables_and_is_removed(fleet, tmp_path, remote_agent_reaper):
    sshd = fleet.sshd()
    folder = tmp_path / "host" / "gpu-ssh"
    remote_agent_reaper.append(folder)
    # an older copy of this worker is on the host: the version mismatch updates it
    (folder / "pkg" / "xpufleet").mkdir(parents=True)
    (folder / ".xpufleet-ssh-worker").write_text("gpu-ssh\n")
    (folder / "BUILD").write_text("0.0.1+old\n")
    (folder / "pkg" / "stale.txt").write_text("from the old copy")

    sc = fleet.sidecar(XPUFLEET_SSH_CONFIG=str(sshd.ssh_config))
    listing = sc.ok("GET", "/api/workers")
    assert listing["add_worker"]["default"] == "ssh"  # the server listens on 127.0.0.1 only
    added = fleet.cli("workers", "add-ssh", "gpu-ssh", sshd.target, "--port", str(sshd.port),
                      "--identity", str(sshd.dir / "user_key"), "--python", sys.executable,
                      "--remote-dir", str(folder), "--simulate", "cuda:0=16", timeout=400)
    assert added.returncode == 0 and "worker gpu-ssh: Online" in added.stdout, added.stdout + added.stderr
    w = sc.worker("gpu-ssh")
    assert w["auth"] == "ssh" and w["ssh"]["state"] == "tunnel up" and w["ssh"]["remote_dir"] == str(folder)
    assert w["selectable"] is True and "remove" in w["confirm"] and "disable" in w["confirm"]
    assert str(folder) in w["confirm"]["remove"]
    # the same xpufleet, in a folder of its own; the old copy's files are gone
    assert (folder / "BUILD").read_text().strip() == bundle()[0]
    assert (folder / "pkg" / "xpufleet" / "server" / "ssh" / "commands.py").is_file()
    assert not (folder / "pkg" / "stale.txt").exists()
    agent_pid = _agent_pid(folder)
    assert agent_pid is not None
    environ = Path(f"/proc/{agent_pid}/environ").read_bytes().split(b"\0")
    assert f"PYTHONPATH={folder}/pkg".encode() in environ and f"XPUFLEET_HOME={folder}/home".encode() in environ
    # no port opens: the tunnel ends in Unix sockets, and the agent listens on no TCP port
    assert stat.S_ISSOCK((folder / "agent.sock").stat().st_mode)
    assert stat.S_ISSOCK((fleet.home / "agents.sock").stat().st_mode)
    assert not [c for c in psutil.Process(agent_pid).net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    code, body = sc.call("POST", "/api/workers/gpu-ssh/reissue")
    assert code == 409 and "no credential to reissue" in body["error"]

    rid = sc.submit(fh.iris_graph(), target={"worker": "gpu-ssh", "devices": ["cuda:0"]})
    run = sc.wait_run(rid, TERMINAL)
    assert run["status"] == "succeeded" and run["worker_id"] == "gpu-ssh", run["error"]
    assert (folder / "home" / "agents" / "gpu-ssh" / "runs" / rid / "events.jsonl").is_file()

    # kill -9 of the ssh client: the agent and its run go on; the tunnel comes back
    long = sc.submit(fh.iris_graph(epochs=100_000), target="gpu-ssh")
    sc.wait_run(long, {"running"})
    ssh_pid = sc.worker("gpu-ssh")["ssh"]["pid"]
    assert psutil.Process(ssh_pid).name() == "ssh"
    os.kill(ssh_pid, signal.SIGKILL)
    _wait(lambda: (lambda x: x["ssh"]["connects"] >= 2 and x["status"] == "Online" and x)(sc.worker("gpu-ssh")),
          "reconnected", timeout=180)
    assert _agent_pid(folder) == agent_pid and sc.run(long)["status"] == "running"

    # disable: its agent stops (the run ends interrupted), ssh ends; listed as Disabled, takes no run
    disabled = fleet.cli("workers", "disable", "gpu-ssh")
    assert disabled.returncode == 0 and "gpu-ssh: Disabled" in disabled.stdout, disabled.stdout + disabled.stderr
    run = sc.wait_run(long, TERMINAL)
    assert run["status"] == "interrupted", run
    w = sc.worker("gpu-ssh")
    assert w["status"] == "Disabled" and w["selectable"] is False and w["ssh"]["pid"] is None
    assert "disable" not in w["confirm"]
    _wait(lambda: _agent_pid(folder) is None, "the agent stopped", timeout=60)
    code, body = sc.call("POST", "/api/runs", {"graph": fh.iris_graph(), "options": {"target": "gpu-ssh"}})
    assert code == 400 and "is disabled" in body["error"]
    listed = fleet.cli("workers")
    assert "gpu-ssh: Disabled" in listed.stdout and f"via ssh {sshd.target} -p {sshd.port}" in listed.stdout

    enabled = fleet.cli("workers", "enable", "gpu-ssh")
    assert enabled.returncode == 0, enabled.stderr
    sc.wait_worker("gpu-ssh", "Online", timeout=180)
    again = sc.submit(fh.iris_graph(), target="gpu-ssh")
    assert sc.wait_run(again, TERMINAL)["status"] == "succeeded"

    # a sidecar restart: the agent on the host goes on; the new sidecar's tunnel brings it back
    new_pid = _agent_pid(folder)
    sc.stop()
    sc.start()
    sc.wait_worker("gpu-ssh", "Online", timeout=180)
    assert _agent_pid(folder) == new_pid
    # the agent (still running) may reconnect through the tunnel before the supervisor has read the
    # host's "ready" line and counted the connection: wait for the count, bounded
    _wait(lambda: sc.worker("gpu-ssh")["ssh"]["connects"] == 1, "the new sidecar's one ssh connection", timeout=30)

    # remove: ssh ends, the entry and everything it stored on the host are deleted
    removed = fleet.cli("workers", "remove", "gpu-ssh")
    assert removed.returncode == 0 and "deleted" in removed.stdout, removed.stdout + removed.stderr
    assert not folder.exists()
    assert new_pid is None or not psutil.pid_exists(new_pid) or psutil.Process(new_pid).status() == "zombie"
    assert sc.call("GET", "/api/workers/gpu-ssh")[0] == 404
    assert not [p for p in psutil.Process(sc.proc.pid).children(recursive=True) if p.name() == "ssh"]


def test_an_unknown_host_key_is_refused_not_accepted(fleet, tmp_path, remote_agent_reaper):
    sshd = fleet.sshd()
    sc = fleet.sidecar(XPUFLEET_SSH_CONFIG=str(sshd.ssh_config))  # it knows 127.0.0.1's key, not localhost's
    folder = tmp_path / "host" / "hk"
    remote_agent_reaper.append(folder)
    added = fleet.cli("workers", "add-ssh", "hk", f"{sshd.user}@localhost", "--port", str(sshd.port),
                      "--identity", str(sshd.dir / "user_key"), "--python", sys.executable,
                      "--remote-dir", str(folder), "--no-wait")
    assert added.returncode == 0, added.stderr
    w = _wait(lambda: (lambda x: "Host key verification failed" in x["status_reason"] and x)(sc.worker("hk")),
              "the host key refusal", timeout=90)
    assert w["status"] == "Disconnected" and "known_hosts" in w["status_reason"]
    assert not folder.exists()  # nothing was installed
    removed = fleet.cli("workers", "remove", "hk")
    assert removed.returncode == 0 and "not deleted" in removed.stdout, removed.stdout
    for bad, text in ((["u@h", "--remote-dir", "../x"], "invalid --remote-dir"),
                      (["u@h", "--identity", str(tmp_path / "none")], "no key file"),
                      (["u@h", "--python=my python"], "invalid --python")):
        out = fleet.cli("workers", "add-ssh", "bad", *bad, "--no-wait")
        assert out.returncode == 2 and text in out.stderr, out.stderr
    # an ssh option in the host's place is refused, never passed on to ssh
    code, body = sc.call("POST", "/api/workers/ssh", {"name": "bad", "host": "-oProxyCommand=touch /tmp/x"})
    assert code == 400 and "invalid ssh target" in body["error"]
    code, body = sc.call("POST", "/api/workers/ssh", {"name": "bad", "host": "u@h", "shell": "x"})
    assert code == 400 and "shell" in body["error"]
    assert sc.call("GET", "/api/workers/bad")[0] == 404
