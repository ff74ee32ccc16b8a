"""The sidecar's own provider (target ``local``, SPEC Q2): this machine's devices, one child process
per run, so a crash or an out-of-memory kill never takes the sidecar down."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...constants import LOCAL_PROVIDER, RUN_STOP_GRACE_S, RUNS_DIR_NAME
from ..devices.inventory import Inventory
from ..run.events import describe_exit, parse_event_line
from ..scheduling import DeviceOffer
from .providers import RunHost

log = logging.getLogger("xpufleet.providers")

RUNNER_MODULE = "xpufleet.server.run.runner"
MAX_EVENT_LINE_BYTES = 64 * 1024 * 1024


def probe_local_devices(home: Path) -> list[dict[str, Any]]:
    """This machine's devices (CPU first; CUDA via NVML with UUIDs, xpu/mps via torch only when present).

    Uses the worker agent's inventory (server/devices/) so a card has the same UUID whether the
    sidecar or a same-machine worker offers it (SPEC Q5: one physical card, one slot).
    """
    return Inventory(LOCAL_PROVIDER, home).snapshot()


def offers_from(devices: Sequence[dict[str, Any]]) -> list[DeviceOffer]:
    out = []
    for d in devices:
        name = str(d["name"])
        if name == "mps":
            name = "mps:0"
        out.append(DeviceOffer(name=name, kind=str(d.get("kind") or name.split(":")[0]),
                               uuid=d.get("uuid") or None, total_gib=d.get("total_gib")))
    return out


class _EventPipe(asyncio.Protocol):
    """Reads the child's JSON-lines event pipe and hands each chunk's complete lines over at once."""

    def __init__(self, run_id: str, on_events: Any) -> None:
        self.run_id = run_id
        self.on_events = on_events
        self.buf = bytearray()
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if b"\n" not in data:
            if len(self.buf) > MAX_EVENT_LINE_BYTES:
                log.warning("run %s: dropping an event line over %d bytes", self.run_id, MAX_EVENT_LINE_BYTES)
                self.buf.clear()
            return
        *lines, rest = bytes(self.buf).split(b"\n")
        self.buf = bytearray(rest)
        self._deliver(lines)

    def _deliver(self, lines: list[bytes]) -> None:
        events = []
        for line in lines:
            ev = parse_event_line(line)
            if ev is None:
                if line.strip():
                    log.warning("run %s: ignoring a malformed event line %r", self.run_id, line[:200])
                continue
            events.append(ev)
        if events:
            try:
                self.on_events(self.run_id, events)
            except Exception:  # noqa: BLE001 - a store failure must not kill the reader
                log.exception("run %s: storing events failed", self.run_id)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self.buf.strip():
            self._deliver([bytes(self.buf)])
        self.buf.clear()
        if not self.closed.done():
            self.closed.set_result(None)


class _LocalRun:
    def __init__(self, run_id: str, run_dir: Path) -> None:
        self.run_id = run_id
        self.run_dir = run_dir
        self.proc: asyncio.subprocess.Process | None = None
        self.task: asyncio.Task[None] | None = None
        self.stop_reason: str | None = None  # "cancel" | "interrupt"
        self.kill_handle: asyncio.TimerHandle | None = None


class LocalProvider:
    """The sidecar's own provider: this machine's devices, one child process per run."""

    is_local = True
    online = True
    draining = False

    def __init__(self, home: Path, host: RunHost, devices: Sequence[dict[str, Any]],
                 stop_grace_s: float = RUN_STOP_GRACE_S) -> None:
        self.name = LOCAL_PROVIDER
        self.home = Path(home)
        self.host = host
        self._details = [dict(d) for d in devices]
        self._devices = offers_from(devices)
        self.stop_grace_s = stop_grace_s
        self.runs: dict[str, _LocalRun] = {}
        self._cancel_before_start: set[str] = set()

    def devices(self) -> list[DeviceOffer]:
        return list(self._devices)

    def device_details(self) -> list[dict[str, Any]]:
        """The devices as probed at start (total/free GiB): the memory ledger's first figures."""
        return [{**d, "name": "mps:0" if d.get("name") == "mps" else d.get("name")} for d in self._details]

    def run_dir(self, run_id: str) -> Path:
        return self.home / RUNS_DIR_NAME / run_id

    def spec_for(self, run: dict[str, Any], devices: list[str]) -> dict[str, Any]:
        """spec.json of a local run: no renumbering; the run's devices first, then the machine's others
        (a node may still name any device this machine has, as before; ``auto`` follows the first)."""
        machine = [d.name for d in self._devices]
        ordered = list(devices) + [d for d in machine if d not in devices]
        return {
            "run_id": run["id"],
            "graph": run["graph"],
            "options": run.get("options") or {},
            "devices": ordered,
            "device_aliases": {d: d for d in ordered},
            "placement": "local",
            "simulated": False,
            "budget_gib": run.get("budget_gib"),  # a card admitted by memory (XPUFLEET_LOCAL_SHARED_CARDS)
            "env": {},
            "execution_facts": {
                "placement": "local",
                "slot_devices": list(devices),
                "visible_devices": machine,
                "device_aliases": {d: d for d in ordered},
            },
        }

    async def start_run(self, run: dict[str, Any], devices: list[str]) -> None:
        run_id = run["id"]
        run_dir = self.run_dir(run_id)
        run_dir.mkdir(parents=True, exist_ok=True)
        spec = self.spec_for(run, devices)
        tmp = run_dir / "spec.json.tmp"
        tmp.write_text(json.dumps(spec, indent=1), encoding="utf-8")
        os.replace(tmp, run_dir / "spec.json")
        lr = _LocalRun(run_id, run_dir)
        self.runs[run_id] = lr
        env = dict(os.environ)
        env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # cuda:N = NVML's N (UUIDs match)
        env["PYTHONUNBUFFERED"] = "1"
        read_fd, write_fd = os.pipe()
        try:
            with open(run_dir / "output.log", "ab") as out:
                lr.proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", RUNNER_MODULE, str(run_dir), "--events-fd", str(write_fd),
                    stdin=asyncio.subprocess.PIPE, stdout=out, stderr=asyncio.subprocess.STDOUT,
                    pass_fds=(write_fd,), env=env, cwd=str(run_dir), start_new_session=True,
                )
        except BaseException:
            os.close(read_fd)
            self.runs.pop(run_id, None)
            self._cancel_before_start.discard(run_id)
            raise
        finally:
            os.close(write_fd)
        self.host.run_process_started(run_id, lr.proc.pid)
        loop = asyncio.get_running_loop()
        transport, proto = await loop.connect_read_pipe(
            lambda: _EventPipe(run_id, self.host.ingest), os.fdopen(read_fd, "rb", buffering=0)
        )
        lr.task = asyncio.create_task(self._watch(lr, transport, proto))
        if run_id in self._cancel_before_start:
            self._cancel_before_start.discard(run_id)
            self._stop(lr, "cancel")

    async def _watch(self, lr: _LocalRun, transport: asyncio.BaseTransport, proto: _EventPipe) -> None:
        assert lr.proc is not None
        try:
            await proto.closed
            rc = await lr.proc.wait()
        finally:
            transport.close()
            if lr.kill_handle is not None:
                lr.kill_handle.cancel()
            self.runs.pop(lr.run_id, None)
        if not self.host.is_finished(lr.run_id):
            self.host.run_ended(lr.run_id, *self._death(lr, rc))

    def _death(self, lr: _LocalRun, rc: int) -> tuple[str, str]:
        if lr.stop_reason == "interrupt":
            return "interrupted", "the server was stopped while this run was executing"
        if lr.stop_reason == "cancel":
            return "cancelled", f"cancelled; the run did not stop within {self.stop_grace_s:g} s and was killed"
        verb = "was " if rc < 0 else ""
        return "failed", f"the run's process {verb}{describe_exit(rc)}; see its log"

    def _stop(self, lr: _LocalRun, reason: str) -> None:
        proc = lr.proc
        if proc is None or proc.returncode is not None:
            return
        if lr.stop_reason is None or reason == "interrupt":
            lr.stop_reason = reason
        with contextlib.suppress(Exception):
            assert proc.stdin is not None
            proc.stdin.write(f"{'stop' if reason == 'cancel' else 'interrupt'}\n".encode())
        if lr.kill_handle is None:
            lr.kill_handle = asyncio.get_running_loop().call_later(self.stop_grace_s, self._kill, proc)

    @staticmethod
    def _kill(proc: asyncio.subprocess.Process) -> None:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)

    async def cancel(self, run_id: str) -> bool:
        lr = self.runs.get(run_id)
        if lr is None or lr.proc is None:
            # Not spawned yet (or spawning right now): start_run applies the stop once the child exists.
            self._cancel_before_start.add(run_id)
            return False
        self._stop(lr, "cancel")
        return True

    async def shutdown(self) -> None:
        """Server stopping: ask every run to stop (they end ``interrupted``), kill after the grace."""
        runs = list(self.runs.values())
        for lr in runs:
            self._stop(lr, "interrupt")
        tasks = [lr.task for lr in runs if lr.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=self.stop_grace_s + 5)
        for lr in runs:
            if lr.proc is not None:
                self._kill(lr.proc)
