"""The request path (docs/services.md) in this process: rank 0 stand-ins are real aiohttp servers on loopback;
the manager, store and dispatcher are the real ones. Requests go to rank 0 of a ready unit only, wait
(bounded) when none is ready, answer 503 with the reason, and move off a unit that fails under them."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import pytest
from aiohttp import web

from xpufleet.common.errors import ApiError
from xpufleet.server.sidecar.dispatcher import Dispatcher
from xpufleet.server.sidecar.store import Store
from xpufleet.server.units.envcontract import BROKEN_HEADER
from xpufleet.server.units.manager import UnitManager
from xpufleet.server.units.records import Instance, Service, Unit
from xpufleet.server.units.spec import parse_service


class NoWorkers:
    """The registry's surface the manager uses, without agents."""

    def __init__(self) -> None:
        self.workers: dict[str, Any] = {}
        self.message_handlers: dict[str, Any] = {}
        self.connection_listeners: list[Any] = []


async def rank0(name: str, delay: float = 0.0, broken: bool = False) -> tuple[web.AppRunner, int, list[Any]]:
    """A stand-in for rank 0: echoes the request with its name after ``delay``."""
    seen: list[Any] = []

    async def infer(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body)
        await asyncio.sleep(delay)
        if broken:
            return web.json_response({"error": "group broke"}, status=503, headers={BROKEN_HEADER: "1"})
        return web.json_response({"echo": body, "by": name})

    async def health(request: web.Request) -> web.Response:  # like the model server: 503 once broken
        return web.json_response({"status": "broken" if broken else "ok"}, status=503 if broken else 200)

    app = web.Application()
    app.router.add_post("/infer", infer)
    app.router.add_get("/health", health)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, runner.addresses[0][1], seen


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ready_unit(svc: Service, index: int, port: int, state: str = "ready") -> Unit:
    u = Unit(id=f"{svc.name}-{index}", service=svc.name, version=1, index=index, state=state, generation=2,
             barrier_passed=True, master_addr="127.0.0.1",
             instances=[Instance(rank=0, worker="w", device="cuda:0", generation=2, state="arrived", port=port)])
    svc.units.append(u)
    return u


async def with_manager(tmp_path, scenario, wait_s: float = 2.0) -> None:
    store = Store(tmp_path / "state.db")
    m = UnitManager(store, Dispatcher(store, tmp_path), NoWorkers())
    await m.start()
    spec = parse_service({"name": "svc", "program": {"model": {"path": "m.safetensors"}},
                          "routing": {"wait_s": wait_s, "request_timeout_s": 5}})
    svc = Service(name="svc", version=1, specs={1: spec})
    m.services["svc"] = svc
    try:
        await scenario(m, svc)
    finally:
        await m.close()
        store.close()


def infer(m: UnitManager, body: Any) -> Any:
    return m.router.infer("svc", json.dumps(body).encode(), "application/json")


def test_a_request_reaches_rank_0_of_a_ready_unit(tmp_path):
    async def scenario(m: UnitManager, svc: Service) -> None:
        runner, port, seen = await rank0("a")
        ready_unit(svc, 1, port)
        ready_unit(svc, 2, closed_port(), state="starting")  # never chosen: not ready
        status, payload, headers = await infer(m, {"inputs": [[1.0]]})
        assert status == 200 and json.loads(payload) == {"echo": {"inputs": [[1.0]]}, "by": "a"}
        assert headers["X-Xpufleet-Unit"] == "svc-1" and headers["X-Xpufleet-Generation"] == "2"
        assert seen == [{"inputs": [[1.0]]}] and svc.units[0].routed == 1 and svc.units[0].outstanding == 0
        with pytest.raises(ApiError) as info:
            await m.router.infer("nope", b"{}", None)
        assert info.value.status == 404
        await runner.cleanup()

    asyncio.run(with_manager(tmp_path, scenario))


def test_least_outstanding_requests_spread_over_units(tmp_path):
    async def scenario(m: UnitManager, svc: Service) -> None:
        servers = [await rank0(n, delay=0.3) for n in "ab"]
        for i, (_, port, _) in enumerate(servers, start=1):
            ready_unit(svc, i, port)
        answers = await asyncio.gather(*(infer(m, {"i": i}) for i in range(6)))
        by = [json.loads(p)["by"] for _, p, _ in answers]
        assert sorted(by) == ["a", "a", "a", "b", "b", "b"]
        assert [u.routed for u in svc.units] == [3, 3] and [u.outstanding for u in svc.units] == [0, 0]
        for runner, _, _ in servers:
            await runner.cleanup()

    asyncio.run(with_manager(tmp_path, scenario))


WAIT_BOUND_S = 30.0  # the routing's wait bound in the test below: far beyond a loaded machine's delays


def test_a_request_waits_for_a_unit_to_become_ready(tmp_path):
    async def scenario(m: UnitManager, svc: Service) -> None:
        runner, port, _ = await rank0("a")
        unit = ready_unit(svc, 1, port, state="restarting")
        loop = asyncio.get_running_loop()

        def ready() -> None:
            unit.set_state("ready")
            m._changed(unit)

        loop.call_later(0.3, ready)
        t0 = loop.time()
        status, _, headers = await infer(m, {"x": 1})
        assert status == 200 and headers["X-Xpufleet-Unit"] == "svc-1"
        # it waited for the unit (ready after 0.3 s), not for the bound: only waiting out the 30 s crosses 15
        assert 0.25 <= loop.time() - t0 < WAIT_BOUND_S / 2
        await runner.cleanup()

    asyncio.run(with_manager(tmp_path, scenario, wait_s=WAIT_BOUND_S))


def test_503_with_the_reason_when_no_unit_becomes_ready(tmp_path):
    async def scenario(m: UnitManager, svc: Service) -> None:
        unit = ready_unit(svc, 1, closed_port(), state="restarting")
        unit.detail = "rank 1 killed by SIGKILL; generation 3 in 0.5 s"
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(ApiError) as info:
            await infer(m, {"x": 1})
        assert info.value.status == 503 and loop.time() - t0 >= 0.5
        assert info.value.message.startswith("service svc has no ready unit after waiting 0.5")
        assert "unit svc-1 is restarting (rank 1 killed by SIGKILL" in info.value.message

    asyncio.run(with_manager(tmp_path, scenario, wait_s=0.5))


@pytest.mark.parametrize("failure", ["refused", "broken"])
def test_a_unit_that_fails_under_a_request_leaves_routing_and_the_request_goes_elsewhere(tmp_path, failure):
    async def scenario(m: UnitManager, svc: Service) -> None:
        good_runner, good_port, _ = await rank0("good")
        bad_runner = None
        if failure == "refused":
            bad_port = closed_port()
        else:
            bad_runner, bad_port, _ = await rank0("bad", broken=True)
        bad = ready_unit(svc, 1, bad_port)  # chosen first: lowest index
        ready_unit(svc, 2, good_port)
        status, payload, headers = await infer(m, {"x": 1})
        assert status == 200 and json.loads(payload)["by"] == "good" and headers["X-Xpufleet-Unit"] == "svc-2"
        assert bad.state == "recovering" and bad.history[-1]["event"] == "rank0_unreachable"
        for r in (good_runner, bad_runner):
            if r is not None:
                await r.cleanup()

    asyncio.run(with_manager(tmp_path, scenario))
