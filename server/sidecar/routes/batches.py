"""What the sweep and study routes share (docs/sweeps.md): a batch of runs is listed, read (a long-poll on
its version), exported as CSV, cancelled and deleted the same way; :func:`add_batch_routes` adds those five
routes and their descriptions for one family (sweeps, studies), whose service does the work."""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web

from ....common.errors import ApiError
from ....common.http import float_param, int_param
from ....constants import EVENTS_LONG_POLL_MAX_S, RUNS_PAGE_MAX
from ...contracts.runs import Cancel
from .. import openapi
from .common import Body, body


class BatchService(Protocol):
    """What a batch family's service answers (sweeps/driver.py SweepService, sweeps/study.py StudyService)."""

    def list(self, limit: int, offset: int) -> dict[str, Any]: ...
    def get(self, batch_id: str) -> dict[str, Any]: ...
    def csv(self, batch_id: str) -> str: ...
    async def wait_change(self, batch_id: str, version: int, timeout: float) -> None: ...
    async def cancel(self, batch_id: str, reason: str | None = None) -> dict[str, Any]: ...
    def delete(self, batch_id: str) -> dict[str, Any] | Awaitable[dict[str, Any]]: ...


@dataclass(frozen=True)
class Batch:
    """One family's routes: its app key, its noun (``sweep``: the id is ``sweep_id``, the CSV file
    ``sweep-<id>.csv``), its path (``/api/sweeps``) and its CSV's (``table.csv``)."""

    key: web.AppKey[Any]
    noun: str
    prefix: str
    csv_path: str

    @property
    def item(self) -> str:
        return f"{self.prefix}/{{{self.noun}_id}}"


def json_body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": schema}}}


def errors(*codes: int) -> dict[str, Any]:
    return {str(c): {"description": "error (the message says what to fix)", **json_body(openapi.ERROR)}
            for c in codes}


def query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema, "description": description}


def bool_param(request: web.Request, name: str, default: bool = False) -> bool:
    raw = request.query.get(name)
    if raw is None:
        return default
    if raw.lower() in ("1", "true", "yes"):
        return True
    if raw.lower() in ("0", "false", "no"):
        return False
    raise ApiError(400, f"{name}: must be true or false, got {raw!r}")


async def json_off_loop(obj: Any, status: int = 200) -> web.Response:
    """A JSON answer encoded in a worker thread (a 5,000-variant table is megabytes, issue 19)."""
    text = await asyncio.to_thread(json.dumps, obj)
    return web.Response(text=text, status=status, content_type="application/json")


def add_batch_routes(routes: web.RouteTableDef, batch: Batch) -> None:
    """Add the family's list, get, CSV, cancel and delete routes to ``routes``."""
    item, id_name = batch.item, f"{batch.noun}_id"

    def service(request: web.Request) -> BatchService:
        return request.app[batch.key]

    @routes.get(batch.prefix)
    async def listing(request: web.Request) -> web.Response:
        limit = int_param(request, "limit", 50, 1, RUNS_PAGE_MAX)
        offset = int_param(request, "offset", 0, 0)
        return web.json_response({**service(request).list(limit, offset), "limit": limit, "offset": offset})

    @routes.get(item)
    async def one(request: web.Request) -> web.Response:
        svc, batch_id = service(request), request.match_info[id_name]
        wait = float_param(request, "wait", 0.0, 0.0, EVENTS_LONG_POLL_MAX_S)
        version = int_param(request, "version", -1, -1)
        if wait > 0 and version >= 0:
            await svc.wait_change(batch_id, version, wait)
        return await json_off_loop(await asyncio.to_thread(svc.get, batch_id))

    @routes.get(f"{item}/{batch.csv_path}")
    async def table(request: web.Request) -> web.Response:
        batch_id = request.match_info[id_name]
        text = await asyncio.to_thread(service(request).csv, batch_id)  # a 5,000-variant table: off the loop
        return web.Response(text=text, content_type="text/csv", charset="utf-8",
                            headers={"Content-Disposition":
                                     f'attachment; filename="{batch.noun}-{batch_id}.csv"'})

    @routes.post(f"{item}/cancel")
    @body(Cancel, required=False)
    async def cancel(request: web.Request, sent: Body[Cancel]) -> web.Response:
        return await json_off_loop(await service(request).cancel(request.match_info[id_name],
                                                                  sent.model.reason))

    @routes.delete(item)
    async def delete(request: web.Request) -> web.Response:
        out = service(request).delete(request.match_info[id_name])
        return web.json_response(await out if inspect.isawaitable(out) else out)


def describe_batch(app: web.Application, batch: Batch, schema: dict[str, Any], text: dict[str, Any]) -> None:
    """The family's descriptions: ``text["submit"]`` (its POST's operation), and the five shared routes
    with ``schema`` (one batch as answered) and their summaries (``text``: list, get, csv, cancel, delete)."""
    item = batch.item
    id_param = {"name": f"{batch.noun}_id", "in": "path", "required": True, "schema": {"type": "string"}}
    ops = {
        ("post", batch.prefix): text["submit"],
        ("get", batch.prefix): {
            "summary": text["list"],
            "parameters": [query("limit", {"type": "integer", "minimum": 1, "maximum": RUNS_PAGE_MAX}, "page size"),
                           query("offset", {"type": "integer", "minimum": 0}, "page start")],
            "responses": {"200": {"description": f"{{{batch.prefix.rsplit('/', 1)[1]}, total}}"},
                          **errors(400, 401, 403)}},
        ("get", item): {
            "summary": text["get"],
            "parameters": [id_param, query("version", {"type": "integer", "minimum": 0}, "the version last seen"),
                           query("wait", {"type": "number", "minimum": 0, "maximum": EVENTS_LONG_POLL_MAX_S},
                                 "seconds to wait for a change of version")],
            "responses": {"200": {"description": "the answer", **json_body(schema)},
                          **errors(400, 401, 403, 404)}},
        ("get", f"{item}/{batch.csv_path}"): {
            "summary": text["csv"], "parameters": [id_param],
            "responses": {"200": {"description": "text/csv"}, **errors(401, 403, 404)}},
        ("post", f"{item}/cancel"): {
            "summary": text["cancel"], "parameters": [id_param],
            "responses": {"200": {"description": "the answer", **json_body(schema)},
                          **errors(400, 401, 403, 404, 409)}},
        ("delete", item): {
            "summary": text["delete"], "parameters": [id_param],
            "responses": {"200": {"description": "{deleted, runs_deleted}"}, **errors(401, 403, 404, 409)}},
    }
    for (method, path), op in ops.items():
        openapi.describe(app, method, path, op)
