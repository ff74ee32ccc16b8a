"""``POST /api/services/{name}/infer`` (docs/services.md): each request goes to rank 0 of a ready unit.

The body is forwarded unchanged to rank 0's infer path over one kept-alive HTTP connection pool; the
answer comes back unchanged with ``X-Xpufleet-Unit`` and ``X-Xpufleet-Generation``. The unit is chosen
by routing.py (least outstanding requests among ready units). When no unit is ready (a restart, an
update's hand-over) the request waits for one, at most ``routing.wait_s``; then ``503`` says why.

A request whose rank 0 cannot be reached (connection refused or reset: the unit failed under it), or
whose rank 0 answers ``503`` with ``X-Xpufleet-Unit-Broken`` (the built-in model server's group broke),
takes that unit out of routing and is sent again to a ready unit within the same bound: inference
requests must be safe to repeat (they are for the built-in model server and inference engines).

Rank 0 is reached at the address its agent listens on (``MASTER_ADDR``: the address the agent uses
to reach this sidecar, loopback in tests); its server must answer this sidecar directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from ...common.errors import ApiError
from .envcontract import BROKEN_HEADER
from .routing import RouteView, choose_unit, no_unit_reason

if TYPE_CHECKING:
    from .manager import UnitManager

log = logging.getLogger("xpufleet.units")

class Router:
    """The request path of the services of one :class:`~.manager.UnitManager`."""

    def __init__(self, manager: UnitManager) -> None:
        self.m = manager

    async def infer(self, name: str, body: bytes, content_type: str | None) -> tuple[int, bytes, dict[str, str]]:
        """Forward one request; ``(status, body, headers)`` of rank 0's answer. Raises ApiError 503/504."""
        import aiohttp

        svc = self.m.get(name)
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + svc.spec.route_wait_s
        headers = {"Content-Type": content_type or "application/json"}
        last_error = ""
        while True:
            ev = self.m.change_event()
            if svc.deleting:
                raise ApiError(503, f"service {name} is being deleted")
            if last_error and loop.time() >= deadline:
                raise ApiError(503, f"service {name}: no unit answered within {svc.spec.route_wait_s:g} s "
                                    f"(routing.wait_s); last error: {last_error}")
            units = svc.units
            views = [RouteView(u.id, u.state == "ready", u.outstanding, u.routed, u.index, u.state, u.detail)
                     for u in units]
            chosen = choose_unit(views)
            if chosen is None:
                left = deadline - loop.time()
                if left <= 0:
                    why = no_unit_reason(name, views, round(loop.time() - started, 2))
                    raise ApiError(503, why + (f"; last error: {last_error}" if last_error else ""))
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(ev.wait(), left)
                continue
            unit = next(u for u in units if u.id == chosen)
            spec = self.m.spec_of(unit)
            generation = unit.generation
            url = self.m.rank0_url(unit, spec.infer_path)
            unit.outstanding += 1
            unit.routed += 1
            try:
                async with self.m.session.post(url, data=body, headers=headers,
                                               timeout=aiohttp.ClientTimeout(total=spec.request_timeout_s)) as resp:
                    payload = await resp.read()
                    status = resp.status
                    broken = BROKEN_HEADER in resp.headers
                    out_type = resp.headers.get("Content-Type", "application/json")
            except asyncio.TimeoutError:
                raise ApiError(504, f"unit {unit.id} of service {name} did not answer within "
                                    f"{spec.request_timeout_s:g} s (routing.request_timeout_s)") from None
            except (aiohttp.ClientError, OSError) as exc:
                last_error = f"unit {unit.id}: {type(exc).__name__}: {exc}"
                if unit.generation == generation:
                    self.m.rank0_unreachable(unit, str(exc) or type(exc).__name__)
                continue
            finally:
                unit.outstanding -= 1
                if unit.state == "draining":
                    self.m._changed()
            if broken:
                last_error = f"unit {unit.id}: " + payload.decode("utf-8", "replace")[:300]
                if unit.generation == generation:
                    self.m.rank0_unreachable(unit, "its process group broke")
                continue
            return status, payload, {"Content-Type": out_type, "X-Xpufleet-Unit": unit.id,
                                     "X-Xpufleet-Generation": str(generation)}

