"""``xpufleet agent start|stop|status`` (docs/workers.md, docs/sidecar.md).

``xpufleet agent start`` on the sidecar's machine needs no arguments: the agent reads the sidecar's
address and session token from ``$XPUFLEET_HOME/runtime.json`` (re-read at every reconnect, so it
follows a restarted sidecar). It runs in the background by default, with its pid/state file at
``$XPUFLEET_HOME/agents/<name>.json`` and its log beside it; ``--foreground`` keeps it attached
(for systemd). A remote machine joins once with ``--server URL --join TOKEN``; the credential it gets
is kept in ``$XPUFLEET_HOME/agents/<name>.credential.json`` (mode 0600) for later starts.

Exit codes: 0 done, 1 failed (refused, did not connect, did not stop), 2 bad arguments. ``agent status``
exits 0 when an agent (the one ``--name`` names) runs on this machine and 1 when none does, so a script
can write ``xpufleet agent status >/dev/null || xpufleet agent start``; ``agent stop`` with no agent
running says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ...common.tls import TLSConfigError, normalize_fingerprint
from ...constants import AGENT_ADVERTISE_ADDR_DEFAULT, ENV_DATA_ROOTS, ENV_MOUNTS, RUN_STOP_GRACE_S, home_dir
from ...nodes.mounts import MountError, parse_mounts
from ...nodes.paths import DataRootError, parse_data_roots
from ..agent import agent as agentmod
from ..agent import config as agentcfg
from ..devices.inventory import Inventory
from ..devices.names import DeviceSpecError, parse_device_list
from ..devices.simulated import parse_simulate
from ..run.comfy_instances import ComfyError, extra_args, find_install
from ..workers import protocol
from .common import comfyui_options
from .text import safe

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
ENV_JOIN_TOKEN = "XPUFLEET_AGENT_JOIN_TOKEN"  # the background child gets --join this way, not in argv
START_WAIT_S = 30.0  # how long `agent start` waits for the first connection before it reports


def _home() -> Path:
    return home_dir()


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``agent start|stop|status`` to the ``xpufleet`` command's subparsers."""
    p = subparsers.add_parser("agent", help="run a worker agent on this machine (start, stop, status)",
                              description="Run a worker agent that takes queued runs from the sidecar.")
    sub = p.add_subparsers(dest="agent_command", metavar="{start,stop,status}")
    sub.required = True
    s = sub.add_parser("start", help="start a worker agent (background unless --foreground)")
    s.add_argument("--name", help="worker name (default: this machine's hostname)")
    s.add_argument("--devices", help="cards to offer, e.g. cuda:0,cuda:1 (CPU is always offered; default: all)")
    s.add_argument("--foreground", action="store_true", help="stay attached (for systemd); logs to stderr")
    s.add_argument("--server", help="sidecar URL, e.g. http://gpu-host:8288 (default: this machine's sidecar)")
    s.add_argument("--join", metavar="TOKEN", help="one-time join token from the server (remote workers)")
    s.add_argument("--simulate", metavar="SPEC",
                   help='simulated CUDA cards for tests/demos, e.g. "cuda:0=24,cuda:1=24" (GiB; @UUID optional)')
    s.add_argument("--mount", action="append", metavar="LABEL=FOLDER",
                   help="a storage mount: node file inputs 'LABEL:file.csv' read FOLDER/file.csv here (repeatable)")
    s.add_argument("--data-root", action="append", metavar="DIR",
                   help="a folder graphs may read files from by path, besides the run's own folder, the outputs "
                        "folder and the mounts (repeatable; also XPUFLEET_DATA_ROOTS)")
    s.add_argument("--one-shot", action="store_true",
                   help="take exactly one run and exit when it ends (with --join POOL_TOKEN: join that pool)")
    s.add_argument("--advertise-addr", metavar="ADDRESS", default=AGENT_ADVERTISE_ADDR_DEFAULT,
                   help="this machine's address that other workers reach for ddp across workers (the rank 0 "
                        f"store and the ranks' sockets); default {AGENT_ADVERTISE_ADDR_DEFAULT}, this machine only")
    s.add_argument("--fingerprint", metavar="SHA256",
                   help="the TLS sidecar's certificate fingerprint to pin (the join command carries it)")
    comfyui_options(s, "ComfyUI workflows on this worker's cards",
                    "$XPUFLEET_COMFYUI, or the ComfyUI whose environment runs this agent")
    t = sub.add_parser("stop", help="stop a worker agent started with `agent start`")
    t.add_argument("--name", help="worker name (default: the only running agent, else the hostname)")
    u = sub.add_parser("status", help="show this machine's worker agents",
                       description="Show this machine's worker agents. Exit code 0: an agent (the one --name "
                                   "names) is running; 1: none is.")
    u.add_argument("--name", help="only this worker")
    u.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Dispatch ``xpufleet agent ...``; returns the exit code."""
    cmd = getattr(args, "agent_command", None)
    if cmd == "start":
        return _start(args)
    if cmd == "stop":
        return _stop(args)
    if cmd == "status":
        return _status(args)
    print("usage: xpufleet agent {start,stop,status}", file=sys.stderr)
    return EXIT_USAGE


def _err(msg: str, code: int = EXIT_FAILED) -> int:
    print(f"xpufleet agent: {safe(msg, lines=True)}", file=sys.stderr)
    return code


# --- pid/state files ------------------------------------------------------------------------------

def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        import psutil

        proc = psutil.Process(int(pid))
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        cmd = " ".join(proc.cmdline())
    except Exception:
        return False
    return "agent" in cmd  # a recycled pid of an unrelated process is not our agent


def _states(home: Path) -> list[dict[str, Any]]:
    out = []
    folder = agentcfg.agents_dir(home)
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        if path.name.endswith((".credential.json", "-simulated.json")):
            continue
        data = agentcfg.read_json(path)
        if data and "pid" in data and "name" in data:
            data["alive"] = _alive(data.get("pid"))
            out.append(data)
    return out


class _Ambiguous(Exception):
    """Several agents run here and no --name says which one."""


def _pick_name(args: argparse.Namespace, home: Path) -> str:
    if args.name:
        return args.name
    running = sorted(s["name"] for s in _states(home) if s["alive"])
    if len(running) == 1:
        return running[0]
    default = agentmod.default_name()
    if len(running) > 1 and default not in running:
        raise _Ambiguous(f"{len(running)} worker agents run here ({', '.join(running)}): pass --name NAME")
    return default


# --- start ------------------------------------------------------------------------------------------

def _config(args: argparse.Namespace, home: Path) -> agentcfg.AgentConfig:
    one_shot = bool(getattr(args, "one_shot", False))
    # one-shot agents of a pool often share a machine (batch jobs): each gets a name of its own
    name = args.name or (agentmod.one_shot_name() if one_shot else agentmod.default_name())
    bad_name = protocol.worker_name_problem(name)
    if bad_name:  # the server would refuse it; say so before starting anything
        raise DeviceSpecError(f"--name: {bad_name}")
    join = args.join or os.environ.pop(ENV_JOIN_TOKEN, None) or None  # not passed on to runs
    if join and join.startswith(protocol.POOL_SECRET_PREFIX + "_") and not one_shot:
        raise DeviceSpecError("--join: this is a pool's shared credential; pool instances are one-shot agents: "
                              "add --one-shot")
    fingerprint = getattr(args, "fingerprint", None)
    if fingerprint:
        try:
            fingerprint = normalize_fingerprint(fingerprint)
        except TLSConfigError as exc:
            raise DeviceSpecError(f"--fingerprint: {exc}") from None
    try:
        mount_map = parse_mounts(getattr(args, "mount", None))
    except MountError as exc:
        raise DeviceSpecError(f"--mount: {exc}") from None
    extra_env = {ENV_MOUNTS: json.dumps({k: str(v) for k, v in mount_map.items()})} if mount_map else {}
    try:  # the owner's environment, then the flags: each an existing folder (nodes/paths.py)
        env_roots = [p for p in os.environ.get(ENV_DATA_ROOTS, "").split(os.pathsep) if p.strip()]
        roots = parse_data_roots(env_roots + list(getattr(args, "data_root", None) or []))
    except DataRootError as exc:
        raise DeviceSpecError(str(exc)) from None
    if roots:
        extra_env[ENV_DATA_ROOTS] = os.pathsep.join(str(r) for r in roots)
    advertise = advertise_address(getattr(args, "advertise_addr", None) or AGENT_ADVERTISE_ADDR_DEFAULT)
    try:
        comfyui = find_install(getattr(args, "comfyui", None), getattr(args, "comfyui_python", None))
        if comfyui is not None:
            extra_args()
    except ComfyError as exc:
        raise DeviceSpecError(f"--comfyui: {exc}") from None
    return agentcfg.AgentConfig(
        name=name,
        home=home,
        server=args.server,
        join_token=join,
        devices=parse_device_list(args.devices),
        simulate=parse_simulate(args.simulate, name),
        extra_env=extra_env,
        mounts=mount_map,
        data_roots=roots,
        one_shot=one_shot,
        fingerprint=fingerprint,
        advertise_addr=advertise,
        comfyui=comfyui,
    )


def advertise_address(text: str) -> str:
    """``--advertise-addr``: an IP address of one of this machine's interfaces (DeviceSpecError: exit 2)."""
    import ipaddress

    from ..run.spread import interface_for

    try:
        addr = str(ipaddress.ip_address(text.strip().strip("[]")))
    except ValueError:
        raise DeviceSpecError(f"--advertise-addr: {text!r} is not an IP address (e.g. 10.0.0.5)") from None
    if interface_for(addr) is None:
        raise DeviceSpecError(f"--advertise-addr: no network interface of this machine holds {addr}; give one of "
                              f"its addresses (ip addr)")
    return addr


def _start(args: argparse.Namespace) -> int:
    home = _home()
    try:
        cfg = _config(args, home)
        if cfg.simulate and cfg.devices:
            unknown = [d for d in cfg.devices if d != "cpu" and d not in {c.name for c in cfg.simulate}]
            if unknown:
                raise DeviceSpecError(f"--devices names {', '.join(unknown)}, which --simulate does not")
    except DeviceSpecError as exc:
        return _err(str(exc), EXIT_USAGE)
    current = agentcfg.read_json(agentcfg.state_file(home, cfg.name))
    if current and _alive(current.get("pid")) and current.get("pid") != os.getpid():
        print(f"worker agent {cfg.name} is already running (pid {current['pid']}, {safe(current.get('state'))})")
        return EXIT_OK
    if not cfg.simulate and cfg.devices:
        inv = Inventory(cfg.name, home, cfg.devices)
        missing = inv.check_requested()
        if missing:
            offered = ", ".join(d["name"] for d in Inventory(cfg.name, home).snapshot())
            return _err(f"this machine does not offer {', '.join(missing)} (it offers {offered})", EXIT_USAGE)
    if args.foreground:
        return agentmod.run_agent(cfg)
    try:
        agentcfg.resolve_auth(cfg)
    except agentcfg.AuthError as exc:
        return _err(str(exc))
    return _spawn(args, cfg, home)


def _spawn(args: argparse.Namespace, cfg: agentcfg.AgentConfig, home: Path) -> int:
    argv = [sys.executable, "-m", "xpufleet.server", "agent", "start", "--foreground", "--name", cfg.name]
    if args.devices:
        argv += ["--devices", args.devices]
    if args.server:
        argv += ["--server", args.server]
    if args.simulate:
        argv += ["--simulate", args.simulate]
    for label, folder in cfg.mounts.items():
        argv += ["--mount", f"{label}={folder}"]
    for root in cfg.data_roots:
        argv += ["--data-root", str(root)]
    if cfg.one_shot:
        argv += ["--one-shot"]
    if cfg.fingerprint:
        argv += ["--fingerprint", cfg.fingerprint]
    argv += ["--advertise-addr", cfg.advertise_addr]
    if cfg.comfyui is not None:
        argv += ["--comfyui", str(cfg.comfyui.path), "--comfyui-python", cfg.comfyui.python]
    env = dict(os.environ)
    if cfg.join_token:
        env[ENV_JOIN_TOKEN] = cfg.join_token
    log_path = agentcfg.agents_dir(home) / f"{cfg.name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.time()
    with open(log_path, "ab") as logf:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                 env=env, start_new_session=True)
    deadline = time.monotonic() + START_WAIT_S
    state: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        if child.poll() is not None:
            return _err(f"the agent exited with code {child.returncode}; see {log_path}")
        state = agentcfg.read_json(agentcfg.state_file(home, cfg.name))
        if state and state.get("pid") == child.pid and state.get("updated_at", 0) >= started:
            if state.get("state") == "connected":
                print(f"worker agent {cfg.name} connected to {safe(state.get('server'))} (pid {child.pid}); "
                      f"log: {log_path}")
                return EXIT_OK
            if state.get("state") == "rejected":
                _terminate(child.pid)
                return _err(f"the server refused worker {cfg.name}: {state.get('reason')}")
        time.sleep(0.1)
    reason = (state or {}).get("reason") or "no connection yet"
    print(f"worker agent {cfg.name} started (pid {child.pid}) but is not connected yet: {safe(reason)}; "
          f"it keeps trying (log: {log_path})")
    return EXIT_OK


def _terminate(pid: int, wait_s: float = RUN_STOP_GRACE_S + 10) -> bool:
    """SIGTERM, then SIGKILL after ``wait_s``; True when the process is gone."""
    import psutil

    try:
        proc = psutil.Process(pid)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=wait_s)
        return True
    except psutil.NoSuchProcess:
        return True
    except psutil.TimeoutExpired:
        proc.kill()
        try:
            proc.wait(timeout=5)
        except psutil.TimeoutExpired:
            return False
        return True


# --- stop / status ------------------------------------------------------------------------------------

def _stop(args: argparse.Namespace) -> int:
    home = _home()
    try:
        name = _pick_name(args, home)
    except _Ambiguous as exc:
        return _err(str(exc), EXIT_USAGE)
    path = agentcfg.state_file(home, name)
    state = agentcfg.read_json(path)
    if not state or not _alive(state.get("pid")):
        print(f"worker agent {name} is not running")
        return EXIT_OK
    if not _terminate(int(state["pid"])):
        return _err(f"worker agent {name} (pid {state['pid']}) did not stop")
    print(f"worker agent {name} stopped")
    return EXIT_OK


def _status(args: argparse.Namespace) -> int:
    home = _home()
    states = _states(home)
    if args.name:
        states = [s for s in states if s["name"] == args.name]
    if args.json:
        print(json.dumps({"agents": states}, indent=2))
    elif not states:
        print("no worker agents on this machine" + (f" named {args.name}" if args.name else ""))
    else:
        for s in states:
            run_state = s.get("state") if s["alive"] else "not running"
            reason = f" ({s['reason']})" if s.get("reason") and s["alive"] else ""
            sim = " [simulated cards]" if s.get("simulated") else ""
            print(safe(f"{s['name']}: {run_state}{reason}, pid {s.get('pid')}, server {s.get('server')}, "
                       f"devices {', '.join(s.get('devices') or []) or '-'}{sim}, runs {len(s.get('runs') or [])}"))
    return EXIT_OK if any(s["alive"] for s in states) else EXIT_FAILED
