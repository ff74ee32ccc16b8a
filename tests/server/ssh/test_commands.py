"""SSH workers' pure parts (docs/workers.md): the ssh command lines (never an option smuggled in, host keys always
checked), the failure texts, the bundle's build id, and the scripts run on the host, executed here for
real on a temporary folder (no ssh needed: the same Python the host runs)."""

from __future__ import annotations

import io
import json
import os
import shlex
import signal
import subprocess
import sys
import tarfile
import time

import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xpufleet.constants import VERSION
from xpufleet.server.ssh import bundle as bundle_mod
from xpufleet.server.ssh import commands as c

T = c.SshTarget("me@gpu-box", 2222, "/keys/id", "python3", ".xpufleet-ssh/box")


def test_ssh_argv_checks_host_keys_and_quotes_the_remote_command():
    argv = c.ssh_argv("ssh", T, "/cfg", c.script_command(T, "print('hi; rm -rf /')", "a b", "$HOME"),
                      forward="/r/agent.sock:/l/agents.sock")
    assert argv[:3] == ["ssh", "-o", "BatchMode=yes"] and "-F" in argv and argv[argv.index("-F") + 1] == "/cfg"
    assert argv[argv.index("-p") + 1] == "2222" and argv[argv.index("-i") + 1] == "/keys/id"
    assert "ExitOnForwardFailure=yes" in argv and argv[argv.index("-R") + 1] == "/r/agent.sock:/l/agents.sock"
    assert not any("StrictHostKeyChecking" in a or "UserKnownHostsFile" in a for a in argv)
    assert argv[-3:-1] == ["--", "me@gpu-box"]
    assert shlex.split(argv[-1]) == ["python3", "-c", "print('hi; rm -rf /')", "a b", "$HOME"]
    plain = c.ssh_argv("ssh", c.SshTarget("h"), None, ["true"])
    assert "-F" not in plain and "-p" not in plain and "-R" not in plain and plain[-2:] == ["h", "true"]


@pytest.mark.parametrize("target,ok", [("me@host", True), ("host.example.org", True), ("gpu-box", True),
                                       ("me@10.0.0.2", True), ("me@[::1]", True), ("-oProxyCommand=x", False),
                                       ("me@host;rm", False), ("a b", False), ("", False), ("me@-x", True)])
def test_check_target(target, ok):
    if ok:
        assert c.check_target(target) == target
    else:
        with pytest.raises(c.SshConfigError, match="invalid ssh target"):
            c.check_target(target)


def test_check_remote_dir_and_python():
    assert c.check_remote_dir(".xpufleet-ssh/box") == ".xpufleet-ssh/box"
    assert c.check_remote_dir("/srv/xpufleet/box") == "/srv/xpufleet/box"
    for bad in ("", "/", "~", "~/", ".", "a/../b", "..", "x\ny"):
        with pytest.raises(c.SshConfigError, match="invalid --remote-dir"):
            c.check_remote_dir(bad)
    assert c.check_python("/opt/conda/bin/python") == "/opt/conda/bin/python"
    for bad in ("", "-c", "my python"):
        with pytest.raises(c.SshConfigError, match="invalid --python"):
            c.check_python(bad)


def test_ssh_failure_texts():
    assert "known_hosts" in c.ssh_failure(255, "Host key verification failed.\n")
    assert "--identity" in c.ssh_failure(255, "me@h: Permission denied (publickey).\n")
    assert "AllowStreamLocalForwarding" in c.ssh_failure(255, "Error: remote port forwarding failed for listen path")
    assert c.ssh_failure(255, "") == "ssh exited with code 255"
    assert c.ssh_failure(255, "Warning: Permanently added 'x'\nssh: connect to host h port 22: Connection refused\n") \
        == "ssh: connect to host h port 22: Connection refused"


def test_bundle_build_id_follows_the_files(tmp_path):
    build, data = bundle_mod.bundle()
    assert build.startswith(VERSION + "+")
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        names = tar.getnames()
    assert "xpufleet/constants.py" in names and "xpufleet/server/ssh/commands.py" in names
    assert not [n for n in names if "__pycache__" in n or n.startswith("xpufleet/tests")]
    root = tmp_path / "pkg"
    (root / "server").mkdir(parents=True)
    (root / "constants.py").write_text("VERSION = 'x'\n")
    (root / "server" / "a.py").write_text("A = 1\n")
    first = bundle_mod.bundle(root)[0]
    (root / "server" / "a.py").write_text("A = 2\n")
    bundle_mod.bundle.cache_clear()
    assert bundle_mod.bundle(root)[0] != first


# --- the host's scripts, for real ---------------------------------------------------------------------------

FAKE_AGENT = """import json, os, signal, sys, time
path = os.path.join(os.environ["XPUFLEET_HOME"], "argv.json")
with open(path + ".tmp", "w") as f:
    f.write(json.dumps(sys.argv))
os.replace(path + ".tmp", path)  # whole or absent: the test waits for it
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
time.sleep(600)
"""


def _fake_bundle() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in (("xpufleet/__init__.py", ""), ("xpufleet/server/__init__.py", ""),
                           ("xpufleet/server/__main__.py", FAKE_AGENT)):
            info = tarfile.TarInfo(name)
            info.size = len(text)
            tar.addfile(info, io.BytesIO(text.encode()))
    return buf.getvalue()


def _run(script: str, *args: str, stdin: bytes = b"") -> dict:
    out = subprocess.run([sys.executable, "-c", script, *args], input=stdin, capture_output=True, timeout=120)
    assert out.returncode in (0, 3), out.stderr.decode()
    return json.loads(out.stdout.decode().strip().splitlines()[-1])


def test_the_host_scripts_install_start_stop_and_clean_up(tmp_path):
    d = tmp_path / "host" / "box"
    probe = _run(c.PROBE, str(d), "box", json.dumps(["json", "no_such_module_xyz"]))
    assert probe["exists"] is False and probe["ours"] is False and probe["build"] is None
    assert probe["missing"] == ["no_such_module_xyz"] and probe["python_ok"] is True
    done = _run(c.INSTALL, str(d), "box", "b1", sys.executable, stdin=_fake_bundle())
    assert done["ok"] and (d / "BUILD").read_text().strip() == "b1" and (d / ".xpufleet-ssh-worker").is_file()
    assert (d / "pkg" / "xpufleet" / "server" / "__main__.py").is_file() and os.access(d / "bin" / "xpufleet", os.X_OK)
    (d / "agent.sock").write_text("stale")  # what sshd leaves behind
    probe = _run(c.PROBE, str(d), "box", "[]")
    assert probe["ours"] and probe["build"] == "b1" and not (d / "agent.sock").exists()

    start = subprocess.Popen([sys.executable, "-c", c.START, str(d), "box"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE)
    start.stdin.write(json.dumps({"credential": "xfc_secret", "args": ["--simulate", "cuda:0=8"]}).encode() + b"\n")
    start.stdin.flush()
    assert start.stdout.readline().decode().startswith("started agent pid")
    assert start.stdout.readline().strip() == b"ready"
    pid = int((d / "agent.pid").read_text())
    cred = d / "home" / "agents" / "box.credential.json"
    assert json.loads(cred.read_text()) == {"server": f"unix:{d}/agent.sock", "name": "box", "credential": "xfc_secret"}
    assert (cred.stat().st_mode & 0o077) == 0
    deadline = time.monotonic() + 30
    while not (d / "home" / "argv.json").exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # the fake agent writes its argv once it runs
    argv = json.loads((d / "home" / "argv.json").read_text())
    assert argv[1:] == ["agent", "start", "--foreground", "--name", "box", "--server", f"unix:{d}/agent.sock",
                        "--simulate", "cuda:0=8"]
    start.stdin.close()  # the sidecar ends the session: the script ends, the agent goes on
    assert start.wait(30) == 0 and psutil.pid_exists(pid)
    again = subprocess.run([sys.executable, "-c", c.START, str(d), "box"], capture_output=True, timeout=30,
                           input=json.dumps({"credential": "xfc_new"}).encode() + b"\n")
    assert again.stdout.decode().splitlines()[0] == f"agent running pid {pid}"
    assert json.loads(cred.read_text())["credential"] == "xfc_new"
    # an update stops the old agent first
    done = _run(c.INSTALL, str(d), "box", "b2", sys.executable, stdin=_fake_bundle())
    assert done["stopped_agent"] == pid and not _alive(pid)
    assert _run(c.STOP, str(d), "box", "5") == {"stopped": None}
    cleaned = _run(c.CLEANUP, str(d), "box", "5")
    assert cleaned["removed"] is True and not d.exists()
    assert _run(c.CLEANUP, str(d), "box", "5")["removed"] is False


def test_the_host_scripts_leave_a_foreign_folder_alone(tmp_path):
    d = tmp_path / "mine"
    d.mkdir()
    (d / "thesis.tex").write_text("precious")
    assert _run(c.PROBE, str(d), "box", "[]")["foreign"] is True
    done = _run(c.INSTALL, str(d), "box", "b1", sys.executable, stdin=_fake_bundle())
    assert done["ok"] is False and "is not this SSH worker's folder" in done["error"]
    cleaned = _run(c.CLEANUP, str(d), "box", "5")
    assert cleaned["removed"] is False and (d / "thesis.tex").read_text() == "precious"
    (d / ".xpufleet-ssh-worker").write_text("another-worker\n")  # another worker's folder: not ours either
    assert _run(c.CLEANUP, str(d), "box", "5")["removed"] is False and d.exists()


def test_a_bundle_with_a_path_out_is_refused(tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("xpufleet/../../escape.py")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    out = subprocess.run([sys.executable, "-c", c.INSTALL, str(tmp_path / "d"), "box", "b", sys.executable],
                         input=buf.getvalue(), capture_output=True, timeout=60)
    assert out.returncode != 0 and b"unexpected member" in out.stderr
    assert not (tmp_path / "escape.py").exists()


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture(autouse=True)
def _no_stray_agents(tmp_path):
    yield
    for pidfile in tmp_path.rglob("agent.pid"):
        pid = int(pidfile.read_text())
        if _alive(pid):
            os.kill(pid, signal.SIGTERM)


def test_an_ssh_workers_status_says_what_ssh_does():
    from xpufleet.server.workers.status import ssh_status

    ssh = {"disabled": False, "state": "ssh connection lost", "detail": "ssh exited with code -9; reconnecting in 2 s"}
    assert ssh_status("Disconnected", "has not connected since the server started", ssh) == (
        "Disconnected", "ssh connection lost: ssh exited with code -9; reconnecting in 2 s")
    assert ssh_status("Disconnected", "disconnected 3 s ago", ssh)[1].endswith("; disconnected 3 s ago")
    assert ssh_status("Online", "", ssh) == ("Online", "")
    status, reason = ssh_status("Disconnected", "", {**ssh, "disabled": True})
    assert status == "Disabled" and "enable it" in reason


# --- hostile values: each arrives as one intact argument, and nothing it says runs ------------------------

SHELL_DANGER = ["$(touch pwned)", "`touch pwned`", "; touch pwned", "&& touch pwned", "| touch pwned", "'", '"', "\\",
                "$HOME", "${IFS}", "*", "?", "~", "#", "\n", "\r", "\t", " ", "!", "-", "--", "-oProxyCommand=x", ">x",
                "<x", "(", ")", "{", "}", "%", "é", "\u2028", "\x85", "\x1b[2J", "\U0001f600"]


def _shell_text(max_parts: int = 5) -> st.SearchStrategy[str]:
    part = st.one_of(st.sampled_from(SHELL_DANGER),
                     st.text(alphabet=st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=4))
    return st.lists(part, max_size=max_parts).map("".join)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(_shell_text(), max_size=5), python=_shell_text(), identity=st.one_of(st.none(), _shell_text()),
       config=st.one_of(st.none(), _shell_text()), port=st.one_of(st.none(), st.integers(1, 65535)))
def test_hostile_remote_arguments_reach_the_remote_shell_as_single_intact_arguments(tmp_path_factory, parts, python,
                                                                                    identity, config, port):
    t = c.SshTarget("me@gpu-box", port, identity or None, python or "python3", ".xpufleet-ssh/box")
    remote = c.script_command(t, "print(1)", *parts)
    argv = c.ssh_argv("ssh", t, config or None, remote)
    assert argv[-3:-1] == ["--", "me@gpu-box"] and shlex.split(argv[-1]) == remote
    flags = argv[:-3]  # before "--": ssh's own options; a user value only ever right after its flag
    for flag, value in (("-i", identity or None), ("-F", config or None), ("-p", str(port) if port else None)):
        assert (flags[flags.index(flag) + 1] == value) if value else flag not in flags
    fixed, i = [], 0
    while i < len(flags):  # the flags with the user's values (and their flags) taken out
        i, fixed = (i + 2, fixed) if flags[i] in ("-i", "-F", "-p") else (i + 1, [*fixed, flags[i]])
    plain = c.ssh_argv("ssh", c.SshTarget("me@gpu-box"), None, ["true"])[:-3]
    assert fixed == plain + (["-o", "IdentitiesOnly=yes"] if identity else [])
    # What the remote shell does with it: printf prints each argument it got, NUL-terminated.
    cwd = tmp_path_factory.mktemp("shell")
    echo = ["printf", "%s\\0", *remote]
    line = " ".join(shlex.quote(p) for p in echo)
    assert subprocess.run(["bash", "-n", "-c", line], timeout=30).returncode == 0
    done = subprocess.run(["bash", "-c", line], capture_output=True, timeout=30, cwd=cwd)
    assert done.stdout.split(b"\0")[:-1] == [p.encode("utf-8", "surrogateescape") for p in remote]
    assert list(cwd.iterdir()) == []  # no redirection or command of theirs ran


FAKE_PY = "#!/bin/sh\nprintf '%s\\0' \"$0\" \"$XPUFLEET_HOME\" \"$PYTHONPATH\" \"$@\" > \"$RECORD\"\n"


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(folder=_shell_text(4).map(lambda s: s.replace("/", "_").replace("\n", "_").replace("\r", "_")).filter(
           lambda s: s.strip(". ") and s.isprintable()),
       py_name=_shell_text(4).map(lambda s: s.replace("/", "_")).filter(lambda s: s not in ("", ".", "..")))
def test_the_launcher_the_host_script_writes_runs_its_python_from_a_hostile_folder(tmp_path_factory, folder,
                                                                                    py_name):
    root = tmp_path_factory.mktemp("host")
    d = root / f"w{folder}"
    fake = root / f"py{py_name}"
    fake.write_text(FAKE_PY)
    fake.chmod(0o755)
    done = _run(c.INSTALL, str(d), "box", "b1", str(fake), stdin=_fake_bundle())
    assert done["ok"], done
    launcher = d / "bin" / "xpufleet"
    assert subprocess.run(["sh", "-n", str(launcher)], timeout=30).returncode == 0
    record = root / "record"
    ran = subprocess.run([str(launcher), "agent", "a b", "$(touch pwned)"], cwd=root, timeout=30,
                         env={**os.environ, "RECORD": str(record)})
    assert ran.returncode == 0
    got = record.read_bytes().split(b"\0")[:-1]
    assert got == [os.fsencode(p) for p in (fake, d / "home", d / "pkg", "-m", "xpufleet.server", "agent", "a b",
                                            "$(touch pwned)")]
    assert sorted(p.name for p in root.iterdir()) == sorted([d.name, fake.name, "record"])  # nothing else made


@pytest.mark.parametrize("bad", ["/x:127.0.0.1:22", "relative/dir", "/x\ny", "/x\x1b[2J"])
def test_a_reported_folder_that_would_misdirect_the_tunnel_is_refused(bad):
    with pytest.raises(c.SshConfigError, match="cannot name"):
        c.forward_spec(bad, "/l/agents.sock")
    assert c.forward_spec("/home/me/.xpufleet-ssh/box", "/l/a.sock") == "/home/me/.xpufleet-ssh/box/agent.sock:/l/a.sock"
    with pytest.raises(c.SshConfigError, match="invalid --remote-dir"):
        c.check_remote_dir("box:1")
