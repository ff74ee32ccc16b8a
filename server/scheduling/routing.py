"""Routing choice (SPEC Q3): a validated target -> candidates in preference order (pure)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...constants import ACCELERATOR_KINDS, LOCAL_PROVIDER
from ..devices.names import device_kind
from .offers import ProviderInfo
from .plan import Candidate

LOCAL = LOCAL_PROVIDER

# --- target resolution (SPEC Q3) ------------------------------------------------------------------------


class TargetError(ValueError):
    """A target or device the server rejects with 400; the message is the answer's ``error``."""


@dataclass(frozen=True)
class RunTarget:
    """A validated ``options.target`` (+ ``options.device``).

    ``worker``: ``"local"``, ``"any"`` or a worker name; ``devices``: a device set (strict: every device
    must be offered); ``device``: one device without a set (``auto``, a kind, or a card; a local run
    falls back when the machine lacks it); ``pool``: a one-shot worker pool.
    """

    worker: str = LOCAL
    devices: tuple[str, ...] | None = None
    device: str | None = None
    pool: str | None = None
    memory_gib: float | None = None
    memory_source: str | None = None
    wait: bool | None = None


MEMORY_SOURCES = ("user", "estimate", "measured")



@dataclass(frozen=True)
class Resolution:
    """Where a run may go: its candidates in preference order, plus what to record."""

    target: str
    candidates: tuple[Candidate, ...]
    requested: tuple[str, ...]
    device_set: bool
    warnings: tuple[dict[str, Any], ...] = ()

    @property
    def queue_key(self) -> str:
        """The queue a run waits in: ``local/cuda:0``, ``gpu-box/cuda:2,cuda:3``, ``any/cuda``."""
        return f"{self.target}/{','.join(self.requested)}"


def _cards_of_kind(p: ProviderInfo, kind: str) -> list[str]:
    return [d.name for d in p.devices if d.kind == kind]


def _auto_choice(p: ProviderInfo) -> list[str]:
    """``auto``: every card of the provider's first accelerator kind, else its CPU."""
    for d in p.devices:
        if d.kind in ACCELERATOR_KINDS:
            return _cards_of_kind(p, d.kind)
    return ["cpu"] if "cpu" in p.device_names() else p.device_names()[:1]


def _single_choices(p: ProviderInfo, device: str) -> list[str]:
    """The provider's devices a one-device request may take (empty: it offers none)."""
    if device == "auto":
        return _auto_choice(p)
    if ":" not in device and device != "cpu":
        return _cards_of_kind(p, device)
    return [device] if device in p.device_names() else []


def _offers(p: ProviderInfo) -> str:
    names = p.device_names()
    return ", ".join(names) if names else "nothing"


def _local_resolution(local: ProviderInfo, t: RunTarget) -> Resolution:
    if t.devices is not None:
        missing = [d for d in t.devices if d not in local.device_names()]
        if missing:
            raise TargetError(f"this server does not offer {', '.join(missing)} (it offers {_offers(local)})")
        return Resolution(LOCAL, (Candidate(LOCAL, t.devices),), t.devices, True)
    device = t.device or "auto"
    choices = _single_choices(local, device)
    warnings: list[dict[str, Any]] = []
    if not choices:
        kind = device_kind(device)
        same_kind = _cards_of_kind(local, kind)
        fallback = same_kind[0] if same_kind else ("cpu" if "cpu" in local.device_names() else _auto_choice(local)[0])
        choices = [fallback]
        warnings.append({
            "kind": "device_fallback",
            "message": (
                f"The run is set to device {device}; this server offers {_offers(local)}, "
                f"so the run runs on {fallback}."
            ),
            "requested": device,
            "device": fallback,
        })
    cands = tuple(Candidate(LOCAL, (c,)) for c in choices)
    return Resolution(LOCAL, cands, (device,), False, tuple(warnings))


def _provider_candidates(p: ProviderInfo, t: RunTarget) -> list[Candidate]:
    if t.devices is not None:
        if all(d in p.device_names() for d in t.devices):
            return [Candidate(p.name, t.devices)]
        return []
    return [Candidate(p.name, (c,)) for c in _single_choices(p, t.device or "auto")]


def _any_may_use_local(t: RunTarget) -> bool:
    """Under ``any``, a CUDA set of more than one card, or one card other than cuda:0, needs a worker:
    only a worker renumbers the run's cards from cuda:0."""
    named = list(t.devices) if t.devices is not None else ([t.device] if t.device else [])
    cuda = [d for d in named if device_kind(d) == "cuda" and ":" in d]
    return not (len(cuda) > 1 or (len(cuda) == 1 and cuda[0] != "cuda:0"))


def resolve_target(
    t: RunTarget,
    providers: Sequence[ProviderInfo],
    pools: Mapping[str, Sequence[str]] | None = None,
) -> Resolution:
    """Candidates for a run (SPEC Q3); raise TargetError (400) with the message to show.

    ``providers``: this server (``is_local``) and every worker that connected since the server started,
    online or not. ``pools``: one-shot worker pools by name -> their workers' names.
    """
    local = next((p for p in providers if p.is_local), None)
    workers = sorted((p for p in providers if not p.is_local), key=lambda p: p.name)
    requested = t.devices if t.devices is not None else (t.device or "auto",)
    wanted = ", ".join(requested)
    if t.pool is not None:
        members = (pools or {}).get(t.pool)
        if members is None:
            raise TargetError(f"unknown pool '{t.pool}': no one-shot worker pool with this name is known")
        member_set = set(members)
        cands = [c for p in workers if p.name in member_set for c in _provider_candidates(p, t)]
        if not cands:
            raise TargetError(f"no worker of pool '{t.pool}' offers {wanted}")
        return Resolution(f"pool:{t.pool}", tuple(cands), requested, t.devices is not None)
    if t.worker == LOCAL:
        if local is None:
            raise TargetError("this server runs no local runs (no local provider)")
        return _local_resolution(local, t)
    if t.worker == "any":
        cands = [c for p in workers for c in _provider_candidates(p, t)]
        local_ok = _any_may_use_local(t)
        if local is not None and local_ok:
            cands += _provider_candidates(local, t)
        if not cands:
            seen = ", ".join(p.name for p in workers) or "none"
            why = "" if local_ok else (
                "; a CUDA set of more than one card, or one card other than cuda:0, runs on workers only"
            )
            server = " and this server does not either" if local_ok and local is not None else ""
            raise TargetError(
                f"no worker seen since the server started offers {wanted}{server} (workers: {seen}){why}"
            )
        return Resolution("any", tuple(cands), requested, t.devices is not None)
    worker = next((p for p in workers if p.name == t.worker), None)
    if worker is None:
        raise TargetError(f"unknown worker '{t.worker}': no worker with this name has connected since the server started")
    cands = _provider_candidates(worker, t)
    if not cands:
        missing = [d for d in requested if not _single_choices(worker, d)]
        raise TargetError(f"worker '{worker.name}' does not offer {', '.join(missing or requested)} "
                          f"(it offers {_offers(worker)})")
    return Resolution(worker.name, tuple(cands), requested, t.devices is not None)
