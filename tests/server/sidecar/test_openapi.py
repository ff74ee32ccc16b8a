"""The OpenAPI document describes every route the sidecar registers (server/sidecar/openapi.py): a route
only the fallback covers (summary "METHOD /path", an untyped body) would be fuzzed blind. Every request
body's schema is its contract model's (server/contracts/), and the docs' field tables are generated."""

from __future__ import annotations

from xpufleet.constants import CANVAS_EVENT_TYPES, RUN_SOURCES, RUN_STATUSES, TERMINAL_STATUSES
from xpufleet.server.contracts.base import component_schemas
from xpufleet.server.run.requests import parse_run_request
from xpufleet.server.sidecar import make_api_docs, openapi
from xpufleet.server.sidecar.app import SidecarConfig, create_app


def test_every_registered_route_has_its_own_description(tmp_path):
    app = create_app(SidecarConfig(home=tmp_path / "home", port=0))
    described = set(app[openapi.OPENAPI_KEY])
    doc = openapi.document(app)
    registered = {(m, p) for p, ops in doc["paths"].items() for m in ops}
    assert len(registered) >= 60
    assert sorted(registered - described) == []
    for family in ("/api/pools", "/api/services", "/api/sweeps", "/api/studies", "/api/estimates"):
        assert any(p.startswith(family) for _, p in described), family


def _app(tmp_path):
    return create_app(SidecarConfig(home=tmp_path / "home", port=0))


def test_every_body_route_takes_its_request_schema_from_its_contract_model(tmp_path):
    doc = openapi.document(_app(tmp_path))
    for (method, path), (model, required) in openapi.BODIES.items():
        op = doc["paths"][path][method]  # the route exists in the app (a KeyError names a stale entry)
        body = op["requestBody"]
        assert body["required"] is required, (method, path)
        assert body["content"]["application/json"]["schema"] == {"$ref": f"#/components/schemas/{model.__name__}"}
        assert doc["components"]["schemas"][model.__name__] == component_schemas([model])[model.__name__]


def test_no_route_has_a_hand_written_body_schema(tmp_path):
    """A body described in a route module but not by a model would drift from what the handler accepts."""
    doc = openapi.document(_app(tmp_path))
    with_body = {(m, p) for p, ops in doc["paths"].items() for m, op in ops.items() if "requestBody" in op}
    assert with_body and sorted(with_body - set(openapi.BODIES)) == []
    # ... and no route module writes one: the descriptions give summaries and answers only (the
    # predictor's routes keep theirs until they move beside the other routes; BODIES replaces it)
    app = _app(tmp_path)
    written = sorted(key for key, op in app[openapi.OPENAPI_KEY].items() if "requestBody" in op)
    assert written in ([], [("post", "/api/predict")]), written


def test_enums_come_from_the_constants(tmp_path):
    schemas = openapi.document(_app(tmp_path))["components"]["schemas"]
    assert tuple(schemas["Run"]["properties"]["status"]["enum"]) == RUN_STATUSES
    assert tuple(schemas["RunQueued"]["properties"]["status"]["enum"]) == RUN_STATUSES
    assert tuple(schemas["Run"]["properties"]["source"]["enum"]) == RUN_SOURCES
    assert set(schemas["CanvasFinished"]["properties"]["status"]["enum"]) == TERMINAL_STATUSES
    assert tuple(schemas["CanvasEvent"]["properties"]["type"]["enum"]) == CANVAS_EVENT_TYPES


def test_the_documented_example_is_accepted_by_the_model_that_documents_it():
    example = openapi.SCHEMAS["RunSubmit"]["example"]
    assert parse_run_request(example).name == "iris"


def test_the_docs_field_tables_are_up_to_date():
    assert make_api_docs.main(["--check"]) == 0, "run python -m xpufleet.server.sidecar.make_api_docs"
    section = make_api_docs.section()
    for (method, path), (model, _) in openapi.BODIES.items():
        assert f"| `{method.upper()} {path}` | {model.__name__} |" in section
        for field in model.model_fields:
            assert f"| `{field}` |" in section, (model.__name__, field)
