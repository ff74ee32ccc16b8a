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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from ...constants import EVENTS_STREAM_BUFFERED_BYTES, EVENTS_STREAM_CHUNK_BYTES, EVENTS_STREAM_PAGE
from .hub import EventHub
from .store import Store

SSE_KEEPALIVE_S = 15.0  # a comment line this often keeps proxies from closing an idle stream


@dataclass(frozen=True)
class EventText:
    """One stored event: its cursor, its type and its JSON ``{"cursor", "type", "payload", "ts"}``."""

    cursor: int
    type: str
    json: str

    def sse(self) -> str:
        """The event as one Server-Sent Events message (``id:`` is the cursor, for ``Last-Event-ID``)."""
        return f"id: {self.cursor}\nevent: {self.type}\ndata: {self.json}\n\n"


def event_texts(store: Store, run_id: str, cursor: int, limit: int,
                types: Sequence[str] | None = None) -> list[EventText]:
    """Up to ``limit`` events after ``cursor``, oldest first, as JSON text (``Store.events_after``'s
    events, without decoding their payloads)."""
    sql = "SELECT cursor, type, payload, ts FROM events WHERE run_id=? AND cursor>?"
    params: list[Any] = [run_id, int(cursor)]
    if types:
        sql += f" AND type IN ({','.join('?' * len(types))})"
        params += list(types)
    sql += " ORDER BY cursor LIMIT ?"
    params.append(int(limit))
    dumps = json.dumps
    return [EventText(r["cursor"], r["type"], f'{{"cursor":{r["cursor"]},"type":{dumps(r["type"])},'
                                              f'"payload":{r["payload"]},"ts":{dumps(r["ts"])}}}')
            for r in store.query(sql, params)]


def events_page_json(events: Sequence[EventText], **fields: Any) -> str:
    """A long-poll answer ``{"events": [...], **fields}`` as JSON text."""
    tail = json.dumps(fields)
    return '{"events":[' + ",".join(e.json for e in events) + "]" + ("," + tail[1:] if fields else "}")


def chunks(events: Sequence[EventText]) -> list[bytes]:
    """The events' SSE messages joined into writes of about ``EVENTS_STREAM_CHUNK_BYTES`` (one message is
    never split; a larger one is a write of its own)."""
    out: list[bytes] = []
    part: list[str] = []
    size = 0
    for ev in events:
        text = ev.sse()
        if part and size + len(text) > EVENTS_STREAM_CHUNK_BYTES:
            out.append("".join(part).encode())
            part, size = [], 0
        part.append(text)
        size += len(text)
    if part:
        out.append("".join(part).encode())
    return out


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
        page = event_texts(store, run_id, cursor, EVENTS_STREAM_PAGE)
        if page:
            for chunk in chunks(page):
                await resp.write(chunk)
            cursor = page[-1].cursor
            await asyncio.sleep(0)  # the next page after every other ready task: health, heartbeats, ...
            continue
        if over:
            return
        try:
            await asyncio.wait_for(waiter.wait(), SSE_KEEPALIVE_S)
        except asyncio.TimeoutError:
            await resp.write(b": keepalive\n\n")
