"""Thin ComfyUI glue: registers the plugin's ``/xpufleet/...`` routes on ComfyUI's PromptServer, each
behind the one guard (guard.py: Host, Origin, preflight, pairing; docs/security.md).

Does nothing when ComfyUI's ``server`` module is not importable (plain Python, tests, the sidecar).
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger("xpufleet")

ROUTE_PREFIX = "/xpufleet"


def _prompt_server():
    try:
        import server as comfy_server  # type: ignore[import-not-found]  # ComfyUI's server.py
    except Exception:
        return None
    ps = getattr(comfy_server, "PromptServer", None)
    return getattr(ps, "instance", None) if ps is not None else None


def register() -> bool:
    """Add the plugin's routes to ComfyUI's route table; False when not hosted."""
    instance = _prompt_server()
    if instance is None:
        return False
    routes = instance.routes
    from aiohttp import web

    from ...constants import VERSION
    from .guard import Access, add_route
    from .proxy import add_proxy_routes

    page_text = Access(paired=False, why="the plugin's version and the page's texts: the same for everyone, "
                                         "in the plugin's public source")

    async def version(request: web.Request) -> web.Response:
        return web.json_response({"name": "xpufleet", "version": VERSION})

    locales = Path(__file__).resolve().parents[2] / "locales"

    async def locale(request: web.Request) -> web.StreamResponse:
        # the texts of the front end (web/lib/i18n.mjs), the same file ComfyUI merges into its own i18n
        lang = request.match_info["lang"]
        path = locales / lang / "main.json"
        if not lang.isalpha() or not path.is_file():
            return web.json_response({"error": f"no texts for language {lang!r}"}, status=404)
        return web.FileResponse(path, headers={"Content-Type": "application/json", "Cache-Control": "no-cache"})

    add_route(routes, "GET", f"{ROUTE_PREFIX}/version", version, page_text)
    add_route(routes, "GET", f"{ROUTE_PREFIX}/locales/{{lang}}/main.json", locale, page_text)

    # Predictor routes (snapshot of the ComfyUI process itself, predict) are added here too.
    from .predictor_routes import add_comfy_routes

    add_comfy_routes(routes, ROUTE_PREFIX)
    proxy = add_proxy_routes(routes, ROUTE_PREFIX)  # the sidecar, same origin (proxy.py)
    app = getattr(instance, "app", None)  # ComfyUI builds its app before it loads custom nodes
    if app is not None and not app.frozen:
        app.on_cleanup.append(proxy.close)

    # a canvas Run is also recorded on the sidecar, when one runs (canvas_runs.py)
    from .canvas_runs import add_canvas_routes

    add_canvas_routes(routes, ROUTE_PREFIX, instance)
    # a ComfyUI run's files, copied into this ComfyUI's output folder (home.py)
    from .home import add_home_routes

    add_home_routes(routes, ROUTE_PREFIX)
    return True
