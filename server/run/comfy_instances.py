"""The headless ComfyUIs that run ComfyUI runs (docs/workers.md, "Any workflow on a fleet card").

A host (an agent, or the sidecar for target ``local``) given a ComfyUI keeps one headless instance per
device set a run holds, keyed by the machine's device names joined (``cuda:1``, ``cuda:0+cuda:1``,
``cpu``). An instance is started on demand::

    PY COMFYUI/main.py --listen 127.0.0.1 --port P --disable-auto-launch --output-directory D/output
        --temp-directory D/temp --input-directory D/input --user-directory D/user [--cpu]

``--cpu`` for ``cpu`` and for simulated cards, else ``CUDA_VISIBLE_DEVICES`` (the run's renumbering env)
so it sees its cards only; then ``$XPUFLEET_COMFYUI_ARGS`` (split like a shell line: model paths, memory
flags). ``D`` = ``$XPUFLEET_HOME/comfyui/<host>/<key>/``; its output goes to
``D/comfyui.log``. It is ready when ``GET /system_stats`` answers (within
``XPUFLEET_COMFYUI_START_TIMEOUT_S``), kept warm between runs (models stay loaded), stopped after
``XPUFLEET_COMFYUI_IDLE_S`` without a run, replaced by the next run when it died, and stopped by its
process group when the host stops.

The reading (:meth:`ComfyInstances.read`): the ``cpu`` instance's ``/object_info`` reduced to the agent
protocol's ``comfyui`` message (server/contracts/agent_protocol.py ``ComfyuiInfo``) and its model files
from ``/models`` and ``/models/{folder}``. The instance stays as the warm ``cpu`` instance.

No torch here: the instance imports it, in its own process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shlex
import signal
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...constants import (
    COMFYUI_DIRNAME,
    COMFYUI_HTTP_TIMEOUT_S,
    COMFYUI_IDLE_S,
    COMFYUI_LOG_NAME,
    COMFYUI_START_TIMEOUT_S,
    COMFYUI_STOP_GRACE_S,
    ENV_COMFYUI,
    ENV_COMFYUI_ARGS,
    ENV_COMFYUI_IDLE_S,
    ENV_COMFYUI_PYTHON,
    ENV_COMFYUI_START_TIMEOUT_S,
)

log = logging.getLogger("xpufleet.comfyui")

CPU_KEY = "cpu"
READY_POLL_S = 0.2
START_ATTEMPTS = 2  # a port taken between choosing it and ComfyUI binding it: one more try
LOG_TAIL_CHARS = 2000
FOLDERS = ("output", "temp", "input", "user")


class ComfyError(RuntimeError):
    """A ComfyUI that cannot be used (the text says which and why)."""


@dataclass(frozen=True)
class ComfyInstall:
    """A ComfyUI folder (with ``main.py``) and the interpreter that runs it."""

    path: Path
    python: str

    def problem(self) -> str | None:
        """Why this is not a ComfyUI folder ("" -> None when it is)."""
        if not (self.path / "main.py").is_file():
            return f"{self.path} is not a ComfyUI folder: it has no main.py"
        if not Path(self.python).exists():
            return f"the ComfyUI interpreter {self.python} does not exist"
        return None


def _looks_like_comfyui(folder: Path) -> bool:
    return (folder / "main.py").is_file() and (folder / "comfy").is_dir() and (folder / "nodes.py").is_file()


def find_install(path: str | None, python: str | None, env: Mapping[str, str] | None = None) -> ComfyInstall | None:
    """The ComfyUI a host uses: ``path`` (``--comfyui``), else ``$XPUFLEET_COMFYUI``, else the ComfyUI
    whose environment this interpreter is (its venv inside or beside the ComfyUI folder: ``ComfyUI/venv``,
    ``ComfyUI/.venv``, or a portable build's ``python_embeded`` next to ``ComfyUI/``), else None.

    The interpreter: ``python`` (``--comfyui-python``), else ``$XPUFLEET_COMFYUI_PYTHON``, else a
    ``venv``/``.venv`` inside the ComfyUI folder, else this interpreter. Raises ComfyError when a folder
    was named but is not a ComfyUI."""
    env = os.environ if env is None else env
    named = path or env.get(ENV_COMFYUI) or None
    py = python or env.get(ENV_COMFYUI_PYTHON) or None
    if named is None:
        prefix = Path(sys.prefix).resolve()
        for candidate in (prefix.parent, prefix.parent / "ComfyUI"):
            if _looks_like_comfyui(candidate):
                return ComfyInstall(candidate, py or sys.executable)
        return None
    folder = Path(named).expanduser().resolve()
    if py is None:
        for venv in ("venv", ".venv"):
            exe = folder / venv / "bin" / "python"
            if exe.exists():
                py = str(exe)
                break
    install = ComfyInstall(folder, py or sys.executable)
    problem = install.problem()
    if problem is not None:
        raise ComfyError(problem)
    return install


def extra_args(env: Mapping[str, str] | None = None) -> list[str]:
    """``$XPUFLEET_COMFYUI_ARGS`` split like a shell line; ComfyError naming it when it cannot be (the CLI
    checks it at start, so a bad line never fails a run)."""
    env = os.environ if env is None else env
    try:
        return shlex.split(env.get(ENV_COMFYUI_ARGS, ""))
    except ValueError as exc:
        raise ComfyError(f"{ENV_COMFYUI_ARGS}: {exc}") from None


def instance_key(machine_devices: Sequence[str]) -> str:
    """The instance of a run's device set: the machine's names joined (``cuda:0+cuda:1``); ``cpu`` alone
    when the run holds no card."""
    cards = [d for d in machine_devices if d != "cpu"]
    return "+".join(cards) if cards else CPU_KEY


def _env_float(name: str, default: float, env: Mapping[str, str]) -> float:
    try:
        value = float(env.get(name, ""))
    except ValueError:
        return default
    return value if value > 0 else default


def free_port() -> int:
    """A free loopback TCP port (ComfyUI binds it a moment later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def log_tail(path: Path, chars: int = LOG_TAIL_CHARS) -> str:
    """The end of an instance's log (for a failed start's error)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - chars))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


@dataclass(eq=False)
class Instance:
    """One headless ComfyUI."""

    key: str
    folder: Path
    devices: list[str]
    cpu: bool
    port: int = 0
    proc: asyncio.subprocess.Process | None = None
    version: str | None = None
    users: int = 0
    last_used: float = field(default_factory=time.monotonic)
    started_at: float = 0.0
    start_s: float = 0.0
    idle_task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.folder / COMFYUI_LOG_NAME

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def lease(self, started: bool) -> dict[str, Any]:
        """What a run's spec says of its instance (``RunSpec.comfyui``)."""
        return {"url": self.url, "instance": self.key, "devices": list(self.devices),
                "output_dir": str(self.folder / "output"), "log": str(self.log_path), "started": started,
                "version": self.version, "pid": self.pid}


class ComfyInstances:
    """Every headless ComfyUI of one host (an agent, or the sidecar as ``local``)."""

    def __init__(self, install: ComfyInstall, home: Path, host: str, *, env: Mapping[str, str] | None = None,
                 idle_s: float | None = None, start_timeout_s: float | None = None) -> None:
        settings = os.environ if env is None else env
        self.install = install
        self.host = host
        self.root = Path(home) / COMFYUI_DIRNAME / host
        self.idle_s = idle_s if idle_s is not None else _env_float(ENV_COMFYUI_IDLE_S, COMFYUI_IDLE_S, settings)
        self.start_timeout_s = (start_timeout_s if start_timeout_s is not None else
                                _env_float(ENV_COMFYUI_START_TIMEOUT_S, COMFYUI_START_TIMEOUT_S, settings))
        self.extra_args = extra_args(settings)
        self.instances: dict[str, Instance] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._starting: set[Instance] = set()
        self.closed = False

    # --- a run's instance --------------------------------------------------------------------------
    async def acquire(self, machine_devices: Sequence[str], *, cpu: bool, env: Mapping[str, str] | None = None,
                      ) -> dict[str, Any]:
        """The warm instance of ``machine_devices`` (started now when there is none, or it died): the
        lease the run's spec carries (``started`` true when this call started it). Pair with
        :meth:`release`. Raises ComfyError when it cannot start."""
        key = instance_key(machine_devices)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            if self.closed:
                raise ComfyError("the host is stopping")
            inst = self.instances.get(key)
            started = False
            if inst is None or not inst.alive or not await self._answers(inst):
                if inst is not None:
                    log.warning("the ComfyUI instance %s (pid %s) is gone; starting a new one", key, inst.pid)
                    await self._stop(inst)
                inst = await self._start(key, list(machine_devices), cpu=cpu or key == CPU_KEY, env=env or {})
                started = True
            inst.users += 1
            inst.last_used = time.monotonic()
            if inst.idle_task is not None:
                inst.idle_task.cancel()
                inst.idle_task = None
            return inst.lease(started)

    def release(self, key: str) -> None:
        """A run of instance ``key`` ended: once no run uses it for ``idle_s``, it is stopped."""
        inst = self.instances.get(key)
        if inst is None:
            return
        inst.users = max(0, inst.users - 1)
        inst.last_used = time.monotonic()
        if inst.users == 0 and not self.closed:
            self._schedule_idle_stop(inst)

    def _schedule_idle_stop(self, inst: Instance) -> None:
        if inst.idle_task is not None:
            inst.idle_task.cancel()
        inst.idle_task = asyncio.get_running_loop().create_task(self._idle_stop(inst))

    async def _idle_stop(self, inst: Instance) -> None:
        await asyncio.sleep(self.idle_s)
        lock = self._locks.setdefault(inst.key, asyncio.Lock())
        async with lock:
            if self.instances.get(inst.key) is inst and inst.users == 0:
                log.info("ComfyUI instance %s idle for %g s; stopping it", inst.key, self.idle_s)
                inst.idle_task = None  # this task: not cancelled by _stop
                await self._stop(inst)

    async def _answers(self, inst: Instance) -> bool:
        """A live instance still answers (a hung or replaced one is started anew). ``GET /prompt`` (its queue):
        the cheapest answer of ComfyUI's loop; /system_stats reads package metadata, tens of ms per run."""
        try:
            await get_json(inst.url, "/prompt", timeout=5.0)
            return True
        except ComfyError:
            return False

    # --- start and stop --------------------------------------------------------------------------
    async def _start(self, key: str, devices: list[str], *, cpu: bool, env: Mapping[str, str]) -> Instance:
        folder = self.root / key.replace(":", "_")
        for name in FOLDERS:
            (folder / name).mkdir(parents=True, exist_ok=True)
        error = ""
        for _ in range(START_ATTEMPTS):
            inst = Instance(key, folder, devices, cpu)
            self._starting.add(inst)  # stop_all ends it too while it starts
            try:
                await self._spawn(inst, env)
                self.instances[key] = inst
                return inst
            except ComfyError as exc:
                error = str(exc)
                await self._stop(inst)
                if "address already in use" not in error.lower():
                    break
            except BaseException:  # cancelled while starting: never leave it running
                await asyncio.shield(self._stop(inst))
                raise
            finally:
                self._starting.discard(inst)
        raise ComfyError(error)

    def argv(self, inst: Instance) -> list[str]:
        """The instance's command line (see the module docstring)."""
        d = inst.folder
        argv = [self.install.python, str(self.install.path / "main.py"), "--listen", "127.0.0.1",
                "--port", str(inst.port), "--disable-auto-launch", "--output-directory", str(d / "output"),
                "--temp-directory", str(d / "temp"), "--input-directory", str(d / "input"),
                "--user-directory", str(d / "user")]
        return argv + (["--cpu"] if inst.cpu else []) + self.extra_args

    def environment(self, inst: Instance, extra: Mapping[str, str]) -> dict[str, str]:
        """The instance's environment: this host's, then the run's renumbering (its cards only)."""
        env = dict(os.environ)
        env.update({k: str(v) for k, v in extra.items()})
        env["PYTHONUNBUFFERED"] = "1"
        if inst.cpu:
            env["CUDA_VISIBLE_DEVICES"] = ""  # a --cpu instance never touches a card
        return env

    async def _spawn(self, inst: Instance, env: Mapping[str, str]) -> None:
        inst.port = free_port()
        began = time.monotonic()
        with open(inst.log_path, "ab") as out:
            out.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {' '.join(self.argv(inst))}\n".encode())
            out.flush()
            inst.proc = await asyncio.create_subprocess_exec(
                *self.argv(inst), stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=asyncio.subprocess.STDOUT,
                cwd=str(self.install.path), env=self.environment(inst, env), start_new_session=True,
                preexec_fn=_DIE_WITH_PARENT)
        log.info("starting ComfyUI instance %s (pid %s) on port %d", inst.key, inst.pid, inst.port)
        deadline = began + self.start_timeout_s
        while True:  # bounded by the start timeout
            if not inst.alive:
                raise ComfyError(f"the ComfyUI instance {inst.key} exited while starting (code "
                                 f"{inst.proc.returncode if inst.proc else None}); see {inst.log_path}:\n"
                                 f"{log_tail(inst.log_path)}")
            try:
                stats = await get_json(inst.url, "/system_stats", timeout=2.0)
                break
            except ComfyError:
                pass
            if time.monotonic() >= deadline:
                raise ComfyError(f"the ComfyUI instance {inst.key} did not answer within {self.start_timeout_s:g} s "
                                 f"({ENV_COMFYUI_START_TIMEOUT_S}); see {inst.log_path}")
            await asyncio.sleep(READY_POLL_S)
        inst.version = ((stats or {}).get("system") or {}).get("comfyui_version")
        inst.started_at = time.time()
        inst.start_s = time.monotonic() - began
        log.info("ComfyUI instance %s ready in %.1f s", inst.key, inst.start_s)

    async def _stop(self, inst: Instance) -> None:
        """End the instance's process group: SIGTERM, SIGKILL after the grace (by its PID only)."""
        if inst.idle_task is not None:
            inst.idle_task.cancel()
            inst.idle_task = None
        if self.instances.get(inst.key) is inst:
            del self.instances[inst.key]
        proc = inst.proc
        if proc is None:
            return
        if proc.returncode is None:
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), COMFYUI_STOP_GRACE_S)
            except asyncio.TimeoutError:
                _signal_group(proc.pid, signal.SIGKILL)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(proc.wait(), COMFYUI_STOP_GRACE_S)
        _signal_group(proc.pid, signal.SIGKILL)  # anything the instance left in its group

    async def stop_all(self) -> None:
        """The host is stopping: every instance ends (no new one starts)."""
        self.closed = True
        every = list(self.instances.values()) + list(self._starting)
        await asyncio.gather(*(self._stop(inst) for inst in every), return_exceptions=True)

    def kill_all(self) -> None:
        """Last resort at exit (no event loop needed): SIGKILL every instance's group."""
        for inst in list(self.instances.values()) + list(self._starting):
            if inst.alive and inst.pid is not None:
                _signal_group(inst.pid, signal.SIGKILL)

    # --- the reading ---------------------------------------------------------------------------------
    async def read(self) -> dict[str, Any]:
        """The ``comfyui`` message's fields (``ok``, ``error``, ``version``, ``path``, ``classes``,
        ``models``), read from the ``cpu`` instance (kept warm afterwards); never raises."""
        base: dict[str, Any] = {"path": str(self.install.path)}
        try:
            lease = await self.acquire(["cpu"], cpu=True)
        except ComfyError as exc:
            return {**base, "ok": False, "error": str(exc)}
        try:
            info = await read_instance(lease["url"])
            return {**base, "ok": True, "error": None, "version": lease.get("version"), **info}
        except ComfyError as exc:
            return {**base, "ok": False, "error": f"the ComfyUI at {self.install.path} could not be read: {exc}"}
        finally:
            self.release(CPU_KEY)


def _die_with_parent_fn() -> Any:
    """On Linux, a function for ``preexec_fn`` that makes the instance get SIGTERM when its host dies
    (``PR_SET_PDEATHSIG``): a host killed with SIGKILL never leaves its ComfyUIs behind. None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def set_pdeathsig() -> None:
        prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)  # only a call between fork and exec

    return set_pdeathsig


_DIE_WITH_PARENT = _die_with_parent_fn()


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)  # the instance leads its own session (start_new_session)


# --- HTTP to an instance -------------------------------------------------------------------------------

async def get_json(url: str, path: str, timeout: float = COMFYUI_HTTP_TIMEOUT_S) -> Any:
    """``GET url+path`` as JSON; ComfyError on any failure (unreachable, not 200, not JSON)."""
    import aiohttp

    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session, \
                session.get(url + path) as resp:
            if resp.status != 200:
                raise ComfyError(f"GET {path} answered {resp.status}")
            return await resp.json(content_type=None)
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as exc:
        raise ComfyError(f"GET {path} failed: {type(exc).__name__}: {exc}") from None


def reduce_input(spec: Any, required: bool) -> dict[str, Any]:
    """One ``/object_info`` input (``[type or [options], {opts}]``) as ``{type, required, options}``."""
    first = spec[0] if isinstance(spec, (list, tuple)) and spec else spec
    opts = spec[1] if isinstance(spec, (list, tuple)) and len(spec) > 1 and isinstance(spec[1], dict) else {}
    if isinstance(first, (list, tuple)):  # the old COMBO form: the options themselves
        return {"type": "COMBO", "required": required, "options": list(first)}
    kind = str(first)
    options = opts.get("options") if kind == "COMBO" else None
    return {"type": kind, "required": required, "options": list(options) if isinstance(options, list) else None}


def reduce_object_info(info: Mapping[str, Any]) -> dict[str, Any]:
    """``/object_info`` as the ``comfyui`` message's ``classes``: ``{class: {inputs, outputs}}``."""
    classes: dict[str, Any] = {}
    for name, node in info.items():
        if not isinstance(node, Mapping):
            continue
        inputs: dict[str, Any] = {}
        declared = node.get("input") or {}
        for section, required in (("required", True), ("optional", False)):
            for iname, spec in (declared.get(section) or {}).items():
                inputs[str(iname)] = reduce_input(spec, required)
        outputs = ["COMBO" if isinstance(o, (list, tuple)) else str(o) for o in (node.get("output") or [])]
        classes[str(name)] = {"inputs": inputs, "outputs": outputs}
    return classes


async def read_instance(url: str) -> dict[str, Any]:
    """``classes`` and ``models`` of the instance at ``url`` (ComfyError when it does not answer)."""
    info = await get_json(url, "/object_info", timeout=120.0)
    folders = await get_json(url, "/models")
    models: dict[str, list[str]] = {}
    for folder in folders if isinstance(folders, list) else []:
        files = await get_json(url, f"/models/{folder}")
        models[str(folder)] = sorted(str(f).replace("\\", "/") for f in files) if isinstance(files, list) else []
    return {"classes": reduce_object_info(info if isinstance(info, dict) else {}), "models": models}
