"""Bodies are read whole (issue 31; common/http.py ``read_body``): EVERY route that reads a body, on the
sidecar (enumerated from the router's declarations, as tests/server/sidecar/test_openapi.py does) and on
ComfyUI's server (the predictor, the canvas name, the sidecar start, the proxy), gets a body larger than
one network read sent in several writes with pauses, and answers about the body itself, never ``not
valid JSON ... column N`` (what reading only the first chunk gave)."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest

from xpufleet.server.sidecar import openapi

PAD = 200_000  # bytes of padding: far more than one read of the socket
PIECES = 5
MLP = Path(__file__).resolve().parents[2] / "example_workflows" / "mlp_digits.json"


async def send_in_pieces(port: int, method: str, path: str, body: bytes, headers: dict[str, str],
                         chunked: bool = False) -> tuple[int, Any]:
    """One request over a raw socket, its body in ``PIECES`` writes with a pause after each (Content-Length,
    or ``chunked``); (status, JSON or text) of the answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        head = {"Host": f"127.0.0.1:{port}", "Connection": "close", **headers}
        head["Transfer-Encoding" if chunked else "Content-Length"] = "chunked" if chunked else str(len(body))
        writer.write(f"{method} {path} HTTP/1.1\r\n".encode()
                     + "".join(f"{k}: {v}\r\n" for k, v in head.items()).encode() + b"\r\n")
        step = -(-len(body) // PIECES)
        for i in range(0, len(body), step):
            piece = body[i:i + step]
            writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n" if chunked else piece)
            await writer.drain()
            await asyncio.sleep(0.05)  # the server reads what has arrived meanwhile: a partial body
        if chunked:
            writer.write(b"0\r\n\r\n")
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), 120)
    finally:
        writer.close()
    head, _, payload = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if b"transfer-encoding: chunked" in head.lower():
        payload = _unchunk(payload)
    try:
        return status, json.loads(payload)
    except ValueError:
        return status, payload.decode(errors="replace")


def _unchunk(data: bytes) -> bytes:
    out = b""
    while data:
        size, _, rest = data.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            break
        out, data = out + rest[:n], rest[n + 2:]
    return out


def padded(body: dict[str, Any]) -> bytes:
    """``body`` with a large field last: a body cut anywhere is not JSON at all."""
    return json.dumps({**body, "zz_pad": "x" * PAD}).encode()


def not_a_cut_body(status: int, answer: Any) -> None:
    text = json.dumps(answer)
    assert not re.search(r"not valid JSON|column \d+|Unterminated", text), (status, text[:300])
    assert status != 413, text[:300]


def _concrete(path: str) -> str:
    return re.sub(r"\{([^}]+)\}", lambda m: {"device": "cpu"}.get(m.group(1), "nosuch"), path)


async def test_every_sidecar_body_route_reads_a_body_sent_in_pieces(sidecar_client):
    client, config = await sidecar_client()
    routes = openapi.bodies(client.server.app)
    assert len(routes) >= 25
    checked = 0
    for (method, path), spec in sorted(routes.items()):
        for chunked in (False, True):
            status, answer = await send_in_pieces(client.port, method.upper(), _concrete(path), padded({}),
                                                  {"Authorization": f"Bearer {config.token}",
                                                   "Content-Type": "application/json"}, chunked)
            not_a_cut_body(status, answer)
            if spec.model is not None and not spec.passed_on or spec.model is None:
                assert status == 400 and "zz_pad" in answer["error"], (method, path, status, answer)
            checked += 1
    assert checked == 2 * len(routes)


async def test_a_sidecar_route_takes_a_large_body_sent_in_pieces(sidecar_client):
    """A real success, not only a refusal: a run whose graph is the 16 KB mlp_digits template plus padding
    in its name's place is validated whole (the answer names the graph's problem or queues it)."""
    client, config = await sidecar_client()
    graph = json.loads(MLP.read_text())
    body = json.dumps({"graph": graph, "options": {"name": "n" * 100}}).encode() + b" " * PAD
    status, answer = await send_in_pieces(client.port, "POST", "/api/estimates", body,
                                          {"Authorization": f"Bearer {config.token}",
                                           "Content-Type": "application/json"})
    not_a_cut_body(status, answer)
    assert status in (200, 400), answer  # the template's verdict on this CPU-only sidecar, read whole


PAGE = {"X-XPUFleet-Request": "1", "X-XPUFleet-Pairing": "xfp_test", "Content-Type": "application/json"}


@pytest.fixture
async def comfy(comfy_host, xpufleet_home, aiohttp_client):
    instance, load = comfy_host
    load()
    return await aiohttp_client(instance.make_app())


async def test_comfyuis_body_routes_read_a_body_sent_in_pieces(comfy, xpufleet_home):
    """The predictor (a 200: the whole UI workflow predicted), the canvas name and the sidecar start (their
    own small caps: a 413 naming the cap, not a JSON error), and the proxy (the whole body forwarded)."""
    wf = json.loads(MLP.read_text())
    wf["extra"] = {**wf.get("extra", {}), "zz_pad": "x" * PAD}
    for chunked in (False, True):
        status, answer = await send_in_pieces(comfy.port, "POST", "/xpufleet/predict",
                                              json.dumps({"workflow": wf}).encode(), PAGE, chunked)
        not_a_cut_body(status, answer)
        assert status == 200 and "p_success" in answer, answer
        for path, cap in (("/xpufleet/canvas/name", 4096), ("/xpufleet/sidecar/start", 65536)):
            status, answer = await send_in_pieces(comfy.port, "POST", path, padded({}), PAGE, chunked)
            assert status == 413 and f"{cap} bytes this route accepts" in answer["error"], (path, answer)
        # under their caps, in pieces: read whole (trailing blanks are JSON's whitespace)
        name = json.dumps({"prompt_id": "p-1", "name": "in pieces"}).encode() + b" " * 4000
        status, answer = await send_in_pieces(comfy.port, "POST", "/xpufleet/canvas/name", name, PAGE, chunked)
        assert status == 200 and answer == {"prompt_id": "p-1", "name": "in pieces"}, answer
        start = json.dumps({"port": "x"}).encode() + b" " * 60000
        status, answer = await send_in_pieces(comfy.port, "POST", "/xpufleet/sidecar/start", start, PAGE, chunked)
        assert status == 400 and "port must be an integer" in answer["error"], answer


async def test_the_proxy_forwards_a_body_sent_in_pieces_whole(comfy, xpufleet_home, aiohttp_client):
    import os

    from aiohttp import web

    from xpufleet.common.runtime_file import write_runtime

    seen: list[bytes] = []

    async def runs(request: web.Request) -> web.Response:
        seen.append(await request.read())
        return web.json_response({"ok": True}, status=201)

    fake = web.Application()
    fake.router.add_post("/api/runs", runs)
    sidecar = await aiohttp_client(fake)
    write_runtime(xpufleet_home, {"url": str(sidecar.make_url("")).rstrip("/"), "pid": os.getpid(),
                                  "token": "xfs_t", "version": "test"})
    body = padded({"graph": {}})
    for chunked in (False, True):
        status, answer = await send_in_pieces(comfy.port, "POST", "/xpufleet/api/runs", body, PAGE, chunked)
        assert status == 201, answer
        assert seen[-1] == body
