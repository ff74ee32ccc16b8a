"""The dispatcher's dynamic runs (docs/workers.md): pool runs and runs that need a mount wait with a reason
while no provider can take them and are resolved again when providers change; a one-shot instance takes
one run even when its slots could hold two; after a restart the dynamic runs are found again. Real
Dispatcher and SQLite store, providers that record what they are given."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from xpufleet.common.errors import RequestError
from xpufleet.server.run.requests import parse_run_request
from xpufleet.server.scheduling import DeviceOffer
from xpufleet.server.sidecar.dispatcher import Dispatcher
from xpufleet.server.sidecar.pool_table import PoolTable
from xpufleet.server.sidecar.store import Store

GRAPH = {"1": {"class_type": "XPUDataset", "inputs": {"name": "iris"}}}
CSV = {"1": {"class_type": "XPUDataset", "inputs": {"name": "csv", "path": "datasets:iris.csv"}}}


class Local:
    name, is_local, online, draining = "local", True, True, False

    def devices(self) -> list[DeviceOffer]:
        return [DeviceOffer("cpu")]

    async def start_run(self, run: dict[str, Any], devices: list[str]) -> None:
        raise AssertionError("nothing here should run on this server")

    async def cancel(self, run_id: str) -> bool:
        return True


class Worker:
    is_local, draining = False, False

    def __init__(self, name: str, one_shot: bool = False, mounts: tuple[str, ...] = ()) -> None:
        self.name, self.one_shot, self.mounts = name, one_shot, frozenset(mounts)
        self.online = True
        self.started: list[str] = []
        self.taken: str | None = None

    @property
    def note(self) -> str:
        return "has taken its one run (one-shot)" if self.one_shot and self.taken else ""

    @property
    def draining(self) -> bool:  # noqa: F811 - a property, as WorkerProvider's
        return bool(self.one_shot and self.taken)

    def claim(self, run_id: str) -> bool:
        if not self.one_shot:
            return True
        if self.taken not in (None, run_id):
            return False
        self.taken = run_id
        return True

    def devices(self) -> list[DeviceOffer]:
        return [DeviceOffer("cpu")]  # a CPU slot holds two runs: only claim() keeps a one-shot to one

    async def start_run(self, run: dict[str, Any], devices: list[str]) -> None:
        self.started.append(run["id"])

    async def cancel(self, run_id: str) -> bool:
        return True


def _submit(d: Dispatcher, graph: dict[str, Any], **options: Any) -> str:
    return d.submit(parse_run_request({"graph": graph, "options": options}))["run_id"]


async def _until(check: Callable[[], bool], what: str, bound_s: float = 30.0) -> None:
    """Wait for the dispatcher to reach a state (it acts on its own tasks and timers): ``check`` true,
    looked at after each turn of the loop; fails with ``what`` after ``bound_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + bound_s
    while not check():
        if loop.time() > deadline:
            raise AssertionError(f"not within {bound_s:g} s: {what}")
        await asyncio.sleep(0.01)


def _reason(store: Store, run_id: str) -> str:
    return store.get_run(run_id).get("waiting_reason") or ""


@pytest.fixture
async def make(store, tmp_path):
    """Dispatchers over ``store`` with this server's provider registered (and ``pools`` when given), all
    shut down at teardown, also when the test failed."""
    made: list[Dispatcher] = []

    def new(pools: PoolTable | None = None) -> Dispatcher:
        d = Dispatcher(store, tmp_path, pools=pools)
        d.register_provider(Local())
        made.append(d)
        return d

    yield new
    for d in made:
        await d.shutdown()


async def test_pool_runs_wait_and_one_shot_instances_take_one_each(store, make):
    pools = PoolTable()
    pools.update({"spot": []}, {})
    d = make(pools)
    await d.start()
    first, second = _submit(d, GRAPH, target={"pool": "spot"}), _submit(d, GRAPH, target={"pool": "spot"})
    alone = "no instance of pool 'spot' is connected; the run waits for one to join"
    await _until(lambda: _reason(store, first) == alone, "the first pool run's reason")
    inst = Worker("spot-a", one_shot=True)
    pools.update({"spot": ["spot-a"]}, {})
    d.register_provider(inst)
    await _until(lambda: "has taken its one run" in _reason(store, second), "the second run waits for the one-shot")
    assert inst.started == [first]  # one run, though its CPU slot holds two
    run = store.get_run(second)
    assert run["status"] == "queued" and "has taken its one run" in run["waiting_reason"]
    assert run["candidates"] == [{"provider": "spot-a", "devices": ["cpu"]}]
    pools.update(pools.live(), {}, lambda pool, run_id: f"waiting for an idle instance of pool {pool}")
    d.providers_changed()
    await _until(lambda: _reason(store, second) == "waiting for an idle instance of pool spot", "the pool's reason")
    late = Worker("spot-b", one_shot=True)
    pools.update({"spot": ["spot-a", "spot-b"]}, {})
    d.register_provider(late)
    await _until(lambda: late.started == [second], "the late instance takes the second run")
    assert inst.started == [first]


async def test_runs_that_need_a_mount_wait_for_a_worker_that_has_it_even_after_a_restart(store, make):
    pools = PoolTable()
    d = make(pools)
    bare = Worker("bare")
    d.register_provider(bare)
    await d.start()
    rid = _submit(d, CSV, target="any")
    pools.update({"later": []}, {})
    pooled = _submit(d, GRAPH, target={"pool": "later"})
    await _until(lambda: "declares mount 'datasets'" in _reason(store, rid), "the mount's reason")
    await _until(lambda: "pool 'later'" in _reason(store, pooled), "the pool run's reason")
    assert bare.started == []
    await d.shutdown()
    # a restart: the queued runs are found again and resolved against the providers that come
    pools2 = PoolTable()
    pools2.update({"later": []}, {})
    d2 = make(pools2)
    await d2.start()
    assert set(d2.dynamic.ids()) == {rid, pooled}
    ds = Worker("ds", mounts=("datasets",))
    d2.register_provider(ds)
    inst = Worker("later-1", one_shot=True)
    pools2.update({"later": ["later-1"]}, {})
    d2.register_provider(inst)
    await _until(lambda: ds.started == [rid] and inst.started == [pooled], "both runs placed after the restart")
    assert store.get_run(rid)["worker_id"] == "ds"
    assert d2.dynamic.ids() == []  # placed runs are no longer resolved again


async def test_a_closed_pool_refuses_new_runs(make):
    pools = PoolTable()
    pools.update({"spot": []}, {"spot": "pool 'spot': its credential was revoked"})
    d = make(pools)
    await d.start()
    with pytest.raises(RequestError, match="revoked") as refused:
        _submit(d, GRAPH, target={"pool": "spot"})
    assert refused.value.status == 400


async def test_record_outputs_kept_on_a_one_shot_worker_is_refused(make):
    d = make()
    d.register_provider(Worker("once", one_shot=True))
    await d.start()
    with pytest.raises(RequestError, match="one-shot worker") as refused:
        _submit(d, GRAPH, target="once", record_outputs=True)
    assert refused.value.status == 400
    assert _submit(d, GRAPH, target="once", record_outputs="upload")  # copied here before it exits
