"""The HTTP toolkit (common/http.py) on every route that reads a body: the sidecar's run and
predictor routes and the predictor's ComfyUI routes. The probe's bodies get 400s that say what to fix,
never a 500, and no answer shows a server path (aiohttp's test server, in this process)."""

from __future__ import annotations

import json

from aiohttp import web

from xpufleet.common.http import errors_middleware
from xpufleet.server.comfy.predictor_routes import add_comfy_routes

DEEP = '{"graph":{"1":{"class_type":"XPULoss","inputs":{"name":' + "[" * 1000 + "]" * 1000 + "}}}}"
DEEP_WORKFLOW = '{"workflow":{"1":{"class_type":"X","inputs":{"v":' + "[" * 1000 + "]" * 1000 + "}}}}"


async def test_the_probes_bodies_get_400s_on_the_sidecar(sidecar_client):
    client, config = await sidecar_client()
    auth = {"Authorization": f"Bearer {config.token}", "Content-Type": "application/json"}

    async def post(path: str, body: str) -> tuple[int, dict]:
        resp = await client.post(path, data=body.encode(), headers=auth)
        return resp.status, await resp.json()

    for path, body in (("/api/runs", DEEP), ("/api/predict", DEEP_WORKFLOW)):
        status, answer = await post(path, body)
        assert status == 400 and "more than 64 levels deep (the limit)" in answer["error"], answer
    status, answer = await post("/api/runs", '{"graph":{"1":{"class_type":"XPULoss","inputs":{}}},'
                                             '"options":{"name":"\\ud800x"}}')
    assert status == 400 and answer["error"].startswith("options.name: holds a lone UTF-16 surrogate")
    status, answer = await post("/api/runs", '{"graph":{"1":{"class_type":"XPULoss","inputs":{"\\ud800":1}}}}')
    assert status == 400 and answer["error"].startswith("a key of graph.1.inputs")
    status, answer = await post("/api/predict", '{"workflow":{"\\udc00":{}}}')
    assert status == 400 and "lone UTF-16 surrogate" in answer["error"]
    status, answer = await post("/api/runs", json.dumps({"graph": {"1": {"class_type": "XPULoss",
                                                                         "inputs": {}}},
                                                         "options": {"name": "n" * 5000}}))
    assert status == 400 and answer["error"] == "options.name: 5000 characters; at most 200"
    status, answer = await post("/api/runs", "[" + "9" * 5000 + "]")
    assert status == 400 and "4300 digits" in answer["error"]
    listing = await (await client.get("/api/runs", headers=auth)).json()
    assert listing["total"] == 0  # nothing above was queued, nothing half written


async def test_a_long_artifact_name_is_a_400_without_a_server_path(sidecar_client, tmp_path):
    client, config = await sidecar_client(validate_local_graphs=False)
    auth = {"Authorization": f"Bearer {config.token}"}
    body = {"graph": {"1": {"class_type": "XPUEvaluate", "inputs": {}}}}  # queued; it fails when run
    resp = await client.post("/api/runs", json=body, headers=auth)
    run_id = (await resp.json())["run_id"]
    for name, status, fragment in (("a" * 5000, 400, "has 5000 characters; a path has at most 1024"),
                                   ("a" * 300, 400, "a name of 300 bytes"),
                                   ("d/" * 100 + "x", 404, "no file")):
        resp = await client.get(f"/api/runs/{run_id}/artifacts/{name}", headers=auth)
        answer = await resp.json()
        assert resp.status == status and fragment in answer["error"], answer
        assert str(tmp_path) not in answer["error"]


async def test_an_unexpected_error_is_a_500_without_its_text(aiohttp_client, tmp_path):
    async def boom(request: web.Request) -> web.Response:
        raise OSError(36, "File name too long", str(tmp_path / "secret" / "path"))

    app = web.Application(middlewares=[errors_middleware])
    app.router.add_get("/boom", boom)
    client = await aiohttp_client(app)
    resp = await client.get("/boom")
    answer = await resp.json()
    assert resp.status == 500 and answer == {"error": "internal error (OSError); the sidecar log has the details"}


async def test_the_predictors_comfyui_routes_use_the_same_toolkit(aiohttp_client):
    routes = web.RouteTableDef()
    add_comfy_routes(routes, "/xpufleet")
    app = web.Application()
    app.add_routes(routes)
    # the headers the plugin's page sends (server/comfy/guard.py)
    client = await aiohttp_client(app, headers={"Content-Type": "application/json", "X-XPUFleet-Request": "1"})
    resp = await client.post("/xpufleet/predict", data=DEEP_WORKFLOW.encode())
    assert resp.status == 400 and "more than 64 levels deep" in (await resp.json())["error"]
    resp = await client.post("/xpufleet/predict", data=b'{"workflow":{"a":"\\ud800"}}')
    assert resp.status == 400 and (await resp.json())["error"].startswith("workflow.a: holds a lone")


async def test_an_empty_query_value_is_refused_like_any_non_number(sidecar_client):
    """`?limit=` violates the documented integer type: a 400 that names it (schemathesis found it
    accepted on /api/studies); a parameter left out still takes its default."""
    client, config = await sidecar_client()
    auth = {"Authorization": f"Bearer {config.token}"}
    for path, needle in (("/api/studies?limit=&offset=0", "limit: must be an integer between 1 and"),
                         ("/api/sweeps?offset=", "offset: must be an integer >= 0"),
                         ("/api/runs?limit=", "limit: must be an integer between 1 and"),
                         ("/api/sweeps?dry_run=", "dry_run: must be true or false")):
        method = client.post if "dry_run" in path else client.get
        resp = await method(path, headers=auth, json={} if "dry_run" in path else None)
        answer = await resp.json()
        assert resp.status == 400 and needle in answer["error"], (path, answer)
    resp = await client.get("/api/studies", headers=auth)
    assert resp.status == 200 and (await resp.json())["limit"] == 50
