"""The sidecar's records of services, units and instances (typed; what persist.py stores and the API shows)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from .lifecycle import ALIVE
from .spec import ServiceSpec

HISTORY_KEPT = 100  # unit history entries kept (the newest)


def _known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


@dataclass
class Instance:
    """One instance (rank) of a unit, as the sidecar knows it."""

    rank: int
    worker: str | None = None
    device: str | None = None  # the worker's name of its card
    generation: int = 0
    attempt: int = 0  # restarts of this instance alone within the generation (guard off)
    state: str = "waiting"
    pid: int | None = None
    port: int | None = None  # its HTTP port (rank 0: where requests go)
    restarts: int = 0  # every restart of this instance's process, alone or with its unit
    last_exit: str | None = None
    env: dict[str, str] = field(default_factory=dict)  # the contract as the process reported it
    waiting_reason: str | None = None
    started_at: float | None = None
    sent_at: float | None = None  # when its start_instance was last sent

    @property
    def alive(self) -> bool:
        return self.state in ALIVE

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Instance:
        return cls(**_known(cls, data))


@dataclass
class Unit:
    """One unit: ``size`` instances that work, restart and are replaced as one."""

    id: str
    service: str
    version: int  # the service spec version it runs
    index: int
    state: str = "placing"
    generation: int = 0
    barrier_passed: bool = False
    healthy: bool = False
    master_addr: str | None = None
    master_port: int | None = None
    rendezvous: str | None = None
    restart_times: list[float] = field(default_factory=list)
    failed_reason: str | None = None
    detail: str = ""  # what it waits for, in words
    instances: list[Instance] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)
    created_at: float = field(default_factory=time.time)
    state_since: float = field(default_factory=time.time)
    ever_ready: bool = False
    # runtime only (not persisted): the router's counters
    outstanding: int = field(default=0, compare=False)
    routed: int = field(default=0, compare=False)

    def note(self, event: str, **detail: Any) -> None:
        """Append to the unit's history (with the routed count at that moment, so a test can see that no
        request was routed between a failure and the next barrier)."""
        self.history.append({"ts": time.time(), "event": event, "generation": self.generation,
                             "routed": self.routed, **detail})
        del self.history[:-HISTORY_KEPT]

    def set_state(self, state: str, detail: str = "") -> None:
        if state != self.state:
            self.state = state
            self.state_since = time.time()
        self.detail = detail

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("outstanding")
        out.pop("routed")
        out["instances"] = [i.to_json() for i in self.instances]
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Unit:
        d = _known(cls, data)
        d["instances"] = [Instance.from_json(i) for i in data.get("instances") or []]
        d.pop("outstanding", None)
        d.pop("routed", None)
        return cls(**d)


@dataclass
class Update:
    """The last rolling update of a service: ``rolling``, ``done``, ``rolling_back``, ``rolled_back``
    or ``failed`` (a rollback that could not finish either)."""

    state: str
    from_version: int
    to_version: int
    started_at: float = field(default_factory=time.time)
    finished_at: float | None = None
    reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Update | None:
        return cls(**_known(cls, data)) if data else None


@dataclass
class Service:
    """A service: its spec versions (units of an update in progress may run an older one), its units."""

    name: str
    version: int
    specs: dict[int, ServiceSpec]
    units: list[Unit] = field(default_factory=list)
    update: Update | None = None
    unit_serial: int = 0
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    deleting: bool = field(default=False, compare=False)  # runtime only: DELETE is draining its units

    @property
    def spec(self) -> ServiceSpec:
        return self.specs[self.version]

    @property
    def updating(self) -> bool:
        return self.update is not None and self.update.state in ("rolling", "rolling_back")

    def unit(self, unit_id: str) -> Unit | None:
        return next((u for u in self.units if u.id == unit_id), None)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version,
                "specs": {str(v): s.to_json() for v, s in self.specs.items()},
                "update": self.update.to_json() if self.update else None, "unit_serial": self.unit_serial,
                "created_at": self.created_at, "updated_at": self.updated_at}

    @classmethod
    def from_json(cls, data: dict[str, Any], units: list[Unit]) -> Service:
        return cls(name=data["name"], version=int(data["version"]),
                   specs={int(v): ServiceSpec.from_json(s) for v, s in data["specs"].items()},
                   units=units, update=Update.from_json(data.get("update")),
                   unit_serial=int(data.get("unit_serial") or 0), created_at=data.get("created_at") or time.time(),
                   updated_at=data.get("updated_at") or time.time())
