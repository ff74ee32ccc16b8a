"""The sidecar's own provider (target ``local``, docs/sidecar.md): this machine's devices, one child process
per run, so a crash or an out-of-memory kill never takes the sidecar down."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ...constants import LOCAL_PROVIDER, RUN_STOP_GRACE_S, RUNS_DIR_NAME
from ..comfyflow.reading import STATE_NONE, STATE_PROBING, Reading, reading_of
from ..devices.inventory import Inventory
from ..run.comfy_instances import ComfyError, ComfyInstall
from ..run.host import RunProcess
from ..run.launcher import member_env
from ..run.spec import RunSpec, build_spec
from ..run.warm import default_starter
from ..scheduling import DeviceOffer
from .local_comfyui import LocalComfy, is_comfyui, lease_for
from .providers import RunHost

log = logging.getLogger("xpufleet.providers")



def probe_local_devices(home: Path) -> list[dict[str, Any]]:
    """This machine's devices (CPU first; CUDA via NVML with UUIDs, xpu/mps via torch only when present).

    Uses the worker agent's inventory (server/devices/) so a card has the same UUID whether the
    sidecar or a same-machine worker offers it (docs/sidecar.md: one physical card, one slot).
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


INTERRUPTED = "the server was stopped while this run was executing"  # the runner's own text (run/runner.py)
RUN_PACKAGES = ("torch", "numpy", "safetensors", "sklearn")  # what the nodes import: the `train` extra


def local_runs_refusal(find: Callable[[str], Any] = importlib.util.find_spec) -> str:
    """Why this server cannot run graphs itself ("" when it can): a control-plane host installed without
    the ``train`` extra still queues runs and routes them to workers (docs/install.md)."""
    missing = [name for name in RUN_PACKAGES if find(name) is None]
    if not missing:
        return ""
    return (f"this server cannot run graphs: {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not "
            f"installed here (pip install 'xpufleet[train]'); queue the run on a worker instead (target any, "
            f"or a worker's name)")


class LocalProvider:
    """The sidecar's own provider: this machine's devices, one process group per run (the launcher)."""

    is_local = True
    online = True
    draining = False

    def __init__(self, home: Path, host: RunHost, devices: Sequence[dict[str, Any]],
                 stop_grace_s: float = RUN_STOP_GRACE_S, cannot_run: str = "",
                 comfyui: ComfyInstall | None = None, on_comfyui_change: Callable[[], None] | None = None) -> None:
        self.name = LOCAL_PROVIDER
        self.cannot_run = cannot_run  # non-empty: this host lacks what runs graphs (local_runs_refusal)
        # `xpufleet start --comfyui PATH`: its ComfyUI runs in headless instances of this server's (local_comfyui.py)
        self.comfy = LocalComfy(comfyui, home, self, on_comfyui_change) if comfyui is not None else None
        self._comfy_runs: dict[str, list[str]] = {}  # run id -> the devices whose instance it holds
        self.home = Path(home)
        self.host = host
        self._details = [dict(d) for d in devices]
        self._devices = offers_from(devices)
        self.stop_grace_s = stop_grace_s
        self.runs: dict[str, RunProcess] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._cancel_before_start: set[str] = set()
        # This server's ComfyUI (sidecar --comfyui PATH): "none" until one is announced (then "probing") and
        # read (:meth:`comfyui_read`); the routing checks a ComfyUI run against it (comfyflow/check.py).
        self.comfyui_state = STATE_NONE
        self.comfyui_reading: Reading | None = None

    def comfyui_probing(self) -> None:
        """A ComfyUI was given to this server: ComfyUI runs for it wait until it is read."""
        self.comfyui_state = STATE_PROBING

    def comfyui_read(self, info: Mapping[str, Any]) -> None:
        """This server's ComfyUI was read (``info``: the agent protocol's ``comfyui`` message's fields); the
        caller tells the dispatcher (``providers_changed``) so waiting runs are resolved again."""
        self.comfyui_reading = reading_of(info)
        self.comfyui_state = self.comfyui_reading.state

    def devices(self) -> list[DeviceOffer]:
        return list(self._devices)

    def device_details(self) -> list[dict[str, Any]]:
        """The devices as probed at start (total/free GiB): the memory ledger's first figures."""
        return [{**d, "name": "mps:0" if d.get("name") == "mps" else d.get("name")} for d in self._details]

    def run_dir(self, run_id: str) -> Path:
        return self.home / RUNS_DIR_NAME / run_id

    def spec_for(self, run: dict[str, Any], devices: list[str]) -> RunSpec:
        """The spec of a local run: no renumbering; the run's devices first, then the machine's others
        (a node may still name any device this machine has; ``auto`` follows the first)."""
        machine = [d.name for d in self._devices]
        ordered = list(devices) + [d for d in machine if d not in devices]
        return build_spec(run, placement="local", slot_devices=devices, run_devices=ordered,
                          aliases={d: d for d in ordered}, visible_devices=machine)

    def start_comfyui(self) -> None:
        """Read this server's ComfyUI in the background (``--comfyui``; nothing without one)."""
        if self.comfy is not None:
            self.comfy.start()

    async def start_run(self, run: dict[str, Any], devices: list[str]) -> None:
        run_id = run["id"]
        run_dir = self.run_dir(run_id)
        env = member_env(None, {})
        env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # cuda:N = NVML's N (UUIDs match)
        group = RunProcess(run_id, run_dir, env,
                           lambda rank, events: self.host.ingest(run_id, events) if rank == 0 else None,
                           starter=default_starter(), stop_grace_s=self.stop_grace_s)
        self.runs[run_id] = group
        if run_id in self._cancel_before_start:
            self._cancel_before_start.discard(run_id)
            group.stop("cancel")
        leased = False
        try:
            # the spec holds the whole graph: built and written off the loop (seconds for 5,000 nodes, issue 19)
            spec = await asyncio.to_thread(self.spec_for, run, devices)
            if is_comfyui(spec):  # its instance first (a cold start takes seconds; the run waits assigned)
                spec.comfyui = await lease_for(self.comfy, devices)
                leased = True
            await asyncio.to_thread(spec.write, run_dir)
            await group.start()
        except ComfyError as exc:
            self.runs.pop(run_id, None)
            self.host.run_ended(run_id, "failed", str(exc))
            return
        except BaseException:
            self.runs.pop(run_id, None)
            if leased and self.comfy is not None:
                self.comfy.release(devices)
            raise
        if leased:
            self._comfy_runs[run_id] = list(devices)  # its instance is released when the run ends
        self.host.run_process_started(run_id, group.pid)
        self._tasks[run_id] = asyncio.create_task(self._watch(run_id, group))

    async def _watch(self, run_id: str, group: RunProcess) -> None:
        try:
            result = await group.wait()
        finally:
            self.runs.pop(run_id, None)
            self._tasks.pop(run_id, None)
            held = self._comfy_runs.pop(run_id, None)
            if held is not None and self.comfy is not None:
                self.comfy.release(held)
        # Every process of the run is gone: only now its result, and with it the slot, is released.
        if result.finished_event is not None:
            self.host.ingest(run_id, [result.finished_event])
        if not self.host.is_finished(run_id):
            ending = group.ending(result, interrupted=INTERRUPTED)
            self.host.run_ended(run_id, ending.status, ending.error)

    async def cancel(self, run_id: str) -> bool:
        group = self.runs.get(run_id)
        if group is None:
            # Not spawned yet: start_run applies the stop once the run's group exists.
            self._cancel_before_start.add(run_id)
            return False
        group.stop("cancel")
        return True

    async def shutdown(self) -> None:
        """Server stopping: ask every run to stop (they end ``interrupted``), kill after the grace."""
        groups = list(self.runs.values())
        for group in groups:
            group.stop("interrupt")
        tasks = list(self._tasks.values())
        if tasks:
            await asyncio.wait(tasks, timeout=self.stop_grace_s + 5)
        for group in groups:
            group.kill()
        if self.comfy is not None:
            await self.comfy.stop()
