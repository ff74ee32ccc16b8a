"""What the run routes share: the run a path names, its public form, its folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiohttp import web

from ....common.errors import ApiError
from ....constants import (
    RUNS_DIR_NAME,
)
from ...memory.views import run_fields
from ..dispatcher import Dispatcher
from ..keys import CONFIG_KEY, DISPATCHER_KEY, STORE_KEY
from ..objective import run_objective


def dispatcher_of(request: web.Request) -> Dispatcher:
    return request.app[DISPATCHER_KEY]


def run_or_404(request: web.Request, with_graph: bool = False) -> dict[str, Any]:
    run_id = request.match_info["run_id"]
    run = request.app[STORE_KEY].get_run(run_id, with_graph=with_graph)
    if run is None:
        raise ApiError(404, f"no run {run_id!r}")
    return run


def public_run(run: dict[str, Any], dispatcher: Dispatcher | None = None,
               memory: dict[str, Any] | None = None) -> dict[str, Any]:
    """A run as the API shows it; with the dispatcher, its queue position and memory fields (budget with
    its source, graph key, per-card figure: ``memory`` when the caller fetched them for a whole page)."""
    out = dict(run)
    out.pop("pid", None)
    out["objective"] = run_objective(run.get("final_metrics"))  # the row's headline (docs/runs-panel.md)
    if dispatcher is not None and run["status"] == "queued":
        out["queue_position"] = dispatcher.queue_position(run["id"])
    if memory is None and dispatcher is not None:
        memory = run_fields(dispatcher.memory, [run]).get(run["id"])
    if memory is not None:
        out.update(memory)
    return out




def run_dir_of(request: web.Request, run: dict[str, Any]) -> Path | None:
    if not run.get("run_dir"):
        return None
    cfg = request.app[CONFIG_KEY]
    root = (cfg.home / RUNS_DIR_NAME).resolve()
    path = Path(run["run_dir"]).resolve()
    return path if path.parent == root else None
