"""An agent's ComfyUI (docs/workers.md, "Any workflow on a fleet card"): its headless instances
(server/run/comfy_instances.py) and the reading the sidecar checks ComfyUI runs against.

A component of :class:`~.agent.Agent`: given the config and a ``send`` callable. An agent started with a
ComfyUI says ``comfyui`` in hello's capabilities at once, reads its ComfyUI in the background (a ``--cpu``
instance, kept as the warm ``cpu`` instance) and sends the ``comfyui`` message after each welcome once the
reading is done. Runs of kind ``comfyui`` lease the instance of their device set (:meth:`lease`) and give it
back when they end (:meth:`release`); every instance stops with the agent.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ...constants import AGENT_CAP_COMFYUI
from ..run.comfy_instances import ComfyError, ComfyInstances, instance_key
from ..workers import protocol
from .config import AgentConfig

log = logging.getLogger("xpufleet.agent")

Send = Callable[[str], Awaitable[bool]]


def no_comfyui_text(worker: str) -> str:
    """Why a worker without a ComfyUI takes no ComfyUI run (the door's text, helper B's check)."""
    return f"worker {worker} has no ComfyUI to run workflows: start its agent with --comfyui PATH (the ComfyUI folder)"


class AgentComfy:
    """The agent's ComfyUI, when it was given one (``cfg.comfyui``)."""

    def __init__(self, cfg: AgentConfig, send: Send, connected: Callable[[], bool]) -> None:
        self.cfg = cfg
        self.send = send
        self.connected = connected
        self.instances = ComfyInstances(cfg.comfyui, cfg.home, cfg.name) if cfg.comfyui is not None else None
        self.reading: dict[str, Any] | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def enabled(self) -> bool:
        return self.instances is not None

    def capabilities(self) -> list[str]:
        """What hello adds: ``comfyui`` when a reading is coming."""
        return [AGENT_CAP_COMFYUI] if self.enabled else []

    def start(self) -> None:
        """Read the ComfyUI in the background (the agent connects meanwhile)."""
        if self.instances is not None and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        assert self.instances is not None
        log.info("reading the ComfyUI at %s", self.instances.install.path)
        self.reading = await self.instances.read()
        if self.reading.get("ok"):
            log.info("ComfyUI %s read: %d node classes", self.reading.get("version"),
                     len(self.reading.get("classes") or {}))
        else:
            log.warning("the ComfyUI could not be read: %s", self.reading.get("error"))
        if self.connected():
            await self.send_reading()

    async def send_reading(self) -> None:
        """The ``comfyui`` message, when the reading is done (else it goes when it is)."""
        if self.reading is not None:
            await self.send(protocol.encode("comfyui", **self.reading))

    async def after_welcome(self) -> None:
        """A new connection: the sidecar gets the reading again."""
        await self.send_reading()

    async def lease(self, machine_devices: Sequence[str], *, cpu: bool, env: dict[str, str]) -> dict[str, Any]:
        """The instance of a run's cards (started when there is none); raises ComfyError with the text the
        run fails with."""
        if self.instances is None:
            raise ComfyError(no_comfyui_text(self.cfg.name))
        try:
            return await self.instances.acquire(machine_devices, cpu=cpu, env=env)
        except ComfyError as exc:
            raise ComfyError(f"the ComfyUI on {self.cfg.name} {','.join(machine_devices)} could not start: "
                             f"{exc}") from None

    def release(self, machine_devices: Sequence[str]) -> None:
        """A run of these cards ended."""
        if self.instances is not None:
            self.instances.release(instance_key(machine_devices))

    async def stop_all(self) -> None:
        """The agent is stopping: every instance ends."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self.instances is not None:
            await self.instances.stop_all()
