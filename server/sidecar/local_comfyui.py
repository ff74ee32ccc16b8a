"""This server's own ComfyUI (``xpufleet start --comfyui PATH``, docs/workers.md "Any workflow on a fleet
card"): the same instance manager as an agent's (server/run/comfy_instances.py), its instances under
``$XPUFLEET_HOME/comfyui/local/<key>/``, so ComfyUI runs queued to "this server" run here.

A part of :class:`~.local.LocalProvider`. At start it says the provider's ComfyUI is being read
(``comfyui_probing``), reads it (a ``--cpu`` instance, kept warm as the ``cpu`` instance) and hands the
reading over (``comfyui_read``: what the door checks a ComfyUI run against), each time telling the
dispatcher (``on_change``: runs waiting for the reading are resolved again).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ...constants import LOCAL_PROVIDER, RUN_KIND_COMFYUI
from ..devices import renumbering as devren
from ..run.comfy_instances import ComfyError, ComfyInstall, ComfyInstances, instance_key
from ..run.spec import RunSpec

log = logging.getLogger("xpufleet.providers")

NO_COMFYUI = ("this server has no ComfyUI to run workflows: start it with --comfyui PATH (the ComfyUI folder), "
              "or queue the run on a worker whose agent has one")


def is_comfyui(spec: RunSpec) -> bool:
    """Whether a run's spec is a ComfyUI run (its host must lease it an instance)."""
    return spec.kind == RUN_KIND_COMFYUI


class LocalComfy:
    """This server's ComfyUI: its instances and its reading (see the module docstring)."""

    def __init__(self, install: ComfyInstall, home: Path, provider: Any,
                 on_change: Callable[[], None] | None = None) -> None:
        self.instances = ComfyInstances(install, home, LOCAL_PROVIDER)
        self.provider = provider
        self.on_change = on_change
        self.info: dict[str, Any] | None = None  # the `comfyui` message's fields, once read
        self._task: asyncio.Task[None] | None = None

    def _tell(self, method: str, *args: Any) -> None:
        """The provider's state of its ComfyUI (its methods, where the routing reads it), then the dispatcher."""
        update = getattr(self.provider, method, None)
        if update is not None:
            update(*args)
        if self.on_change is not None:
            self.on_change()

    def start(self) -> None:
        """Read the ComfyUI in the background; ComfyUI runs for this server wait until it is read."""
        if self._task is None:
            self._tell("comfyui_probing")
            self._task = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        info = await self.instances.read()
        self.info = info
        if info.get("ok"):
            log.info("this server's ComfyUI %s read: %d node classes", info.get("version"),
                     len(info.get("classes") or {}))
        else:
            log.warning("this server's ComfyUI could not be read: %s", info.get("error"))
        self._tell("comfyui_read", info)

    async def lease(self, devices: Sequence[str]) -> dict[str, Any]:
        """The instance of a run's devices (its cards only); ComfyError with the run's error."""
        cpu = all(d == "cpu" for d in devices)
        try:
            return await self.instances.acquire(devices, cpu=cpu, env=devren.renumber(list(devices)).env)
        except ComfyError as exc:
            raise ComfyError(f"the ComfyUI on this server {','.join(devices)} could not start: {exc}") from None

    def release(self, devices: Sequence[str]) -> None:
        """A run of these devices ended."""
        self.instances.release(instance_key(devices))

    async def stop(self) -> None:
        """The server is stopping: the reading is abandoned, every instance ends."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.instances.stop_all()


async def lease_for(comfy: LocalComfy | None, devices: Sequence[str]) -> dict[str, Any]:
    """A ComfyUI run's instance on this server, or ComfyError when it has no ComfyUI."""
    if comfy is None:
        raise ComfyError(NO_COMFYUI)
    return await comfy.lease(devices)
