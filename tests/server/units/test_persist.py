"""Services, units and instances in the sidecar's SQLite (real Store): a restart reads back what was saved."""

from __future__ import annotations

from xpufleet.server.sidecar.store import Store
from xpufleet.server.units.persist import SCHEMA, UnitStore
from xpufleet.server.units.records import Instance, Service, Unit, Update
from xpufleet.server.units.spec import parse_service

BODY = {"name": "digits", "program": {"model": {"path": "models/m.safetensors"}}, "unit": {"size": 2, "guard": True}}


def test_a_service_round_trips(tmp_path):
    store = Store(tmp_path / "state.db")
    us = UnitStore(store)
    assert store.schema_version(SCHEMA.name) == SCHEMA.version == 1
    spec1 = parse_service(BODY)
    spec2 = parse_service({**BODY, "replicas": 2})
    unit = Unit(id="digits-1", service="digits", version=1, index=1, state="ready", generation=3, barrier_passed=True,
                master_addr="127.0.0.1", master_port=29500, rendezvous="digits-1-g3-ab", restart_times=[1.0, 2.0],
                instances=[Instance(rank=0, worker="a", device="cuda:0", generation=3, state="arrived", pid=11, port=80,
                                    env={"RANK": "0"}),
                           Instance(rank=1, worker="b", device="cuda:0", generation=3, state="arrived", pid=12,
                                    last_exit="killed by SIGKILL", restarts=2)])
    unit.note("ready")
    unit.outstanding, unit.routed = 4, 9
    svc = Service(name="digits", version=2, specs={1: spec1, 2: spec2}, units=[unit],
                  update=Update("rolling", 1, 2), unit_serial=1)
    us.save_service(svc)
    store.close()

    store = Store(tmp_path / "state.db")
    (back,) = UnitStore(store).load()
    assert back.name == "digits" and back.version == 2 and back.specs == {1: spec1, 2: spec2}
    assert back.update == svc.update and back.updating and back.unit_serial == 1
    (u,) = back.units
    assert u == unit  # every persisted field
    assert (u.outstanding, u.routed) == (0, 0)  # the router's counters are not state
    assert u.history[-1]["event"] == "ready" and u.instances[1].last_exit == "killed by SIGKILL"
    UnitStore(store).delete_unit("digits-1")
    assert UnitStore(store).load()[0].units == []
    UnitStore(store).delete_service("digits")
    assert UnitStore(store).load() == []
