"""What a submission is refused for by name before its graph is read or its budget decided (pure).

The dispatcher's admission (``Dispatcher.admit``) asks these for every run, sweep child and study trial,
so a target that one run would be refused for refuses the whole batch with the same text."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ...constants import LOCAL_PROVIDER
from ..run.requests import RunRequest
from ..scheduling import Resolution

RECORD_OUTPUTS_ONE_SHOT = ("options.record_outputs is off for a one-shot worker: its agent exits when the run "
                           "ends, so nothing could read the outputs it keeps; use \"upload\" (copied here "
                           "first) or leave it out")


def validates_here(validate_local_graphs: bool, resolution: Resolution, kind_is_comfyui: bool = False) -> bool:
    """Whether this server validates the graph of a run with ``resolution``: when it can only run here
    (a worker validates what it runs; pool and mount runs never run here). A ComfyUI run is checked by the
    routing against the ComfyUI that runs it (server/comfyflow/check.py), not by this server's node classes."""
    return validate_local_graphs and not resolution.dynamic and not kind_is_comfyui and all(
        c.provider == LOCAL_PROVIDER for c in resolution.candidates)


def refusal(request: RunRequest, resolution: Resolution, closed_pools: Mapping[str, str],
            one_shot: Callable[[str], bool]) -> str | None:
    """The 400 text for a run its target cannot take, or None. ``closed_pools``: pool -> why it takes no
    runs; ``one_shot(provider)``: whether that provider is a one-shot agent (it exits after one run)."""
    pool = request.target.pool
    if pool is not None and pool in closed_pools:
        return closed_pools[pool]
    if request.options.get("record_outputs") is True and any(one_shot(c.provider) for c in resolution.candidates):
        return RECORD_OUTPUTS_ONE_SHOT
    return None
