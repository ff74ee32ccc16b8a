"""The application keys of the sidecar's aiohttp app: one place, typed, so route modules and the
parts that plug in (workers, predictor) find the shared objects without importing ``app.py``."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from .config import SidecarConfig
from .dispatcher import Dispatcher
from .store import Store

DISPATCHER_KEY = web.AppKey("xpufleet_dispatcher", Dispatcher)
STORE_KEY = web.AppKey("xpufleet_store", Store)
CONFIG_KEY = web.AppKey("xpufleet_config", SidecarConfig)
LOCAL_PROVIDER_KEY = web.AppKey("xpufleet_local_provider", Any)
STARTED_KEY = web.AppKey("xpufleet_started_at", float)
