"""XPU Fleet: ComfyUI custom-node entry point.

ComfyUI imports this package from ``custom_nodes/``; it must never raise. Node classes import torch
lazily inside their functions, so loading the plugin costs ComfyUI almost nothing. Routes under
``/xpufleet/`` are registered on ComfyUI's server when it is there (see ``server/comfy/routes.py``).
"""

from __future__ import annotations

import logging

log = logging.getLogger("xpufleet")

NODE_CLASS_MAPPINGS: dict[str, type] = {}
NODE_DISPLAY_NAME_MAPPINGS: dict[str, str] = {}
WEB_DIRECTORY = "./web"
__version__ = "unknown"


def _load() -> None:
    global __version__
    from .constants import VERSION

    __version__ = VERSION
    try:
        from .nodes import NODE_CLASS_MAPPINGS as _NODES
        from .nodes import NODE_DISPLAY_NAME_MAPPINGS as _NAMES

        NODE_CLASS_MAPPINGS.update(_NODES)
        NODE_DISPLAY_NAME_MAPPINGS.update(_NAMES)
    except Exception as exc:  # a broken optional dependency must not take ComfyUI down
        log.error("xpufleet: nodes disabled: %s", exc)
    try:
        from .server.comfy.routes import register as _register_routes

        _register_routes()
    except Exception as exc:
        log.error("xpufleet: ComfyUI routes disabled: %s", exc)


# Imported as a package (ComfyUI's custom_nodes, pip) it registers everything. Imported as a bare file
# it has no package to import from and registers nothing. That happens to pytest's rootdir package
# when the checkout's folder name is not an identifier, e.g. `xpu-fleet`.
if __package__:
    _load()

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS", "WEB_DIRECTORY", "__version__"]
