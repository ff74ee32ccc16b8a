"""What the units' parts need from the rest of the sidecar, as small interfaces (docs/services.md):

* :class:`Changes`: one change signal for every unit (the router and the control's waits sleep on it)
  and the background tasks of the units, cancelled at close;
* :class:`WorkerLinks` (a Protocol) and :class:`RegistryLinks`, its implementation over the registry's
  ``workers`` table: is a worker online, send it a message, when its connection opened;
* :class:`RankClient`: the one kept-alive HTTP client that reaches rank 0 (health checks, requests).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Protocol


class Changes:
    """The change signal of the units, and their background tasks."""

    def __init__(self) -> None:
        self._event: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    def event(self) -> asyncio.Event:
        """Set at the next change of any unit."""
        if self._event is None:
            self._event = asyncio.Event()
        return self._event

    def notify(self) -> None:
        """Something changed: wake every waiter (they take a new event before they check again)."""
        ev = self.event()
        self._event = asyncio.Event()
        ev.set()

    async def wait_for(self, pred: Callable[[], bool], timeout: float) -> bool:
        """Until ``pred()`` holds (checked at each change) or ``timeout``; whether it holds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            ev = self.event()
            if pred():
                return True
            left = deadline - loop.time()
            if left <= 0:
                return False
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(ev.wait(), left)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` in the background (cancelled by :meth:`cancel_all`)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def tasks(self) -> list[asyncio.Task[Any]]:
        return list(self._tasks)


class WorkerLinks(Protocol):
    """How the units reach the workers that run their instances."""

    def online(self, worker: str | None) -> bool: ...

    async def send(self, worker: str | None, mtype: str, **fields: Any) -> bool: ...

    def opened(self, worker: str) -> float:
        """When the worker's current connection opened (now when it has none)."""
        ...


class RegistryLinks:
    """:class:`WorkerLinks` over the registry's table of workers (name -> state with ``online`` and
    ``conn``: ``send(mtype, **fields)``, ``opened``)."""

    def __init__(self, workers: Mapping[str, Any]) -> None:
        self.workers = workers

    def online(self, worker: str | None) -> bool:
        st = self.workers.get(worker) if worker else None
        return st is not None and st.online

    async def send(self, worker: str | None, mtype: str, **fields: Any) -> bool:
        st = self.workers.get(worker) if worker else None
        if st is None or st.conn is None:
            return False
        return await st.conn.send(mtype, **fields)

    def opened(self, worker: str) -> float:
        st = self.workers.get(worker)
        return st.conn.opened if st is not None and st.conn is not None else time.time()


class RankClient:
    """The HTTP client of rank 0 servers: one connection pool, opened at start, closed at close."""

    def __init__(self) -> None:
        self.session: Any = None

    async def open(self) -> None:
        import aiohttp

        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60))

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    async def status(self, url: str, timeout: float) -> int | None:
        """GET ``url``: its status, None when it could not be reached in time."""
        import aiohttp

        try:
            async with self.session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                await resp.read()
                return resp.status
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
            return None

    def post(self, url: str, data: bytes, headers: dict[str, str], timeout: float) -> Any:
        """POST ``data`` to ``url`` (an async context manager: the response)."""
        import aiohttp

        return self.session.post(url, data=data, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout))
