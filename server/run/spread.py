"""The launcher's side of ddp across workers (docs/architecture.md "ddp across workers").

A run spread over workers has one *part* per entry of ``options.target.spread``: part 0 runs on rank
0's worker as the run itself (rank 0 reports, its local ranks follow as on one machine, see ddp.py);
every other part is a group of follower ranks only. Ranks are numbered across the parts in order:
part i's cards are ranks ``first_rank .. first_rank + k - 1``. The rendezvous is a TCPStore that
rank 0 opens on the address its worker advertises (``xpufleet agent start --advertise-addr``); its
``host:port`` travels in rank 0's ``ddp_ready`` event, through the sidecar, to the other parts
(``XPUFLEET_DDP_STORE``). The gloo/NCCL sockets of each worker's ranks use the interface that holds
that worker's advertised address (``lo`` for 127.0.0.1).

Pure but for :func:`interface_for` (it reads the machine's interfaces) and the launcher glue.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...constants import ENV_DDP_RANK, ENV_DDP_STORE
from . import ddp
from .launcher import GroupResult, MemberExit, MemberSpec, ProcessGroup, member_env

log = logging.getLogger("xpufleet.launcher")


class LayoutError(ValueError):
    """A spread layout that cannot be used (the text names the field)."""


@dataclass(frozen=True)
class Part:
    """One worker's share of a spread run: its machine device names and its first global rank."""

    worker: str
    devices: tuple[str, ...]
    first_rank: int


@dataclass(frozen=True)
class Layout:
    """Every part of a spread run, which one is this worker's, and (once rank 0 opened it) the store.

    ``advertise``: this worker's advertised address (rank 0's worker opens the store on it)."""

    parts: tuple[Part, ...]
    part: int
    store: str | None = None
    advertise: str | None = None

    @property
    def world_size(self) -> int:
        return sum(len(p.devices) for p in self.parts)

    @property
    def here(self) -> Part:
        return self.parts[self.part]

    def rank_of(self, local_rank: int) -> int:
        return self.here.first_rank + local_rank

    def worker_of(self, rank: int) -> str:
        return next(p.worker for p in self.parts if p.first_rank <= rank < p.first_rank + len(p.devices))

    def to_json(self) -> dict[str, Any]:
        return {"parts": [{"worker": p.worker, "devices": list(p.devices)} for p in self.parts],
                "part": self.part, "store": self.store, "advertise": self.advertise}

    @staticmethod
    def from_json(data: Any) -> Layout:
        """Check and read a layout (``start_run``'s ``spread``, a spec's ``spread``)."""
        if not isinstance(data, Mapping):
            raise LayoutError("spread must be an object {parts, part, store}")
        parts = data.get("parts")
        if not isinstance(parts, list) or len(parts) < 2:
            raise LayoutError("spread.parts must list two or more {worker, devices}")
        out: list[Part] = []
        first = 0
        for i, p in enumerate(parts):
            devices = p.get("devices") if isinstance(p, Mapping) else None
            if not isinstance(p, Mapping) or not isinstance(p.get("worker"), str) or not isinstance(devices, list) \
                    or not devices or not all(isinstance(d, str) and d for d in devices):
                raise LayoutError(f"spread.parts[{i}] must be {{worker, devices: [names]}}")
            out.append(Part(p["worker"], tuple(devices), first))
            first += len(devices)
        part = data.get("part")
        if isinstance(part, bool) or not isinstance(part, int) or not 0 <= part < len(out):
            raise LayoutError(f"spread.part must be 0..{len(out) - 1}")
        store, advertise = data.get("store"), data.get("advertise")
        if store is not None and not (isinstance(store, str) and parse_store(store) is not None):
            raise LayoutError("spread.store must be \"host:port\"")
        if advertise is not None and not isinstance(advertise, str):
            raise LayoutError("spread.advertise must be an address")
        return Layout(tuple(out), part, store, advertise)


def layout_of(parts: Sequence[tuple[str, Sequence[str]]], part: int, store: str | None = None) -> Layout:
    """The layout of a run whose parts are ``(worker, devices)`` in rank order, seen from ``part``."""
    return Layout.from_json({"parts": [{"worker": w, "devices": list(d)} for w, d in parts], "part": part,
                             "store": store})


def parse_store(text: str) -> tuple[str, int] | None:
    """``"host:port"`` -> (host, port); None when it is not that."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host.strip("[]"), int(port)


def global_cards(layout: Layout, local_cards: Sequence[str]) -> list[str]:
    """Rank k's card for every rank: this worker's in-run names for its ranks, ``worker/device``
    (the machine's name, for messages only) for the other workers' ranks."""
    out: list[str] = []
    for p in layout.parts:
        out += list(local_cards[:len(p.devices)]) if p is layout.here else [f"{p.worker}/{d}" for d in p.devices]
    return out


def role_for(spec: Mapping[str, Any], run_dir: Path, rank: int, env: Mapping[str, str]) -> Any:
    """The :class:`~xpufleet.nodes.runtime.DdpRole` of global rank ``rank`` of a spread run (its spec
    has ``spread``): rank 0 opens the store on its worker's advertised address, every other rank finds
    it in ``XPUFLEET_DDP_STORE``."""
    from ...nodes.runtime import DdpRole

    layout = Layout.from_json(spec.get("spread"))
    loops = ddp.ddp_loops(spec.get("graph"))
    if not loops:
        raise LayoutError("this run is spread over workers but its graph has no TrainingLoop with strategy ddp")
    local = [d for d in spec.get("devices") or [] if d.split(":")[0] in ("cuda", "xpu")][:len(layout.here.devices)]
    if len(local) != len(layout.here.devices):
        raise LayoutError(f"this worker's part lists {len(layout.here.devices)} cards; the run sees {local}")
    if rank == 0:
        host, port = layout.advertise, None
        if not host:
            raise LayoutError("rank 0 of a spread run needs its worker's advertised address")
    else:
        found = parse_store(str(env.get(ENV_DDP_STORE, "")))
        if found is None:
            raise LayoutError(f"rank {rank} of a spread run has no {ENV_DDP_STORE} (rank 0's store host:port)")
        host, port = found
    return DdpRole(rank=rank, world_size=layout.world_size, cards=global_cards(layout, local),
                   rendezvous=ddp.rendezvous_path(run_dir), loops=frozenset(loops),
                   simulated=bool(spec.get("simulated")), store_host=host, store_port=port)


# --- the ranks' environment ---------------------------------------------------------------------------


def interface_for(address: str, interfaces: Mapping[str, Sequence[Any]] | None = None) -> str | None:
    """The name of the network interface that holds ``address`` (``lo`` for 127.0.0.1), or None.
    ``interfaces``: psutil.net_if_addrs()'s shape (name -> entries with ``.address``), for tests."""
    if interfaces is None:
        import psutil

        interfaces = psutil.net_if_addrs()
    for name, entries in interfaces.items():
        if any(getattr(e, "address", None) == address for e in entries):
            return name
    return "lo" if address.startswith("127.") or address == "::1" else None


def socket_env(advertise: str, parent_env: Mapping[str, str]) -> dict[str, str]:
    """GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME for the ranks of this worker: the interface holding its
    advertised address, unless the agent's own environment sets them."""
    iface = interface_for(advertise)
    if iface is None:
        raise LayoutError(f"no network interface of this machine holds the advertised address {advertise} "
                          f"(--advertise-addr); give one of this machine's addresses")
    return {k: iface for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME") if k not in parent_env}


def rank_env(layout: Layout, local_rank: int, store: str | None) -> dict[str, str]:
    """What a rank of this worker gets besides the run's environment: its global rank, the sizes, and
    the store of rank 0 (rank 0 itself opens it)."""
    rank = layout.rank_of(local_rank)
    env = {ENV_DDP_RANK: str(rank), "RANK": str(rank), "LOCAL_RANK": str(local_rank),
           "WORLD_SIZE": str(layout.world_size), "LOCAL_WORLD_SIZE": str(len(layout.here.devices))}
    if store is not None and rank != 0:
        env[ENV_DDP_STORE] = store
    return env


def leader_layout(msg: Mapping[str, Any], advertise: str) -> Layout | None:
    """The layout of a ``start_run`` that holds rank 0 of a spread run (None: a run on this worker
    only), with this worker's advertised address for rank 0's store."""
    raw = msg.get("spread")
    if raw is None:
        return None
    layout = Layout.from_json({**raw, "advertise": advertise})
    if layout.part != 0:
        raise LayoutError(f"start_run holds rank 0, which is part 0, not part {layout.part}")
    return layout


def with_layout(spec: Any, layout: Layout | None) -> Any:
    """``spec`` (a RunSpec) for this worker's part: every rank's world size and the layout."""
    if layout is not None:
        spec.world_size = layout.world_size
        spec.spread = layout.to_json()
    return spec


def leader_env(layout: Layout | None, parent_env: Mapping[str, str]) -> dict[str, str]:
    """What rank 0 of a spread run gets besides a one-worker run's environment: the socket interface
    of the advertised address and this worker's rank count."""
    if layout is None:
        return {}
    assert layout.advertise is not None
    return {**socket_env(layout.advertise, parent_env), "LOCAL_WORLD_SIZE": str(len(layout.here.devices))}


def members(run_dir: Path, layout: Layout, env: Mapping[str, str], store: str | None,
            first_local: int = 0) -> list[MemberSpec]:
    """This worker's ranks from local rank ``first_local`` on, each logging to ``output-rank<k>.log``
    (``k`` the global rank)."""
    return [MemberSpec(j, Path(run_dir), member_env(dict(env), rank_env(layout, j, store)),
                       Path(run_dir) / ddp.follower_log_name(layout.rank_of(j)))
            for j in range(first_local, len(layout.here.devices))]


class LeaderFollowers(ddp.Followers):
    """On rank 0's worker: its other local ranks join once rank 0 opened the store (``ddp_ready``)."""

    def __init__(self, group: ProcessGroup, run_dir: Path, layout: Layout, env: Mapping[str, str]) -> None:
        super().__init__(group, run_dir, layout.world_size, env)
        self.layout = layout

    def see(self, rank: int, events: list[dict[str, Any]]) -> None:
        if rank != 0 or self.task is not None or len(self.layout.here.devices) < 2:
            return
        for ev in events:
            store = (ev.get("payload") or {}).get("store") if ev.get("type") == "ddp_ready" else None
            if store:
                log.info("run %s: rank 0 opened its store at %s; starting this worker's other ranks",
                         self.group.spec.run_id, store)
                self.task = self.group.add_members(members(self.run_dir, self.layout, self.env, store, 1))
                return


def followers(group: ProcessGroup, run_dir: Path, world_size: int, env: Mapping[str, str],
              layout: Layout | None) -> ddp.Followers:
    """The followers of a run's group: this worker's ranks of a spread run, else ddp's own."""
    if layout is None:
        return ddp.Followers(group, run_dir, world_size, env)
    return LeaderFollowers(group, run_dir, layout, env)


# --- the result (pure) ----------------------------------------------------------------------------------


def failure_text(rank: int, world_size: int, worker: str, cause: str) -> str:
    """``DDP rank 1 of 2 failed on worker b: killed by SIGKILL; see output-rank1.log on worker b``."""
    return f"DDP rank {rank} of {world_size} failed on worker {worker}: {cause}; see " \
           f"{ddp.follower_log_name(rank)} on worker {worker}"


def _part_cause(result: GroupResult) -> MemberExit | None:
    """The rank of a follower part that failed by itself first (killed, an exception; not one that
    only lost its peers or was ended by the launcher), or None; none after a stop."""
    if result.stop_reason in ("cancel", "interrupt"):
        return None
    own = sorted((e for e in result.exits if ddp.own_failure(e) and not _stopped(e)), key=lambda e: e.ended_at)
    return own[0] if own else None


def _stopped(e: MemberExit) -> bool:
    """A rank that stopped because the run was stopped: rank 0's stop reaches every rank through the
    per-batch agreement (nodes/ddp.py), so a part's ranks end cancelled without their group being stopped."""
    return (e.finished or {}).get("status") in ("cancelled", "interrupted")


def leader_finish(result: GroupResult, layout: Layout | None) -> dict[str, Any] | None:
    """Rank 0's worker's ``run_finished`` payload: ddp.py's, with a local follower's failure named by
    its global rank and worker; ``ddp_peer_lost`` stays so the sidecar can tell a consequence from a
    cause (server/sidecar/spread.py)."""
    if layout is None:
        return ddp.group_finish(result)
    rank0 = result.finished_event
    payload = dict(rank0.get("payload") or {}) if rank0 is not None else None
    cause = ddp.root_cause(result) if len(result.exits) > 1 else None
    if cause is None:
        return payload
    payload = payload or {"status": "failed", "error": None, "final_metrics": {}, "execution_facts": {}}
    facts = dict(payload.get("execution_facts") or {})
    if payload.get("error") and payload.get("status") != "succeeded":
        facts["ddp_rank0_error"] = payload["error"]
    rank = layout.rank_of(cause.rank)
    payload.update(status="failed", error=failure_text(rank, layout.world_size, layout.here.worker, cause.cause))
    facts.update(ddp_failed_rank=rank, ddp_failed_worker=layout.here.worker)
    payload["execution_facts"] = facts
    payload.pop("ddp_peer_lost", None)
    return payload


def part_outcome(result: GroupResult, layout: Layout) -> dict[str, Any]:
    """How a follower part ended, for ``part_finished``: ``status`` succeeded|cancelled|failed, and for
    a failure whether one of its ranks failed by itself (``failed_rank``, ``error``) or they only lost
    their peers (``peer_lost``)."""
    cause = _part_cause(result)
    if cause is not None:
        rank = layout.rank_of(cause.rank)
        return {"status": "failed", "failed_rank": rank,
                "error": failure_text(rank, layout.world_size, layout.here.worker, cause.cause)}
    if all(not e.failed for e in result.exits):
        return {"status": "succeeded"}
    if result.stop_reason in ("cancel", "interrupt") or all(not e.failed or _stopped(e) for e in result.exits):
        return {"status": "cancelled"}
    return {"status": "failed", "peer_lost": True,
            "error": f"the ranks on worker {layout.here.worker} lost contact with the other ranks"}

