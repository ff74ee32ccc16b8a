"""The launcher's side of ddp (docs/ddp.md): which graphs train with ddp, the follower ranks, and the result.

A ddp run is ONE launcher group (launcher.py). The agent starts rank 0, the run itself. When rank 0's
TrainingLoop reaches ddp it emits ``ddp_ready`` (nodes/ddp.py) and :class:`Followers` adds ranks
1..N-1 to the same group: the same run directory and spec, ``XPUFLEET_DDP_RANK=k`` in the environment
(the runner's follower mode: only the ddp loops and the nodes feeding them, seed + k, its own log
``output-rank<k>.log`` and event log ``ddp/events-rank<k>.jsonl``; rank 0 alone reports). Stop, failure
handling and ``wait`` of the group then cover every rank, and rank 0's ``run_finished`` is held until
every rank has exited, so the cards are free when the run reports.

:func:`group_finish` turns the group's result into the run's ``run_finished`` payload: a follower that
failed by itself (killed, an exception) is the run's error, ``DDP rank 1 of 2 failed: ...``, even when
rank 0 failed first in time with the communication error its death caused; peaks are listed per rank
and per card.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...constants import (
    DDP_DIRNAME,
    DDP_RANK_ENV_DEFAULTS,
    DDP_RENDEZVOUS_FILENAME,
    ENV_DDP_RANK,
)
from ...nodes import types as T
from .executor import GraphValidationError, NodeError, is_link
from .launcher import GroupResult, MemberExit, MemberSpec, ProcessGroup, member_env

log = logging.getLogger("xpufleet.launcher")


# --- the graph (pure) ----------------------------------------------------------------------------------


def _id_key(n: str) -> tuple[int, Any]:
    return (0, int(n)) if n.isdigit() else (1, n)


def ddp_loops(graph: Any) -> list[str]:
    """Ids of the TrainingLoops set to ``strategy: ddp`` on the node itself (a linked strategy is not
    planned: it falls back, saying so)."""
    if not isinstance(graph, Mapping):
        return []
    found = [str(nid) for nid, node in graph.items()
             if isinstance(node, Mapping) and node.get("class_type") == T.TRAINING_LOOP_NODE
             and isinstance(node.get("inputs"), Mapping) and node["inputs"].get("strategy") == "ddp"]
    return sorted(found, key=_id_key)


def upstream(graph: Mapping[str, Any], roots: list[str]) -> set[str]:
    """``roots`` and every node they depend on through links."""
    seen: set[str] = set()
    stack = [str(r) for r in roots]
    while stack:
        nid = stack.pop()
        node = graph.get(nid)
        if nid in seen or not isinstance(node, Mapping):
            continue
        seen.add(nid)
        inputs = node.get("inputs")
        for value in (inputs.values() if isinstance(inputs, Mapping) else ()):
            if is_link(value):
                stack.append(str(value[0]))
    return seen


def follower_graph(graph: Mapping[str, Any]) -> dict[str, Any]:
    """What a follower rank executes: the ddp loops and the nodes feeding them (nodes after a loop run on
    rank 0 only). Two ddp loops in sequence are both in it: the first one's model feeds the second."""
    graph = {str(k): v for k, v in graph.items()}
    keep = upstream(graph, ddp_loops(graph))
    return {nid: graph[nid] for nid in sorted(keep, key=_id_key)}


def parallel_loops(graph: Any) -> list[tuple[str, str]]:
    """Pairs of ddp loops on parallel branches (neither feeds the other): ddp runs one loop at a time on
    every rank, so such a graph cannot train with ddp."""
    if not isinstance(graph, Mapping):
        return []
    graph = {str(k): v for k, v in graph.items()}
    loops = ddp_loops(graph)
    feeds = {nid: upstream(graph, [nid]) for nid in loops}
    return [(a, b) for i, a in enumerate(loops) for b in loops[i + 1:] if a not in feeds[b] and b not in feeds[a]]


def parallel_loops_error(graph: Any) -> GraphValidationError | None:
    """The validation error (ComfyUI-shaped, one entry per loop) of a ddp run whose graph has ddp loops
    on parallel branches; None when it has none."""
    pairs = parallel_loops(graph)
    if not pairs:
        return None
    errors = []
    for a, b in pairs:
        for nid, other in ((a, b), (b, a)):
            errors.append(NodeError(
                nid, T.TRAINING_LOOP_NODE, "ddp_parallel_loops",
                f"TrainingLoops {a} and {b} both use strategy ddp on parallel branches of the graph; in a ddp "
                f"run they must run one after the other (connect one loop's model output to the next loop's "
                f"model input) or one of them must use strategy single", f"parallel to node {other}", "strategy"))
    return GraphValidationError(errors)


# --- the ranks ------------------------------------------------------------------------------------------


def rendezvous_path(run_dir: Path) -> Path:
    """The FileStore file the ranks meet through (torch.distributed ``file://`` init)."""
    return Path(run_dir) / DDP_DIRNAME / DDP_RENDEZVOUS_FILENAME


def follower_events_path(run_dir: Path, rank: int) -> Path:
    """A follower's own event log: never the run's events.jsonl (rank 0 alone reports)."""
    return Path(run_dir) / DDP_DIRNAME / f"events-rank{rank}.jsonl"


def follower_log_name(rank: int) -> str:
    return f"output-rank{rank}.log"


def rank_env(graph: Any, world_size: int, parent_env: Mapping[str, str]) -> dict[str, str]:
    """What every rank of a run with a ddp loop gets in its environment (rank 0 included): loopback
    only and one thread per rank, unless the agent's own environment sets them (``parent_env``)."""
    if world_size < 2 or not ddp_loops(graph):
        return {}
    return {k: v for k, v in DDP_RANK_ENV_DEFAULTS.items() if k not in parent_env}


def follower_members(run_dir: Path, world_size: int, env: Mapping[str, str]) -> list[MemberSpec]:
    """Ranks 1..N-1: rank 0's environment (renumbering, budget, the ddp defaults) plus the rank."""
    members = []
    for rank in range(1, world_size):
        extra = {ENV_DDP_RANK: str(rank), "RANK": str(rank), "LOCAL_RANK": str(rank),
                 "WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": str(world_size)}
        members.append(MemberSpec(rank, Path(run_dir), member_env(dict(env), extra),
                                  Path(run_dir) / follower_log_name(rank)))
    return members


class Followers:
    """Adds ranks 1..N-1 to a run's group once rank 0 reports ``ddp_ready``.

    Call :meth:`see` from the group's ``on_events`` callback (on the event loop)."""

    def __init__(self, group: ProcessGroup, run_dir: Path, world_size: int, env: Mapping[str, str]) -> None:
        self.group = group
        self.run_dir = Path(run_dir)
        self.world_size = world_size
        self.env = dict(env)
        self.task: asyncio.Task[None] | None = None

    def see(self, rank: int, events: list[dict[str, Any]]) -> None:
        if rank != 0 or self.task is not None or self.world_size < 2:
            return
        if any(ev.get("type") == "ddp_ready" for ev in events):
            log.info("run %s: rank 0 reached its ddp loop; starting ranks 1..%d", self.group.spec.run_id,
                     self.world_size - 1)
            self.task = self.group.add_members(follower_members(self.run_dir, self.world_size, self.env))


# --- the result (pure) ----------------------------------------------------------------------------------


def own_failure(e: MemberExit) -> bool:
    """A member that failed by itself: not ended by the launcher, not a rank that only lost a peer."""
    return e.failed and not e.ended_by_group and not (e.finished or {}).get("ddp_peer_lost")


def root_cause(result: GroupResult) -> MemberExit | None:
    """The follower whose failure is the run's error, or None when rank 0's own report stands (it
    succeeded, was stopped, or failed by itself)."""
    if result.world_size < 2 or result.stop_reason in ("cancel", "interrupt"):
        return None
    rank0, followers = result.exits[0], result.exits[1:]
    if own_failure(rank0):
        return None
    own = sorted((e for e in followers if own_failure(e)), key=lambda e: e.ended_at)
    if own:
        return own[0]
    if rank0.failed:  # rank 0 lost its peers, none of which failed: the first that left before it did
        early = sorted((e for e in followers if not e.ended_by_group and e.ended_at <= rank0.ended_at),
                       key=lambda e: e.ended_at)
        if early:
            return early[0]
    return None


def failure_message(e: MemberExit, world_size: int) -> str:
    """``DDP rank 1 of 2 failed: killed by SIGKILL (out of memory?); see output-rank1.log``."""
    cause = e.cause if e.failed or e.returncode is None else "it exited before the training ended"
    return f"DDP rank {e.rank} of {world_size} failed: {cause}; see {follower_log_name(e.rank)}"


def merge_peaks(exits: list[MemberExit]) -> dict[str, Any] | None:
    """Peak memory of a group: per card the largest any rank used (docs/workers.md), and each rank's own under
    ``ranks``. Measured (CUDA) and simulated figures (a rank reports its own card) merge the same way."""
    ranks = {str(e.rank): (e.finished or {}).get("peak_memory") for e in exits if e.finished is not None}
    if not ranks:
        return None
    reported = [p for p in ranks.values() if isinstance(p, dict)]
    with_cards = [p for p in reported if p.get("devices")]
    out: dict[str, Any] = dict(with_cards[0] if with_cards else reported[0] if reported else
                               {"measured": False, "reason": "no rank reported its peak"})
    if with_cards:
        cards: dict[str, float] = {}
        for p in with_cards:
            for card, value in p["devices"].items():
                cards[card] = max(cards.get(card, 0.0), float(value))
        out["devices"] = dict(sorted(cards.items()))
        out["measured"] = any(p.get("measured") for p in with_cards)
    out["ranks"] = ranks
    return out


def group_finish(result: GroupResult) -> dict[str, Any] | None:
    """The run's ``run_finished`` payload for the group's result: rank 0's, with a follower's failure as
    the run's error and per-rank peaks for a ddp group; None when rank 0 reported nothing and no
    follower is to blame (the caller describes how rank 0's process died)."""
    rank0 = result.finished_event
    payload = dict(rank0.get("payload") or {}) if rank0 is not None else None
    if result.world_size < 2:
        return payload
    cause = root_cause(result)
    if cause is None and payload is None:
        return None
    if payload is None:
        payload = {"status": "failed", "error": None, "final_metrics": {}, "execution_facts": {}}
    facts = dict(payload.get("execution_facts") or {})
    if cause is not None:
        if payload.get("error") and payload.get("status") != "succeeded":
            facts["ddp_rank0_error"] = payload["error"]
        payload["status"] = "failed"
        payload["error"] = failure_message(cause, result.world_size)
        facts["ddp_failed_rank"] = cause.rank
    facts["ddp_exits"] = [{"rank": e.rank, "pid": e.pid, "returncode": e.returncode, "cause": e.cause,
                           "ended_by_group": e.ended_by_group} for e in result.exits]
    payload["execution_facts"] = facts
    peaks = merge_peaks(result.exits)
    if peaks is not None:
        payload["peak_memory"] = peaks
    payload.pop("ddp_peer_lost", None)
    return payload


# --- the runner's side -----------------------------------------------------------------------------------


def follower_rank(env: Mapping[str, str]) -> int:
    """This process's follower rank (``XPUFLEET_DDP_RANK``, set by :func:`follower_members`); 0 = rank 0,
    the run itself (also when the variable is absent or malformed)."""
    raw = str(env.get(ENV_DDP_RANK, "")).strip()
    return int(raw) if raw.isdigit() else 0


def role_for(spec: Mapping[str, Any], run_dir: Path, rank: int) -> Any:
    """The :class:`~xpufleet.nodes.runtime.DdpRole` of this process, or None for a run that cannot train
    with ddp (its loops fall back with ``ddp_not_available``) or has no ddp loop."""
    from ...nodes.runtime import DdpRole

    world_size = int(spec.get("world_size") or 1)
    loops = ddp_loops(spec.get("graph"))
    if world_size < 2 or not loops:
        return None
    cards = [d for d in spec.get("devices") or [] if d.split(":")[0] in ("cuda", "xpu")][:world_size]
    return DdpRole(rank=rank, world_size=world_size, cards=cards, rendezvous=rendezvous_path(run_dir),
                   loops=frozenset(loops), simulated=bool(spec.get("simulated")))


def rank_devices(devices: list[str], role: Any) -> list[str]:
    """A rank's device list: its own card first, so ``auto`` nodes feeding the loop use it."""
    if role is None or role.rank == 0:
        return list(devices)
    own = role.cards[role.rank]
    return [own] + [d for d in devices if d != own]
