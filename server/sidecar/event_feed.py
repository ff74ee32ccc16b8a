"""A run's stored events as its readers get them (docs/events.md "Reading a large run"): the long-poll's
page and the Server-Sent Events stream, made in bounded steps so a 100,000-event history never holds the
event loop (issue 29).

Each event's JSON is spliced from its stored payload text (already JSON, written by the store), so no
payload is decoded and encoded again; a stream reads, encodes and writes ``EVENTS_STREAM_PAGE`` events a
step and then yields, and stops reading while its client has ``EVENTS_STREAM_BUFFERED_BYTES`` unsent.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, NamedTuple

from aiohttp import web

from ...constants import EVENTS_STREAM_BUFFERED_BYTES, EVENTS_STREAM_CHUNK_BYTES, EVENTS_STREAM_PAGE
from .hub import EventHub
from .store import Store

SSE_KEEPALIVE_S = 15.0  # a comment line this often keeps proxies from closing an idle stream


_SQL = "SELECT cursor, type, payload, ts FROM events WHERE run_id=? AND cursor>?"
_TYPE_JSON: dict[str, str] = {}  # an event type's JSON string (a few dozen types, each encoded once)


class EventText(NamedTuple):
    """One stored event: its cursor, its type and its JSON ``{"cursor", "type", "payload", "ts"}``."""

    cursor: int
    type: str
    json: str


def _rows(store: Store, run_id: str, cursor: int, limit: int, types: Sequence[str] | None = None) -> list[Any]:
    sql, params = _SQL, [run_id, int(cursor)]
    if types:
        sql += f" AND type IN ({','.join('?' * len(types))})"
        params += list(types)
    return store.query(sql + " ORDER BY cursor LIMIT ?", [*params, int(limit)])


def _json(row: Any) -> str:
    """The event's JSON: the stored payload is JSON already (the store wrote it), spliced in as it is."""
    cursor, kind, payload, ts = row
    kind_json = _TYPE_JSON.get(kind)
    if kind_json is None:
        kind_json = _TYPE_JSON.setdefault(kind, json.dumps(kind))
    # repr of a finite float is json.dumps's; a non-finite time (a run child's own) is null, as in JSON
    return f'{{"cursor":{cursor},"type":{kind_json},"payload":{payload},"ts":{repr(ts) if math.isfinite(ts) else "null"}}}'


def event_texts(store: Store, run_id: str, cursor: int, limit: int,
                types: Sequence[str] | None = None) -> list[EventText]:
    """Up to ``limit`` events after ``cursor``, oldest first, as JSON text (``Store.events_after``'s
    events, without decoding their payloads)."""
    return [EventText(r[0], r[1], _json(r)) for r in _rows(store, run_id, cursor, limit, types)]


def events_page_json(events: Sequence[EventText], **fields: Any) -> str:
    """A long-poll answer ``{"events": [...], **fields}`` as JSON text."""
    tail = json.dumps(fields)
    return '{"events":[' + ",".join(e.json for e in events) + "]" + ("," + tail[1:] if fields else "}")


def sse_page(store: Store, run_id: str, cursor: int, limit: int = EVENTS_STREAM_PAGE) -> tuple[int, list[bytes]]:
    """Up to ``limit`` events after ``cursor`` as Server-Sent Events messages (``id:`` is the cursor, for
    ``Last-Event-ID``), joined into writes of about ``EVENTS_STREAM_CHUNK_BYTES`` (a message is never
    split: a larger one is a write of its own); with the last cursor read (``cursor`` when none)."""
    out: list[bytes] = []
    part: list[str] = []
    size = 0
    for row in _rows(store, run_id, cursor, limit):
        cursor = row[0]
        text = f"id: {cursor}\nevent: {row[1]}\ndata: {_json(row)}\n\n"
        if part and size + len(text) > EVENTS_STREAM_CHUNK_BYTES:
            out.append("".join(part).encode())
            part, size = [], 0
        part.append(text)
        size += len(text)
    if part:
        out.append("".join(part).encode())
    return cursor, out


async def stream_events(request: web.Request, resp: web.StreamResponse, store: Store, hub: EventHub, run_id: str,
                        cursor: int, ended: Callable[[], bool]) -> None:
    """Write the run's events after ``cursor`` to a prepared SSE response, then its new ones as they come,
    until ``ended()`` (the run finished, or the sidecar stops) and every event is sent."""
    transport = request.transport
    if transport is not None:  # the drain in resp.write waits while this much is unsent
        transport.set_write_buffer_limits(high=EVENTS_STREAM_BUFFERED_BYTES)
    while True:
        waiter = hub.waiter(run_id)  # before reading: a notification in between is not lost
        over = ended()  # before reading too: a run's last events are read after it ended
        async with hub.page_turns:  # one page, then the loop goes round (health, heartbeats), then the next stream's
            cursor, page = sse_page(store, run_id, cursor)
            if page:
                await asyncio.sleep(0)
        if page:
            for chunk in page:  # outside the turn: a slow client's drain holds only its own stream
                await resp.write(chunk)
            continue
        if over:
            return
        try:
            await asyncio.wait_for(waiter.wait(), SSE_KEEPALIVE_S)
        except asyncio.TimeoutError:
            await resp.write(b": keepalive\n\n")


async def pages(store: Store, hub: EventHub, run_id: str, types: Sequence[str], limit: int | None = None,
                page: int = EVENTS_STREAM_PAGE) -> AsyncIterator[list[dict[str, Any]]]:
    """The run's events of ``types`` (decoded, as ``Store.events_after`` gives them), oldest first, up to
    ``limit`` in all, a page at a time, each page read in its own turn (``EventHub.page_turns``): a reader
    of 100,000 metric points lets the loop go round between pages."""
    cursor, left = 0, limit
    while left is None or left > 0:
        n = page if left is None else min(page, left)
        async with hub.page_turns:
            events = store.events_after(run_id, cursor, n, types)
            await asyncio.sleep(0)
        if events:
            yield events
            cursor = events[-1]["cursor"]
            left = None if left is None else left - len(events)
        if len(events) < n:
            return
