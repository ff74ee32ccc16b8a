"""Stand-in for ComfyUI's server.py: PromptServer with a route table and send_sync."""

from __future__ import annotations

from aiohttp import web


class PromptServer:
    instance: PromptServer | None = None

    def __init__(self) -> None:
        PromptServer.instance = self
        self.routes = web.RouteTableDef()
        self.sent: list[tuple[str, dict, str | None]] = []
        self.app = web.Application()

    def send_sync(self, event: str, data: dict, sid: str | None = None) -> None:
        self.sent.append((event, data, sid))

    def make_app(self) -> web.Application:
        """The aiohttp app ComfyUI would build, with every registered route, served (as ComfyUI 0.3.64
        does) both at its path and under ``/api``; like ComfyUI's ``add_routes``, on the app made in
        ``__init__`` (the plugin hooks its cleanup there)."""
        app = self.app
        api_routes = web.RouteTableDef()
        for route in self.routes:
            if isinstance(route, web.RouteDef):
                api_routes.route(route.method, "/api" + route.path)(route.handler, **route.kwargs)
        app.add_routes(api_routes)
        app.add_routes(self.routes)
        return app
