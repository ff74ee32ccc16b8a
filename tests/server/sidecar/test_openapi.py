"""The OpenAPI document describes every route the sidecar registers (server/sidecar/openapi.py): a route
only the fallback covers (summary "METHOD /path") would be fuzzed blind. Every request body's schema is the
contract model its handler declares and validates with (routes/common.py ``body``), and the docs' field
tables are generated from the same declarations."""

from __future__ import annotations

import re

import pytest

from xpufleet.constants import CANVAS_EVENT_TYPES, RUN_SOURCES, RUN_STATUSES, TERMINAL_STATUSES
from xpufleet.server.contracts.base import component_schemas
from xpufleet.server.run.requests import parse_run_request
from xpufleet.server.sidecar import make_api_docs, openapi
from xpufleet.server.sidecar.app import SidecarConfig, create_app


def _app(tmp_path):
    return create_app(SidecarConfig(home=tmp_path / "home", port=0))


def test_every_registered_route_has_its_own_description(tmp_path):
    app = _app(tmp_path)
    described = set(app[openapi.OPENAPI_KEY])
    doc = openapi.document(app)
    registered = {(m, p) for p, ops in doc["paths"].items() for m in ops}
    assert len(registered) >= 60
    assert sorted(registered - described) == []
    for family in ("/api/pools", "/api/services", "/api/sweeps", "/api/studies", "/api/estimates"):
        assert any(p.startswith(family) for _, p in described), family


def test_every_post_and_put_route_declares_its_body_or_that_it_takes_none(tmp_path):
    """A route that takes a body declares its model; one that takes none says so (``no_body``): no POST
    or PUT reads a body the document does not describe."""
    app = _app(tmp_path)
    declared = openapi.bodies(app)
    doc = openapi.document(app)
    writes = {(m, p) for p, ops in doc["paths"].items() for m in ops if m in ("post", "put", "patch")}
    assert sorted(writes - set(declared)) == []
    no_body = {key for key, spec in declared.items() if spec.model is None}
    assert ("post", "/api/workers/{name}/drain") in no_body and ("post", "/api/ui/login-links") in no_body
    for key in no_body:
        assert "requestBody" not in doc["paths"][key[1]][key[0]], key


def test_every_body_route_takes_its_request_schema_from_its_declared_model(tmp_path):
    app = _app(tmp_path)
    doc = openapi.document(app)
    with_model = {key: spec for key, spec in openapi.bodies(app).items() if spec.model is not None}
    assert len(with_model) >= 19
    for (method, path), spec in with_model.items():
        body = doc["paths"][path][method]["requestBody"]
        assert body["required"] is spec.required, (method, path)
        name = spec.model.__name__
        assert body["content"]["application/json"]["schema"] == {"$ref": f"#/components/schemas/{name}"}
        assert doc["components"]["schemas"][name] == component_schemas([spec.model])[name]
    # no route module writes a body schema by hand: the descriptions give summaries and answers only
    written = sorted(key for key, op in app[openapi.OPENAPI_KEY].items() if "requestBody" in op)
    assert written == []
    with_body = {(m, p) for p, ops in doc["paths"].items() for m, op in ops.items() if "requestBody" in op}
    assert with_body == set(with_model)


def _concrete(path: str) -> str:
    """``path`` with each parameter filled in (ids that exist nowhere: the body is checked first)."""
    return re.sub(r"\{([^}]+)\}", lambda m: {"device": "cpu"}.get(m.group(1), "nosuch"), path)


async def test_every_route_refuses_a_body_its_model_refuses_naming_the_field(sidecar_client):
    """For EVERY route with a body model: an unknown field and a body that is not an object are 400s
    from the model, before the handler looks anything up (the ids in the path exist nowhere); the
    unknown field's answer names it."""
    client, config = await sidecar_client()
    h = {"Authorization": f"Bearer {config.token}"}
    declared = openapi.bodies(client.server.app)
    checked = []
    for (method, path), spec in declared.items():
        if spec.model is None or spec.passed_on:
            continue
        url = _concrete(path)
        resp = await client.request(method.upper(), url, json={"zz_not_a_field": 1}, headers=h)
        text = (await resp.json())["error"]
        assert resp.status == 400 and "zz_not_a_field" in text and "unknown field" in text, (method, path, text)
        resp = await client.request(method.upper(), url, json=[1, 2], headers=h)
        assert resp.status == 400, (method, path, await resp.text())
        checked.append((method, path))
    assert len(checked) >= 18


@pytest.mark.parametrize(("path", "body", "text"), [
    ("/api/sweeps", {"graph": {"1": {"class_type": "X"}}, "objective": {"metric": "m"}, "mode": "spiral"},
     "mode: must be grid or random, got 'spiral'"),
    ("/api/studies", {"graph": {"1": {"class_type": "X"}}, "objective": {"metric": "m"}, "n_trials": "5"},
     "n_trials: must be an integer between 1 and"),
    ("/api/services", {"name": "Bad_Name", "program": {}}, "name: 1-42 lowercase letters"),
    ("/api/workers/join-tokens", {"ttl_s": "soon"}, "ttl_s must be a number of seconds"),
    ("/api/canvas/runs", {"prompt_id": "", "graph": {"1": {"class_type": "X"}}, "comfy_pid": 1},
     "prompt_id: must be ComfyUI's prompt id"),
    ("/api/runs/nosuch/cancel", {"reason": 5}, "reason: must be a string of at most 500 characters"),
    ("/api/ui/session", {"login": 7}, "send {\"login\": \"<key>\"}"),
])
async def test_a_wrong_type_is_answered_with_the_fields_own_text(sidecar_client, path, body, text):
    client, config = await sidecar_client()
    resp = await client.post(path, json=body, headers={"Authorization": f"Bearer {config.token}"})
    assert resp.status == 400
    assert text in (await resp.json())["error"]


def test_enums_come_from_the_constants(tmp_path):
    schemas = openapi.document(_app(tmp_path))["components"]["schemas"]
    assert tuple(schemas["Run"]["properties"]["status"]["enum"]) == RUN_STATUSES
    assert tuple(schemas["RunQueued"]["properties"]["status"]["enum"]) == RUN_STATUSES
    assert tuple(schemas["Run"]["properties"]["source"]["enum"]) == RUN_SOURCES
    assert set(schemas["CanvasFinished"]["properties"]["status"]["enum"]) == TERMINAL_STATUSES
    assert tuple(schemas["CanvasEvent"]["properties"]["type"]["enum"]) == CANVAS_EVENT_TYPES


def test_the_documented_example_is_accepted_by_the_model_that_documents_it(tmp_path):
    example = openapi.document(_app(tmp_path))["components"]["schemas"]["RunSubmit"]["example"]
    assert parse_run_request(example).name == "iris"


def test_the_docs_field_tables_are_up_to_date(tmp_path):
    assert make_api_docs.main(["--check"]) == 0, "run python -m xpufleet.server.sidecar.make_api_docs"
    section = make_api_docs.section()
    for (method, path), spec in openapi.bodies(_app(tmp_path)).items():
        if spec.model is None:
            continue
        assert f"| `{method.upper()} {path}` | {spec.model.__name__} |" in section
        for field in spec.model.model_fields:
            assert f"| `{field}` |" in section, (spec.model.__name__, field)
