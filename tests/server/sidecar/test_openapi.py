"""The OpenAPI document describes every route the sidecar registers (server/sidecar/openapi.py): a route
only the fallback covers (summary "METHOD /path", an untyped body) would be fuzzed blind."""

from __future__ import annotations

from xpufleet.server.sidecar import openapi
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
