"""The refusals by name before a run's graph is read (server/sidecar/refusals.py)."""

from __future__ import annotations

import pytest

from xpufleet.server.run.requests import parse_run_request
from xpufleet.server.scheduling import Candidate
from xpufleet.server.scheduling.routing import Resolution
from xpufleet.server.sidecar.refusals import RECORD_OUTPUTS_ONE_SHOT, refusal, validates_here

GRAPH = {"1": {"class_type": "XPUDataset", "inputs": {"name": "iris"}}}


def request(**options):
    return parse_run_request({"graph": GRAPH, "options": options})


def resolution(*providers: str, dynamic: bool = False) -> Resolution:
    return Resolution(target="x", candidates=tuple(Candidate(p, ("cpu",)) for p in providers), requested=(),
                      device_set=False, dynamic=dynamic)


def test_a_closed_pool_is_refused_with_its_own_text():
    closed = {"burst": "pool burst is being removed"}
    req = request(target={"pool": "burst"})
    assert refusal(req, resolution(dynamic=True), closed, lambda _: False) == "pool burst is being removed"
    assert refusal(request(target={"pool": "other"}), resolution(dynamic=True), closed, lambda _: False) is None


@pytest.mark.parametrize(("record", "one_shot", "refused"), [
    (True, True, True), (True, False, False), ("upload", True, False), (None, True, False)])
def test_kept_outputs_are_refused_on_a_one_shot_worker_only(record, one_shot, refused):
    options = {} if record is None else {"record_outputs": record}
    got = refusal(request(**options), resolution("local", "w1"), {}, lambda name: one_shot and name == "w1")
    assert got == (RECORD_OUTPUTS_ONE_SHOT if refused else None)


def test_the_graph_is_validated_here_only_when_it_can_only_run_here():
    assert validates_here(True, resolution("local"))
    assert not validates_here(False, resolution("local"))
    assert not validates_here(True, resolution("local", "w1"))
    assert not validates_here(True, resolution("local", dynamic=True))
