"""``RunSpec``: what a run's process is told, written as ``RUN_DIR/spec.json`` (one type for every parent).

The sidecar (target ``local``) and a worker agent fill it the same way, through :func:`build_spec`; the
runner reads it back with :meth:`RunSpec.read`. Device names in a spec are the run's own (in-run)
names: a worker run's cards are renumbered from 0 (docs/sidecar.md), a local run keeps the machine's names.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from ...common import atomic
from ...constants import RUN_KIND_COMFYUI, RUN_KIND_GRAPH, RUN_KINDS
from ..comfyflow.kind import run_kind

SPEC_FILENAME = "spec.json"
PLACEMENTS = ("local", "worker")


class SpecError(ValueError):
    """A spec.json that cannot be used (the text says which field)."""


@dataclass
class RunSpec:
    """One run as its process sees it."""

    run_id: str
    graph: dict[str, Any]
    options: dict[str, Any] = field(default_factory=dict)
    devices: list[str] = field(default_factory=lambda: ["cpu"])  # in-run names; the first is ``auto``
    device_aliases: dict[str, str] = field(default_factory=dict)  # in-run name -> machine name
    placement: str = "local"
    simulated: bool = False  # the run's CUDA cards are simulated: the work runs on the CPU (docs/architecture.md)
    worker: str | None = None
    budget_gib: float | None = None  # per card; the allocator is capped to it before the run (docs/workers.md, docs/memory.md)
    env: dict[str, str] = field(default_factory=dict)  # set (if unset) in the run's process before nodes run
    execution_facts: dict[str, Any] = field(default_factory=dict)
    # The ranks a ddp TrainingLoop of this run trains on (one per card, see ddp_world_size); only rank 0
    # runs until the loop starts, then the launcher adds ranks 1..N-1. 1 = the run cannot use ddp.
    world_size: int = 1
    # A run spread over workers: this worker's part of it (server/run/spread.py Layout.to_json).
    spread: dict[str, Any] | None = None
    # What executes it (server/comfyflow/kind.py): the fleet's executor, or a ComfyUI on the run's cards.
    kind: str = RUN_KIND_GRAPH
    # A comfyui run's instance, filled by its host (server/run/comfy_instances.py Instance.lease):
    # {"url", "instance", "devices", "output_dir", "log", "started", "version", "pid"}
    comfyui: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.run_id, str) or not self.run_id:
            raise SpecError("run_id must be a non-empty string")
        if not isinstance(self.graph, dict):
            raise SpecError("graph must be an object")
        if self.placement not in PLACEMENTS:
            raise SpecError(f"placement must be one of {', '.join(PLACEMENTS)}, got {self.placement!r}")
        if not self.devices:
            raise SpecError("devices must name at least one device")
        if not isinstance(self.world_size, int) or self.world_size < 1:
            raise SpecError("world_size must be an integer >= 1")
        if self.kind not in RUN_KINDS:
            raise SpecError(f"kind must be one of {', '.join(RUN_KINDS)}, got {self.kind!r}")
        if not self.device_aliases:
            self.device_aliases = {d: d for d in self.devices}

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunSpec:
        if not isinstance(data, Mapping):
            raise SpecError("spec.json must hold an object")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SpecError(f"spec.json has unknown field(s) {', '.join(unknown)}")
        return cls(**dict(data))

    def write(self, run_dir: Path) -> Path:
        """Write ``run_dir/spec.json`` atomically (a reader never sees half a spec)."""
        return atomic.write_json(Path(run_dir) / SPEC_FILENAME, self.to_json(), indent=1)

    @classmethod
    def read(cls, run_dir: Path) -> RunSpec:
        try:
            data = json.loads((Path(run_dir) / SPEC_FILENAME).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise SpecError(f"cannot read {Path(run_dir) / SPEC_FILENAME}: {exc}") from None
        return cls.from_json(data)

    @property
    def accelerators(self) -> list[str]:
        """The run's CUDA/XPU cards (in-run names)."""
        return [d for d in self.devices if d.split(":")[0] in ("cuda", "xpu")]


def ddp_world_size(placement: str, devices: Sequence[str]) -> int:
    """How many ranks a ddp loop of a run with these (in-run) ``devices`` trains on (docs/ddp.md): one per
    card for a worker run with two or more cards of one kind (CUDA or XPU), else 1 (no ddp)."""
    cards = [d for d in devices if d.split(":")[0] in ("cuda", "xpu")]
    if placement != "worker" or len(cards) < 2 or len({d.split(":")[0] for d in cards}) != 1:
        return 1
    return len(cards)


def build_spec(
    run: Mapping[str, Any],
    *,
    placement: str,
    slot_devices: Sequence[str],
    run_devices: Sequence[str],
    aliases: Mapping[str, str],
    visible_devices: Sequence[str],
    env: Mapping[str, str] | None = None,
    worker: str | None = None,
    simulated: bool = False,
) -> RunSpec:
    """The spec of ``run`` (a store record: ``id``, ``graph``, ``options``, ``budget_gib``), the same
    way for the sidecar and an agent; only where its devices come from differs (the caller's renumbering).

    ``kind`` comes from the graph (server/comfyflow/kind.py); a ``comfyui`` run's host then sets
    ``comfyui`` (its instance). ``slot_devices``: the machine's names of the devices the run holds; ``run_devices``: the names the
    run sees (first = ``auto``); ``visible_devices``: what the run can see, for ``execution_facts``.
    """
    facts: dict[str, Any] = {
        "placement": placement,
        "slot_devices": list(slot_devices),
        "visible_devices": list(visible_devices),
        "device_aliases": dict(aliases),
    }
    if worker is not None:
        facts["worker"] = worker
    if simulated:
        facts["simulated_devices"] = True
    budget = run.get("budget_gib")
    kind = run_kind(run["graph"])
    if kind == RUN_KIND_COMFYUI:
        facts["run_kind"] = kind
    return RunSpec(
        run_id=str(run["id"]),
        graph=dict(run["graph"]),
        options=dict(run.get("options") or {}),
        devices=list(run_devices),
        device_aliases=dict(aliases),
        placement=placement,
        simulated=simulated,
        worker=worker,
        budget_gib=None if budget is None else float(budget),
        env=dict(env or {}),
        execution_facts=facts,
        # a ComfyUI run has no ddp loop: one process whatever its cards
        world_size=ddp_world_size(placement, run_devices) if kind == RUN_KIND_GRAPH else 1,
        kind=kind,
    )
