"""A worker as the dispatcher sees it (the Provider protocol of sidecar/providers.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from ..scheduling import DeviceOffer
from .state import AgentLink, WorkerState

SendStart = Callable[[AgentLink, dict[str, Any], list[str]], Awaitable[bool]]


class WorkerProvider:
    """A worker as the dispatcher sees it (docs/sidecar.md): devices with UUIDs, start and cancel."""

    is_local = False

    def __init__(self, workers: dict[str, WorkerState], name: str, is_disabled: Callable[[str], bool],
                 send_start: SendStart) -> None:
        """``workers``: the shared worker table's dict; ``is_disabled``: an SSH worker the user disabled;
        ``send_start``: sends ``start_run`` on a connection (session.py)."""
        self.workers = workers
        self.name = name
        self.is_disabled = is_disabled
        self.send_start = send_start

    @property
    def _state(self) -> WorkerState | None:
        return self.workers.get(self.name)

    @property
    def online(self) -> bool:
        st = self._state
        return st is not None and st.online

    @property
    def draining(self) -> bool:
        st = self._state
        return st is None or st.drained or self.disabled or (st.one_shot and st.taken is not None)

    @property
    def disabled(self) -> bool:
        """An SSH worker the user disabled: listed, never given a new run."""
        return self.is_disabled(self.name)

    @property
    def note(self) -> str:
        st = self._state
        if self.disabled:
            return f"is disabled (xpufleet workers enable {self.name})"
        if st is not None and st.one_shot and st.taken is not None:
            return "has taken its one run (one-shot)"
        return ""

    @property
    def mounts(self) -> frozenset[str]:
        st = self._state
        return frozenset(st.mounts) if st is not None else frozenset()

    def claim(self, run_id: str) -> bool:
        """The dispatcher is about to place ``run_id`` here: a one-shot worker takes one run, ever."""
        st = self._state
        if st is None or not st.one_shot:
            return True
        if st.taken is not None and st.taken != run_id:
            return False
        st.taken = run_id
        return True

    @property
    def one_shot(self) -> bool:
        st = self._state
        return st is not None and st.one_shot

    @property
    def comfyui_state(self) -> str:
        """Its ComfyUI: ``none``, ``probing``, ``ready`` or ``failed`` (server/comfyflow/reading.py)."""
        st = self._state
        return st.comfyui_state if st is not None else "none"

    @property
    def comfyui_reading(self) -> Any:
        """The comfyflow Reading of its ComfyUI (None until its agent sent one)."""
        st = self._state
        return st.comfyui if st is not None else None

    @property
    def capabilities(self) -> tuple[str, ...]:
        """What the connected agent announced in its hello (``memory_cap``: it caps budgeted runs)."""
        st = self._state
        return st.capabilities if st is not None else ()

    def device_details(self) -> list[dict[str, Any]]:
        """The devices as the last heartbeat reported them (total/free GiB, simulated)."""
        st = self._state
        return list(st.devices) if st is not None else []

    def devices(self) -> list[DeviceOffer]:
        st = self._state
        if st is None:
            return []
        return [DeviceOffer(name=str(d["name"]), kind=str(d["kind"]), uuid=d.get("uuid") or None,
                            total_gib=d.get("total_gib")) for d in st.devices]

    async def start_run(self, run: dict[str, Any], devices: list[str]) -> None:
        """Send ``start_run``; the agent's events then arrive through the registry."""
        st = self._state
        if st is None or st.conn is None:
            raise RuntimeError(f"worker {self.name} disconnected before the run could be sent to it")
        if run.get("budget_gib") is not None:
            from ..memory.admission import can_cap, cap_refusal

            if not can_cap(self):
                raise RuntimeError(cap_refusal(self.name))
        if not await self.send_start(st.conn, run, devices):
            raise RuntimeError(f"worker {self.name} disconnected before the run could be sent to it")

    @property
    def peer(self) -> str | None:
        """The address the agent's connection comes from (None while it is not connected)."""
        st = self._state
        return st.conn.peer if st is not None and st.conn is not None else None

    async def send(self, mtype: str, **fields: Any) -> bool:
        """Send one message to the agent (False while it is not connected)."""
        st = self._state
        return st is not None and st.conn is not None and await st.conn.send(mtype, **fields)

    async def cancel(self, run_id: str) -> bool:
        """Ask the agent to stop the run (sent again after a reconnect if it is offline now)."""
        st = self._state
        if st is None or st.conn is None:
            return False
        return await st.conn.send("cancel_run", run_id=run_id, reason="cancelled by request")

