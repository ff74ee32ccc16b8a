"""The typed contracts of the sidecar's HTTP API (docs/sidecar.md "The API's models").

One pydantic v2 model per request body (and the main answers): the routes validate with them, and
``GET /api/openapi.json`` and the field tables of docs/sidecar.md are generated from them, so the API is
written once. This package sits below ``sidecar/`` and imports only the pure parts (``constants``,
``devices/``, ``scheduling/``).
"""
