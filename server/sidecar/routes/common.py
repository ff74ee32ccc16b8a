"""What the route modules share: how a route declares and reads its body (its contract model), the run
a path names, its public form, its folder."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from aiohttp import web
from pydantic import BaseModel

from ....common.errors import ApiError
from ....common.http import NO_BODY, read_json, read_object
from ....constants import (
    RUNS_DIR_NAME,
)
from ...memory.views import run_fields
from ...run.requests import parse_body
from .. import auth
from ..dispatcher import Dispatcher
from ..keys import CONFIG_KEY, DISPATCHER_KEY, STORE_KEY
from ..objective import run_objective
from ..openapi import BODY_ATTR, BodySpec

M = TypeVar("M", bound=BaseModel)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Body(Generic[M]):
    """A route's body: ``model`` validated by its contract, ``raw`` the JSON object as sent (``{}`` for an
    optional body left out), which the rules that need more than the model read (the model's numbers are
    floats; a sweep's values keep their type)."""

    model: M
    raw: dict[str, Any]
    built: Any = None  # what the declaration's ``then`` made of the two (e.g. a run's typed request)


def body(model: type[M], *, required: bool = True, off_loop: bool = False,
         then: Callable[[M, dict[str, Any]], Any] | None = None,
         url_checks: Callable[[web.Request], object] | None = None
         ) -> Callable[[Callable[[web.Request, Body[M]], Awaitable[web.StreamResponse]]], Handler]:
    """Declare a route's body: the handler gets it validated by ``model`` (a 400 naming the field, in the
    contract's own words, before the handler runs), and the OpenAPI document shows ``model`` for it
    (openapi.bodies walks the routes). ``off_loop``: validate in a worker thread (a graph of 10,000 nodes);
    ``then(model, raw)``: what the handler gets as ``built``, made in the same thread (one hop, not two);
    ``url_checks``: the query's checks, answered before the body's (the URL is read first)."""
    spec = BodySpec(model, required)

    def parse(raw: dict[str, Any]) -> Body[M]:
        parsed = parse_body(model, raw)
        return Body(parsed, raw, then(parsed, raw) if then is not None else None)

    def declare(handler: Callable[[web.Request, Body[M]], Awaitable[web.StreamResponse]]) -> Handler:
        @functools.wraps(handler)
        async def validated(request: web.Request) -> web.StreamResponse:
            if url_checks is not None:
                url_checks(request)
            raw = await read_json(request, optional=not required)
            if raw is NO_BODY:
                raw = {}
            sent = await asyncio.to_thread(parse, raw) if off_loop else parse(raw)
            return await handler(request, sent)

        setattr(validated, BODY_ATTR, spec)  # what the OpenAPI document shows (openapi.bodies)
        return validated

    return declare


def passed_through(model: type[BaseModel]) -> Callable[[Handler], Handler]:
    """Declare a body the route passes on as sent (to a service's program, which validates it): ``model``
    documents it; the handler reads the bytes itself."""

    def declare(handler: Handler) -> Handler:
        setattr(handler, BODY_ATTR, BodySpec(model, True, passed_on=True))
        return handler

    return declare


def no_body(handler: Handler) -> Handler:
    """Declare a route that takes no body: it may send nothing or ``{}`` (a field is refused by name)."""

    @functools.wraps(handler)
    async def empty(request: web.Request) -> web.StreamResponse:
        await read_object(request, set(), optional=True)
        return await handler(request)

    setattr(empty, BODY_ATTR, BodySpec(None, False))
    return empty


def require_session_token(request: web.Request, what: str, command: str) -> None:
    """403 unless the request carries the server's session token (the one in runtime.json): what issues a
    one-time key (a login link, a pairing code) is for someone on the server's machine, who runs
    ``command`` there."""
    if not auth.token_matches(auth.bearer_token(request), request.app[CONFIG_KEY].token):
        raise ApiError(403, f"{what} needs the server's session token (the one in runtime.json): "
                            f"run `{command}` on the server's machine")


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
