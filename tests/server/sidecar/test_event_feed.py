"""A run's events as readers get them (server/sidecar/event_feed.py, issue 29): the JSON spliced from the
stored payloads is what ``Store.events_after`` decodes; a stream's page is bounded in events and its writes
in bytes; the long-poll answer parses; and a client that stops reading stops the stream reading the store
(aiohttp's drain at EVENTS_STREAM_BUFFERED_BYTES), in this process on loopback."""

from __future__ import annotations

import asyncio
import json
import os
import socket

import sidecar_harness as harness  # registered by tests/server/conftest.py

from xpufleet.constants import (
    CANVAS_EVENTS_MAX,
    EVENTS_STREAM_BUFFERED_BYTES,
    EVENTS_STREAM_CHUNK_BYTES,
    EVENTS_STREAM_PAGE,
)
from xpufleet.server.run.events import NewEvent
from xpufleet.server.sidecar import event_feed
from xpufleet.server.sidecar.event_feed import event_texts, events_page_json, sse_page

ODD = [
    NewEvent("metric", {"node": "8", "name": "loss", "value": 0.25, "step": 3}, 1765000000.123456, 1),
    NewEvent("log", {"message": "ünïcödé \u2028 line\nbreak \"quoted\" \\ back", "node": "2"}, 2.5, 2),
    NewEvent("progress", {"node": "8", "value": 1, "max": 2, "nested": {"a": [1, None, True]}}, 3.0, 3),
    NewEvent("metric", {"node": "8", "name": "loss", "value": float("nan")}, 4.0, 4),  # stored as null
]


def _run(store, events=ODD) -> str:
    run_id = store.create_canvas_run(graph=harness.iris_graph(1), name="feed", facts={})
    store.append_events(run_id, events)
    return run_id


def test_the_spliced_json_is_what_the_store_decodes(store):
    run_id = _run(store)
    for types in (None, ["metric"], ["log", "progress"]):
        texts = event_texts(store, run_id, 0, 100, types)
        assert [json.loads(t.json) for t in texts] == store.events_after(run_id, 0, 100, types)
        assert [t.cursor for t in texts] == [e["cursor"] for e in store.events_after(run_id, 0, 100, types)]
    assert [t.cursor for t in event_texts(store, run_id, 2, 1)] == [3]  # after the cursor, up to the limit
    page = json.loads(events_page_json(event_texts(store, run_id, 0, 100), cursor=4, status="running", done=False))
    assert page == {"events": store.events_after(run_id, 0, 100), "cursor": 4, "status": "running", "done": False}
    assert json.loads(events_page_json([], cursor=0)) == {"events": [], "cursor": 0}


def test_a_stream_page_is_bounded_in_events_and_its_writes_in_bytes(store):
    big = "x" * (EVENTS_STREAM_CHUNK_BYTES + 10)  # one message larger than a write: a write of its own
    events = [NewEvent("metric", {"name": "m", "value": float(i), "step": i}, 1.0, i + 1) for i in range(900)]
    events.insert(400, NewEvent("log", {"message": big}, 1.0, None))
    run_id = _run(store, events)
    cursor, seen, writes = 0, [], []
    while True:
        last, chunks = sse_page(store, run_id, cursor)
        if not chunks:
            assert last == cursor
            break
        messages = [m for c in chunks for m in c.decode().split("\n\n") if m]
        assert len(messages) <= EVENTS_STREAM_PAGE
        seen += [(int(m.split("\n")[0][4:]), json.loads(m.split("\n")[2][6:])) for m in messages]
        writes += chunks
        cursor = last
    last = store.last_cursor(run_id)
    assert last == 902 and [c for c, _ in seen] == list(range(1, last + 1)) and cursor == last  # + its status
    assert [e for _, e in seen] == store.events_after(run_id, 0, 1000)
    for chunk in writes:
        assert len(chunk) <= EVENTS_STREAM_CHUNK_BYTES or chunk.count(b"\n\nid: ") == 0, len(chunk)
    assert any(len(c) > EVENTS_STREAM_CHUNK_BYTES for c in writes)  # the big one, alone


async def test_a_client_that_stops_reading_stops_the_stream_reading_the_store(sidecar_client, monkeypatch):
    client, config = await sidecar_client()
    auth = {"Authorization": f"Bearer {config.token}"}
    resp = await client.post("/api/canvas/runs", json={"prompt_id": "p", "name": "big", "graph": harness.iris_graph(1),
                                                       "comfy_pid": os.getpid()}, headers=auth)
    run_id = (await resp.json())["id"]
    n = 30_000
    for start in range(0, n, CANVAS_EVENTS_MAX):
        batch = [{"type": "metric", "payload": {"node": "8", "name": "loss", "value": 1.0, "step": i, "pad": "p" * 200},
                  "ts": 1.0, "seq": i + 1} for i in range(start, start + CANVAS_EVENTS_MAX)]
        body = {"events": batch, **({"finished": {"status": "succeeded", "error": None, "final_metrics": {}}}
                                    if start + CANVAS_EVENTS_MAX >= n else {})}
        assert (await client.post(f"/api/canvas/runs/{run_id}/events", json=body, headers=auth)).status == 200
    produced: list[int] = []
    real = event_feed.sse_page

    def counting(*args, **kwargs):
        cursor, chunks = real(*args, **kwargs)
        produced.append(sum(map(len, chunks)))
        return cursor, chunks

    monkeypatch.setattr(event_feed, "sse_page", counting)
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a slow reader: a small window, nothing read
    sock.setblocking(False)
    await loop.sock_connect(sock, (client.server.host, client.server.port))
    await loop.sock_sendall(sock, f"GET /api/runs/{run_id}/events/stream HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                  f"Authorization: Bearer {config.token}\r\n\r\n".encode())
    # The stream fills the socket's buffers and then waits in aiohttp's drain: the count of pages read stops
    # growing. Await that state (bounded), then check how far it got.
    stable, last = 0, -1
    for _ in range(600):
        await asyncio.sleep(0.05)
        stable = stable + 1 if len(produced) == last else 0
        last = len(produced)
        if stable >= 20 and last > 0:
            break
    total = n * 200  # less than the run's whole stream: each event's pad alone is 200 bytes
    held = sum(produced)
    # what left the store is in the kernel's socket buffers (the sender's and this receiver's) or at most
    # EVENTS_STREAM_BUFFERED_BYTES plus a page in the sidecar: not the run's whole history
    kernel = _max_buffer("tcp_wmem") + 2 * 4096 * 4
    assert held <= kernel + EVENTS_STREAM_BUFFERED_BYTES + 2 * EVENTS_STREAM_CHUNK_BYTES + max(produced), (held, kernel)
    assert held < total, (held, total)
    # reading again, the client gets the whole run, in order
    sock.setblocking(True)
    data = bytearray()
    await loop.run_in_executor(None, _read_to_end, sock, data)
    ids = [int(line[4:]) for line in data.split(b"\n") if line.startswith(b"id: ")]
    assert ids == list(range(1, n + 3)), (len(ids), ids[:3], ids[-3:])  # + status, + run_finished


def _read_to_end(sock: socket.socket, data: bytearray) -> None:
    sock.settimeout(120)
    while chunk := sock.recv(1 << 16):
        data += chunk
        if data.endswith(b"0\r\n\r\n"):  # the chunked body's end
            break
    sock.close()


def _max_buffer(name: str) -> int:
    with open(f"/proc/sys/net/ipv4/{name}") as f:
        return int(f.read().split()[2])
