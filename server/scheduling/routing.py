"""Routing choice (docs/sidecar.md): a validated target -> candidates in preference order (pure)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...constants import ACCELERATOR_KINDS, LOCAL_PROVIDER, RUN_KIND_COMFYUI, RUN_KIND_GRAPH
from ..devices.names import device_kind
from .offers import ProviderInfo
from .plan import Candidate

LOCAL = LOCAL_PROVIDER

# --- target resolution (docs/sidecar.md) ------------------------------------------------------------------------


class TargetError(ValueError):
    """A target or device the server rejects with 400; the message is the answer's ``error``."""


@dataclass(frozen=True)
class RunTarget:
    """A validated ``options.target`` (+ ``options.device``).

    ``worker``: ``"local"``, ``"any"`` or a worker name; ``devices``: a device set (strict: every device
    must be offered); ``device``: one device without a set (``auto``, a kind, or a card; a local run
    falls back when the machine lacks it); ``pool``: a one-shot worker pool. ``mounts``: the storage
    mount labels the graph's file inputs name (docs/workers.md; only a worker declaring them all can run it).
    ``kind``: ``graph`` or ``comfyui`` (server/comfyflow/kind.py); a ComfyUI run's ``workflow`` (its graph, plain
    data) is what the check given to :func:`resolve_target` tests each provider's ComfyUI against.
    """

    worker: str = LOCAL
    devices: tuple[str, ...] | None = None
    device: str | None = None
    pool: str | None = None
    memory_gib: float | None = None
    memory_source: str | None = None
    wait: bool | None = None
    mounts: tuple[str, ...] = ()
    # A ddp run over several workers (worker "spread"): (worker, devices) per part, ranks in order.
    spread: tuple[tuple[str, tuple[str, ...]], ...] | None = None
    kind: str = RUN_KIND_GRAPH
    workflow: Mapping[str, Any] | None = field(default=None, compare=False)

    @property
    def is_comfyui(self) -> bool:
        return self.kind == RUN_KIND_COMFYUI


# Whether a provider's ComfyUI can run a ComfyUI run's workflow (server/comfyflow/check.py
# provider_verdict, injected: scheduling must not import it): ("ok", ""), ("wait", why) while it reads its
# ComfyUI, or ("no", the refusal).
ComfyCheck = Callable[["ProviderInfo", RunTarget], tuple[str, str]]
OK, WAIT, NO = "ok", "wait", "no"
SPREAD_COMFYUI = ("options.target.spread is for training graphs: a ComfyUI workflow runs on one worker's cards; "
                  "target that worker")


def pool_without_comfyui(pool: str) -> str:
    """The refusal of a ComfyUI run for a pool whose agents run no ComfyUI."""
    return (f"pool '{pool}' runs no ComfyUI workflows: its agents are not started with --comfyui; create a pool "
            f"whose agents are (xpufleet pools create NAME --comfyui PATH, or \"comfyui\" in POST /api/pools), or "
            f"choose another target")


MEMORY_SOURCES = ("user", "estimate", "measured")



@dataclass(frozen=True)
class Resolution:
    """Where a run may go: its candidates in preference order, plus what to record."""

    target: str
    candidates: tuple[Candidate, ...]
    requested: tuple[str, ...]
    device_set: bool
    warnings: tuple[dict[str, Any], ...] = ()
    # Why it waits while it has no candidate yet (a pool with no instance that can take it, no worker
    # with the mount it needs); ``dynamic``: resolve it again when providers change (pools, mounts).
    note: str | None = None
    dynamic: bool = False

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


def _labels(labels: Sequence[str]) -> str:
    return ", ".join(f"'{m}'" for m in labels)


def _lacks_mounts(p: ProviderInfo, t: RunTarget) -> list[str]:
    return [m for m in t.mounts if m not in p.mounts]


def _provider_candidates(p: ProviderInfo, t: RunTarget, check_mounts: bool = True) -> list[Candidate]:
    if check_mounts and _lacks_mounts(p, t):
        return []
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


def _spread_resolution(t: RunTarget, workers: Sequence[ProviderInfo],
                       pools: Mapping[str, Sequence[str]]) -> Resolution:
    """One candidate taking every entry's cards at once (ddp across workers); each entry's worker is
    checked like a named worker's target, the error prefixed by the entry's path."""
    assert t.spread is not None
    for i, (name, devices) in enumerate(t.spread):
        path = f"options.target.spread[{i}]"
        try:
            _named_worker(RunTarget(name, devices, mounts=t.mounts), workers, pools)
        except TargetError as exc:
            raise TargetError(f"{path}: {exc}") from None
    (first, devices), *extra = t.spread
    requested = tuple(f"{w}:{','.join(devs)}" for w, devs in t.spread)
    return Resolution("+".join(w for w, _ in t.spread), (Candidate(first, devices, tuple(extra)),), requested, True)


def _named_worker(t: RunTarget, workers: Sequence[ProviderInfo], pools: Mapping[str, Sequence[str]],
                  comfy_check: ComfyCheck | None = None) -> Resolution:
    """A target naming one worker (``options.target.worker``): its candidates, or the 400."""
    requested = t.devices if t.devices is not None else (t.device or "auto",)
    worker = next((p for p in workers if p.name == t.worker), None)
    if worker is None:
        raise TargetError(f"unknown worker '{t.worker}': no worker with this name has connected since the server started")
    pool = next((name for name, members in pools.items() if worker.name in members), None)
    if pool is not None:
        raise TargetError(f"worker '{worker.name}' is a one-shot instance of pool '{pool}': target the pool "
                          f"(options.target.pool = \"{pool}\")")
    if worker.disabled:
        raise TargetError(f"worker '{worker.name}' is disabled: enable it (xpufleet workers enable {worker.name}) "
                          f"or choose another target")
    lacking = _lacks_mounts(worker, t)
    if lacking:
        have = ", ".join(sorted(worker.mounts)) or "none"
        raise TargetError(f"worker '{worker.name}' has no storage mount {_labels(lacking)} (its mounts: {have}); "
                          f"start its agent with --mount {lacking[0]}=FOLDER, or choose another target")
    cands = _provider_candidates(worker, t)
    if not cands:
        missing = [d for d in requested if not _single_choices(worker, d)]
        raise TargetError(f"worker '{worker.name}' does not offer {', '.join(missing or requested)} "
                          f"(it offers {_offers(worker)})")
    status, text = _comfy(worker, t, comfy_check)
    if status == NO:
        raise TargetError(text)
    if status == WAIT:  # resolved again when its reading arrives: then it runs, or fails with the check's text
        return Resolution(worker.name, (), requested, t.devices is not None, note=text, dynamic=True)
    return Resolution(worker.name, tuple(cands), requested, t.devices is not None)


def _comfy(p: ProviderInfo, t: RunTarget, check: ComfyCheck | None) -> tuple[str, str]:
    """Whether ``p`` can run ``t``'s workflow (a training graph, or no check given: it can)."""
    if not t.is_comfyui or check is None:
        return OK, ""
    return check(p, t)


def resolve_target(
    t: RunTarget,
    providers: Sequence[ProviderInfo],
    pools: Mapping[str, Sequence[str]] | None = None,
    comfy_check: ComfyCheck | None = None,
    comfy_pools: Collection[str] = (),
) -> Resolution:
    """Candidates for a run (docs/sidecar.md, docs/workers.md); raise TargetError (400) with the message to show.

    ``providers``: this server (``is_local``) and every worker that connected since the server started,
    online or not. ``pools``: one-shot worker pools by name -> the names of their live instances. A pool
    instance takes runs for its pool only; a disabled worker is never chosen for a new run. A run whose
    graph names mount labels goes to a worker declaring them all: a named worker without them is a 400,
    ``any`` and pool runs wait for one (``dynamic``: the dispatcher resolves them again).

    A ComfyUI run (``t.kind``) goes only where ``comfy_check`` says the provider's ComfyUI can run its whole
    workflow: a named worker (or this server) that cannot is a 400 with the check's text; one still reading
    its ComfyUI makes the run wait (dynamic, like mounts); ``any`` considers only the providers that can.
    ``comfy_pools``: the pools whose agents run a ComfyUI (their instances are checked as they join).
    """
    pools = pools or {}
    instances = {n for members in pools.values() for n in members}
    local = next((p for p in providers if p.is_local), None)
    workers = sorted((p for p in providers if not p.is_local), key=lambda p: p.name)
    if t.spread is not None:
        if t.is_comfyui:
            raise TargetError(SPREAD_COMFYUI)
        return _spread_resolution(t, workers, pools)
    requested = t.devices if t.devices is not None else (t.device or "auto",)
    wanted = ", ".join(requested)
    mounts = f" with mount {_labels(t.mounts)}" if t.mounts else ""
    if t.pool is not None:
        members = pools.get(t.pool)
        if members is None:
            raise TargetError(f"unknown pool '{t.pool}': no one-shot worker pool with this name is known "
                              f"(xpufleet pools create {t.pool})")
        if t.is_comfyui and t.pool not in comfy_pools:
            raise TargetError(pool_without_comfyui(t.pool))
        member_set = set(members)
        offering = [p for p in workers if p.name in member_set and _provider_candidates(p, t)]
        judged = [(p, _comfy(p, t, comfy_check)) for p in offering]
        cands = [c for p, v in judged if v[0] == OK for c in _provider_candidates(p, t)]
        refused = [text for _, (status, text) in judged if status == NO]
        if not cands and refused and not any(status == WAIT for _, (status, _t) in judged):
            raise TargetError(refused[0])  # an instance that joined cannot run it: the run fails with why
        note = None
        if not cands and judged:
            note = next(text for _, (status, text) in judged if status == WAIT)
        elif not cands:
            note = (f"no instance of pool '{t.pool}' is connected; the run waits for one to join" if not members
                    else f"no connected instance of pool '{t.pool}' offers {wanted}{mounts}; the run waits for "
                         f"one that does")
        return Resolution(f"pool:{t.pool}", tuple(cands), requested, t.devices is not None, note=note, dynamic=True)
    if t.worker == LOCAL:
        if local is None:
            raise TargetError("this server runs no local runs (no local provider)")
        if t.is_comfyui:
            status, text = _comfy(local, t, comfy_check)
            if status == NO:
                raise TargetError(text)
            if status == WAIT:
                return Resolution(LOCAL, (), (t.device or "auto",) if t.devices is None else t.devices,
                                  t.devices is not None, note=text, dynamic=True)
        elif local.cannot_run:  # a ComfyUI run needs no training packages here: its ComfyUI runs it
            raise TargetError(local.cannot_run)
        if t.mounts:
            raise TargetError(
                f"the graph reads storage mount {_labels(t.mounts)} (a 'label:file' input), which resolves on "
                f"workers only: target a worker that declares it (xpufleet agent start --mount "
                f"{t.mounts[0]}=FOLDER), or any")
        return _local_resolution(local, t)
    if t.worker == "any":
        eligible = [p for p in workers if p.name not in instances and not p.disabled]
        verdicts = {p.name: _comfy(p, t, comfy_check) for p in eligible}
        capable = [p for p in eligible if verdicts[p.name][0] == OK]
        cands = [c for p in capable for c in _provider_candidates(p, t)]
        local_verdict = _comfy(local, t, comfy_check) if local is not None else (NO, "")
        local_ok = _any_may_use_local(t) and not t.mounts and local_verdict[0] == OK and not (
            local is not None and local.cannot_run and not t.is_comfyui)
        if local is not None and local_ok:
            cands += _provider_candidates(local, t)
        if t.is_comfyui and not cands:
            return _any_comfyui_without_candidate(t, eligible, verdicts, local, local_verdict, requested)
        if not cands and t.mounts and any(_provider_candidates(p, t, check_mounts=False) for p in eligible):
            note = (f"no worker seen since the server started declares mount {_labels(t.mounts)}; the run waits "
                    f"for one (xpufleet agent start --mount {t.mounts[0]}=FOLDER)")
            return Resolution("any", (), requested, t.devices is not None, note=note, dynamic=True)
        if not cands:
            seen = ", ".join(p.name for p in eligible) or "none"
            why = "" if _any_may_use_local(t) else (
                "; a CUDA set of more than one card, or one card other than cuda:0, runs on workers only"
            )
            server = " and this server does not either" if local_ok and local is not None else ""
            if local is not None and local.cannot_run:
                server = f" ({local.cannot_run})"
            raise TargetError(
                f"no worker seen since the server started offers {wanted}{server} (workers: {seen}){why}"
            )
        return Resolution("any", tuple(cands), requested, t.devices is not None, dynamic=bool(t.mounts))
    return _named_worker(t, workers, pools, comfy_check)


def _any_comfyui_without_candidate(t: RunTarget, eligible: Sequence[ProviderInfo],
                                   verdicts: Mapping[str, tuple[str, str]], local: ProviderInfo | None,
                                   local_verdict: tuple[str, str], requested: tuple[str, ...]) -> Resolution:
    """An ``any`` ComfyUI run no provider can take now: it waits while one that offers its devices still reads
    its ComfyUI, else the 400 says why each provider that offers them cannot run it."""
    offering = [p for p in eligible if _provider_candidates(p, t)]
    if any(verdicts[p.name][0] == WAIT for p in offering) or (
            local is not None and local_verdict[0] == WAIT and _any_may_use_local(t)):
        waiting = next(text for status, text in [*(verdicts[p.name] for p in offering), local_verdict]
                       if status == WAIT)
        return Resolution("any", (), requested, t.devices is not None, note=waiting, dynamic=True)
    wanted = ", ".join(requested)
    reasons = [verdicts[p.name][1] for p in offering]
    if local is not None and _any_may_use_local(t) and _provider_candidates(local, t) and local_verdict[1]:
        reasons.append(local_verdict[1])
    seen = ", ".join(p.name for p in eligible) or "none"
    if not reasons:
        raise TargetError(f"no worker seen since the server started offers {wanted} (workers: {seen})")
    raise TargetError(f"no worker seen since the server started can run this workflow on {wanted}: "
                      + "; ".join(reasons))
