"""``xpufleet start | stop | status``: the sidecar's life cycle."""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import logging
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ...common.client import ApiError, SidecarUnreachable
from ...common.runtime_file import ensure_home, pid_alive, read_runtime, remove_runtime
from ...constants import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    ENV_COMFYUI,
    SIDECAR_LOG_NAME,
    SIDECAR_START_TIMEOUT_S,
    SIDECAR_STOP_TIMEOUT_S,
    home_dir,
)
from .common import (
    EXIT_OK,
    EXIT_RUN_FAILED,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    comfyui_options,
    err,
    running_client,
)
from .text import safe

SERVER_MODULE = "xpufleet.server"


def add_parser(sub: Any) -> None:
    """The ``start``, ``stop`` and ``status`` commands."""
    p = sub.add_parser("start", help="start the sidecar (background unless --foreground)")
    p.add_argument("--foreground", action="store_true", help="stay attached (for systemd); logs to stderr")
    p.add_argument("--host", default=DEFAULT_HOST, help=f"address to bind (default {DEFAULT_HOST}: this machine only)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 = any free)")
    p.add_argument("--allowed-host", action="append", metavar="NAME",
                   help="another Host header name to answer to (e.g. behind a proxy); repeatable")
    p.add_argument("--tls", action="store_true",
                   help="serve HTTPS (between machines): a certificate generated under XPUFLEET_HOME/tls unless "
                        "--tls-cert/--tls-key give one; join commands carry its SHA-256 fingerprint")
    p.add_argument("--tls-cert", metavar="FILE", help="PEM certificate (chain) to serve with --tls")
    p.add_argument("--tls-key", metavar="FILE", help="PEM private key of --tls-cert (default: in the same file)")
    comfyui_options(p, "ComfyUI workflows queued to this server (target local) in headless ComfyUIs of its own",
                    "$XPUFLEET_COMFYUI")
    p.add_argument("--ready-fd", type=int, default=None, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_start)

    p = sub.add_parser("stop", help="stop the sidecar (started runs end interrupted; queued runs stay)")
    p.add_argument("--timeout", type=float, default=SIDECAR_STOP_TIMEOUT_S, help="seconds to wait before killing it")
    p.set_defaults(func=cmd_stop)

    p = sub.add_parser("status", help="is the sidecar running; runs and slots")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_status)



def _tls_args(args: argparse.Namespace) -> list[str] | str:
    """The TLS options checked (an error text) and as passed on to the background child."""
    if args.tls_key and not args.tls_cert:
        return "--tls-key needs --tls-cert"
    out = []
    for flag, value in (("--tls-cert", args.tls_cert), ("--tls-key", args.tls_key)):
        if value:
            path = Path(value).expanduser()
            if not path.is_file():
                return f"{flag} {value}: no such file"
            out += [flag, str(path.resolve())]
    return (["--tls"] if args.tls or args.tls_cert else []) + out


def _comfyui(args: argparse.Namespace) -> Any:
    """``--comfyui``/``--comfyui-python`` (or ``$XPUFLEET_COMFYUI``): the ComfyInstall, None, or an error
    text. No automatic detection here: a sidecar runs ComfyUI runs only when told to."""
    from ..run.comfy_instances import ComfyError, extra_args, find_install

    path = getattr(args, "comfyui", None) or os.environ.get(ENV_COMFYUI) or None
    if path is None:
        return None
    try:
        install = find_install(path, getattr(args, "comfyui_python", None))
        extra_args()
        return install
    except ComfyError as exc:
        return f"--comfyui: {exc}"


def cmd_start(args: argparse.Namespace) -> int:
    home = ensure_home(home_dir())
    tls_args = _tls_args(args)
    if isinstance(tls_args, str):
        err(tls_args)
        return EXIT_USAGE
    if args.foreground:
        return _start_foreground(args, home)
    running = running_client(home)
    if running is not None:
        print(f"XPU Fleet sidecar already running at {running[1]['url']} (pid {running[1]['pid']})")
        return EXIT_OK
    read_fd, write_fd = os.pipe()
    cmd = [sys.executable, "-m", SERVER_MODULE, "start", "--foreground", "--host", args.host,
           "--port", str(args.port), "--ready-fd", str(write_fd)]
    for name in args.allowed_host or ():
        cmd += ["--allowed-host", name]
    cmd += tls_args
    comfyui = _comfyui(args)
    if isinstance(comfyui, str):
        err(comfyui)
        return EXIT_USAGE
    if comfyui is not None:
        cmd += ["--comfyui", str(comfyui.path), "--comfyui-python", comfyui.python]
    log_path = home / SIDECAR_LOG_NAME
    with open(log_path, "ab") as log_file:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                                pass_fds=(write_fd,), start_new_session=True, close_fds=True)
    os.close(write_fd)
    message = _read_ready(read_fd, SIDECAR_START_TIMEOUT_S)
    if message.startswith("http"):
        print(f"XPU Fleet sidecar running at {message} (pid {proc.pid}, home {home})")
        fingerprint = (read_runtime(home) or {}).get("tls_fingerprint")
        if fingerprint:
            print(f"TLS certificate fingerprint (agents pin it: --fingerprint): {fingerprint}")
        _print_pairing_code(home)
        return EXIT_OK
    if proc.poll() is None and not message:
        err(f"the sidecar did not get ready within {SIDECAR_START_TIMEOUT_S:g} s; see {log_path}")
        return EXIT_RUN_FAILED
    if message.startswith("error:"):
        err(message[len("error:"):].strip())
    else:
        err(f"the sidecar exited during start-up (code {proc.wait(timeout=5)}); see {log_path}")
        print(_tail(log_path), file=sys.stderr)
    return EXIT_RUN_FAILED


def _print_pairing_code(home: Path) -> None:
    """A browser pairing code after a start (docs/security.md); a failure to get one is only a warning."""
    from .pair import pairing_code_text

    running = running_client(home)
    if running is None:
        return
    try:
        print(pairing_code_text(running[0]))
    except (ApiError, SidecarUnreachable) as exc:
        err(f"no pairing code ({exc}); `xpufleet pair` prints one")


def _read_ready(fd: int, timeout: float) -> str:
    """What the starting sidecar writes on its ready pipe ('' on EOF or timeout). No polling: select."""
    deadline = time.monotonic() + timeout
    chunks = b""
    try:
        while b"\n" not in chunks:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                break
            data = os.read(fd, 4096)
            if not data:
                break
            chunks += data
    finally:
        os.close(fd)
    return chunks.decode("utf-8", "replace").strip()


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _start_foreground(args: argparse.Namespace, home: Path) -> int:
    from ...common.tls import TLSConfigError
    from ..sidecar.app import AlreadyRunning, SidecarConfig, run_foreground

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    ready_fd = args.ready_fd

    def report(text: str) -> None:
        nonlocal ready_fd
        if ready_fd is not None:
            with contextlib.suppress(OSError):
                os.write(ready_fd, (text + "\n").encode())
                os.close(ready_fd)
            ready_fd = None

    running = running_client(home)
    if running is not None:
        report(f"error: a sidecar is already running at {running[1]['url']} (pid {running[1]['pid']})")
        err(f"a sidecar is already running at {running[1]['url']} (pid {running[1]['pid']})")
        return EXIT_RUN_FAILED
    comfyui = _comfyui(args)
    if isinstance(comfyui, str):
        report(f"error: {comfyui}")
        err(comfyui)
        return EXIT_USAGE
    try:
        config = SidecarConfig.from_env(home, host=args.host, port=args.port, comfyui=comfyui,
                                        allowed_hosts=tuple(args.allowed_host or ()),
                                        tls=bool(args.tls or args.tls_cert),
                                        tls_cert=Path(args.tls_cert).expanduser() if args.tls_cert else None,
                                        tls_key=Path(args.tls_key).expanduser() if args.tls_key else None)
    except ValueError as exc:  # a bad XPUFLEET_LOCAL_SHARED_CARDS names itself
        report(f"error: {exc}")
        err(str(exc))
        return EXIT_USAGE
    try:
        return run_foreground(config, ready=report)
    except TLSConfigError as exc:
        report(f"error: {exc}")
        err(str(exc))
        return EXIT_USAGE
    except AlreadyRunning as exc:
        report(f"error: {exc}")
        err(str(exc))
        return EXIT_RUN_FAILED
    except OSError as exc:  # state.db damaged or on a full disk (store_durable.StoreUnusable), a port taken, ...
        message = str(exc)
        if exc.errno == errno.ENOSPC:  # one sentence, not a bare "[Errno 28]"
            message = f"the disk holding {home} is full ({exc.strerror}): free some space and start again"
        report(f"error: {message}")
        err(message)
        return EXIT_RUN_FAILED


def _is_sidecar_process(pid: int) -> bool:
    try:
        import psutil

        cmd = psutil.Process(pid).cmdline()
    except Exception:  # noqa: BLE001 - cannot tell: trust the runtime file
        return True
    return "start" in cmd and "--foreground" in cmd


def cmd_stop(args: argparse.Namespace) -> int:
    home = home_dir()
    info = read_runtime(home)
    if info is None or not pid_alive(info.get("pid")):
        if info is not None:
            remove_runtime(home)
        print("XPU Fleet sidecar is not running")
        return EXIT_OK
    pid = int(info["pid"])
    if not _is_sidecar_process(pid):
        remove_runtime(home)
        print(f"XPU Fleet sidecar is not running (pid {pid} in the runtime file is another program)")
        return EXIT_OK
    os.kill(pid, signal.SIGTERM)
    print(f"stopping the sidecar (pid {pid}); started runs are asked to stop and end interrupted", file=sys.stderr)
    if not _wait_exit(pid, args.timeout):
        err(f"the sidecar did not stop within {args.timeout:g} s; killing it")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        _wait_exit(pid, 10.0)
        remove_runtime(home, pid)
    print("XPU Fleet sidecar stopped")
    return EXIT_OK


def _wait_exit(pid: int, timeout: float) -> bool:
    """Wait for a process that is not our child to exit (True when it did). Linux: a pidfd becomes
    readable when the process exits (a zombie counts: it has exited), no polling."""
    try:
        fd = os.pidfd_open(pid)  # type: ignore[attr-defined]
    except ProcessLookupError:
        return True
    except (AttributeError, OSError):
        fd = None
    if fd is not None:
        try:
            ready, _, _ = select.select([fd], [], [], timeout)
            return bool(ready)
        finally:
            os.close(fd)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:  # elsewhere: bounded polling
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    return False


def cmd_status(args: argparse.Namespace) -> int:
    home = home_dir()
    running = running_client(home)
    if running is None:
        print(f"XPU Fleet sidecar is not running (XPUFLEET_HOME={home})")
        return EXIT_UNREACHABLE
    client, info = running
    try:
        st = client.status()
    except (ApiError, SidecarUnreachable) as exc:
        err(f"the sidecar at {info['url']} does not answer its status: {exc}")
        return EXIT_UNREACHABLE
    if args.json:
        print(json.dumps({**st, "url": info["url"]}, indent=2))
        return EXIT_OK
    runs = ", ".join(f"{n} {s}" for s, n in st["runs"].items() if n) or "none"
    print(f"XPU Fleet sidecar {st['version']} running at {info['url']} (pid {st['pid']}, home {st['home']})")
    if info.get("tls_fingerprint"):
        print(f"TLS certificate fingerprint: {info['tls_fingerprint']}")
    print(f"runs: {runs}")
    for s in st["slots"]:  # labels name workers and their devices: text from the agents
        shared = f" (shared by {', '.join(s['providers'])})" if len(s["providers"]) > 1 else ""
        print(safe(f"  {s['label']:<28} {s['used']}/{s['limit']} slots{shared}"))
    return EXIT_OK
