"""The sidecar's application (docs/sidecar.md) and its serving loop.

:func:`create_app` builds the aiohttp application: the security middleware (auth.py), JSON errors
(http.py), the route modules (routes/: status, runs, run files, workers, pools, outputs, estimates,
services, sweeps, studies, ui; the predictor's own routes),
the OpenAPI document, and start/stop through ``cleanup_ctx``. The shared objects are found under the
app keys of keys.py.

:func:`serve` runs it in the foreground (``xpufleet start --foreground``): one sidecar per
``XPUFLEET_HOME`` (a lock file), the runtime file written once it listens, SIGTERM/SIGINT stop it
gracefully (started runs are asked to stop and end ``interrupted``; queued runs stay queued).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import ssl
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from aiohttp import web

from ...common import tls
from ...common.http import errors_middleware
from ...common.runtime_file import ensure_home, remove_runtime, url_for, write_runtime
from ...constants import (
    AGENT_SOCKET_NAME,
    ENV_RUN_QUEUE_MAX_CONCURRENT,
    MAX_REQUEST_LINE_BYTES,
    SIDECAR_GIL_SWITCH_INTERVAL_S,
    SIDECAR_LOCK_NAME,
    STATE_DB_NAME,
    VERSION,
)
from ..run.warm import warm_up
from ..scheduling import parse_limits
from ..ssh.manager import SshWorkers
from ..workers import protocol
from ..workers.pools import PoolDirectory
from ..workers.registry import WorkerRegistry
from ..workers.state import ServerLinks
from ..workers.table import WorkerTable
from . import auth, openapi
from .config import SidecarConfig
from .dispatcher import Dispatcher
from .keys import CONFIG_KEY, DISPATCHER_KEY, LOCAL_PROVIDER_KEY, STARTED_KEY, STORE_KEY
from .local import LocalProvider, local_runs_refusal, probe_local_devices
from .routes import estimates as estimates_routes
from .routes import outputs as outputs_routes
from .routes import pairing as pairing_routes
from .routes import pools as pools_routes
from .routes import run_files as run_files_routes
from .routes import runs as runs_routes
from .routes import services as services_routes
from .routes import status as status_routes
from .routes import studies as studies_routes
from .routes import sweeps as sweeps_routes
from .routes import ui as ui_routes
from .routes import workers as workers_routes
from .routes.predictor import add_sidecar_routes as add_predictor_routes
from .routes.workers import REGISTRY_KEY, tunnel_target
from .store import Store

log = logging.getLogger("xpufleet.sidecar")

__all__ = ["SidecarConfig", "create_app", "serve", "run_foreground", "AlreadyRunning", "home_lock"]


# --- the app --------------------------------------------------------------------------------------------


def create_app(config: SidecarConfig) -> web.Application:
    """The sidecar application (not started). State lives under ``config.home``.

    The route modules are listed here, in one place; start-up and shutdown run through aiohttp's
    ``cleanup_ctx`` (the store opens first and closes last; the dispatcher starts after the local
    provider is registered and stops before the store closes).
    """
    ensure_home(config.home)
    policy = auth.host_policy(config.host, config.allowed_hosts)
    app = web.Application(
        client_max_size=config.max_body_bytes,
        middlewares=[errors_middleware, auth.security_middleware(config.token, policy)],
    )
    app[auth.EXEMPTIONS_KEY] = []
    overrides, warnings = parse_limits(config.limits)
    for w in warnings:
        log.warning("%s: %s", ENV_RUN_QUEUE_MAX_CONCURRENT, w)
    store = Store(config.home / STATE_DB_NAME)
    workers = WorkerTable(store)  # every worker; a card's mode decides whether it admits runs by memory
    pools = PoolDirectory(workers)  # the one-shot pools as the dispatcher resolves pool targets
    dispatcher = Dispatcher(store, config.home, overrides, validate_local_graphs=config.validate_local_graphs,
                            stop_grace_s=config.stop_grace_s, pools=pools, mode_of=workers.device_mode)
    dispatcher.memory.configure(config.local_shared, (lambda: probe_local_devices(config.home))
                                if config.local_devices is None else None, protocol.heartbeat_interval_s())
    app[STORE_KEY] = store
    app[DISPATCHER_KEY] = dispatcher
    app[CONFIG_KEY] = config
    app[REGISTRY_KEY] = _worker_registry(config, dispatcher, workers, pools)
    app[STARTED_KEY] = time.time()
    openapi.setup(app)
    for routes in (status_routes, runs_routes, run_files_routes, workers_routes, pools_routes, outputs_routes,
                   estimates_routes, services_routes, sweeps_routes,
                   studies_routes, ui_routes, pairing_routes):
        routes.setup(app)
    add_predictor_routes(app, dispatcher.card_snapshots)
    app.cleanup_ctx.append(_store_ctx)
    app.cleanup_ctx.append(_dispatcher_ctx)
    return app


def _worker_registry(config: SidecarConfig, dispatcher: Dispatcher, workers: WorkerTable,
                     pools: PoolDirectory) -> WorkerRegistry:
    """The worker registry and its SSH workers, wired once (docs/workers.md); the Slurm pools and inference
    units attach their parts in their routes' setup."""
    ssh = SshWorkers(workers, dispatcher.providers_changed, tunnel_target(config))
    links = ServerLinks(session_token=lambda: config.token, tls_fingerprint=lambda: config.tls_fingerprint)
    registry = WorkerRegistry(workers, dispatcher, links, pools, config.home, ssh, dispatcher.spread.part_holdings)
    registry.register_handler("part_finished", dispatcher.spread.on_part_finished)  # runs spread over workers
    registry.add_connection_listener(dispatcher.spread.on_connection)
    return registry


async def _store_ctx(app: web.Application) -> AsyncIterator[None]:
    yield
    app[STORE_KEY].close()


async def _dispatcher_ctx(app: web.Application) -> AsyncIterator[None]:
    config = app[CONFIG_KEY]
    dispatcher = app[DISPATCHER_KEY]
    devices = config.local_devices
    if devices is None:
        devices = await asyncio.to_thread(probe_local_devices, config.home)
    local = LocalProvider(config.home, dispatcher.events, devices, stop_grace_s=config.stop_grace_s,
                          cannot_run=local_runs_refusal(), comfyui=config.comfyui,
                          on_comfyui_change=dispatcher.providers_changed)
    local.start_comfyui()  # --comfyui: its reading, in the background
    app[LOCAL_PROVIDER_KEY] = local
    dispatcher.register_provider(local)
    warm = asyncio.create_task(warm_up())  # the warm start parent of run processes, in the background
    preload = asyncio.create_task(asyncio.to_thread(_preload_request_modules))
    await dispatcher.start()
    yield
    preload.cancel()
    warm.cancel()
    await dispatcher.shutdown()


def _preload_request_modules() -> None:
    """Import in a worker thread, at start, what requests import lazily on the event loop: the first
    large body imported numpy there (~0.4 s on a loaded machine, issue 19). The node classes and the
    validation are imported too, so the first check in a worker thread does not wait on the import lock."""
    import numpy  # noqa: F401 - jsonbody.nests_deeper_than

    from ..ledger.graph_key import default_node_classes
    from ..run import validation  # noqa: F401

    default_node_classes()


# --- serving ------------------------------------------------------------------------------------------


class AlreadyRunning(RuntimeError):
    """Another sidecar holds this XPUFLEET_HOME."""


@contextlib.contextmanager
def home_lock(home: Path):
    """One sidecar per XPUFLEET_HOME (an advisory lock held while it runs)."""
    ensure_home(home)
    fh = open(home / SIDECAR_LOCK_NAME, "a+")  # noqa: SIM115 - held for the server's lifetime
    try:
        try:
            import fcntl

            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except ImportError:  # Windows: no flock; the runtime file check in the CLI still applies
            pass
        except OSError:
            raise AlreadyRunning(f"another sidecar is running with XPUFLEET_HOME={home}") from None
        yield
    finally:
        fh.close()


async def serve(config: SidecarConfig, ready: Callable[[str], None] | None = None) -> int:
    """Run the sidecar until SIGTERM/SIGINT; ``ready(url)`` is called once it listens."""
    ssl_context = _tls_context(config)
    app = create_app(config)
    # A request line long enough for every path the API documents (an artifact path of MAX_PATH_CHARS
    # characters, percent-encoded), so its refusal is the route's JSON 400, not aiohttp's plain text.
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=5.0,
                           max_line_size=MAX_REQUEST_LINE_BYTES)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port, ssl_context=ssl_context)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise OSError(f"cannot listen on {config.host}:{config.port}: {exc.strerror or exc} "
                      f"(choose another port with --port)") from None
    gc.freeze()  # start-up objects never die: keep them out of the collector's full passes
    port = int(runner.addresses[0][1])
    await _agent_socket(runner, config)
    url = url_for(config.host, port, tls=ssl_context is not None)
    write_runtime(config.home, {"url": url, "host": config.host, "port": port, "pid": os.getpid(),
                                "token": config.token, "version": VERSION, "home": str(config.home),
                                "started_at": app[STARTED_KEY], "tls_fingerprint": config.tls_fingerprint,
                                "agent_socket": str(config.agent_socket) if config.agent_socket else None})
    log.info("XPU Fleet sidecar %s listening on %s (home %s)%s", VERSION, url, config.home,
             f"; TLS certificate {config.tls_fingerprint}" if config.tls_fingerprint else "")
    if ssl_context is None and not auth.is_loopback_host(config.host):
        log.warning("listening on %s with plain HTTP: tokens and run inputs cross the network in clear; "
                    "start with --tls (docs/workers.md)", config.host)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    if ready is not None:
        ready(url)
    try:
        await stop.wait()
        log.info("stopping: asking started runs to stop (they end interrupted)")
    finally:
        await runner.cleanup()
        remove_runtime(config.home, os.getpid())
    return 0


def _tls_context(config: SidecarConfig) -> ssl.SSLContext | None:
    """The HTTPS context of ``--tls`` (a certificate generated under XPUFLEET_HOME unless one is given);
    sets ``config.tls_fingerprint``."""
    if not config.tls:
        return None
    if config.tls_cert is not None:
        cert, key = config.tls_cert, config.tls_key or config.tls_cert
    else:
        cert, key = tls.generate_certificate(config.home / tls.TLS_DIRNAME, config.host)
    context = tls.server_context(cert, key)
    config.tls_fingerprint = tls.cert_fingerprint(cert)
    return context


async def _agent_socket(runner: web.AppRunner, config: SidecarConfig) -> None:
    """Also listen on ``$XPUFLEET_HOME/agents.sock`` (owner only): SSH workers' tunnels end there, so
    they need no TCP port and no TLS of their own (ssh encrypts)."""
    path = config.home / AGENT_SOCKET_NAME
    try:
        old_umask = os.umask(0o177)
        try:
            await web.UnixSite(runner, str(path)).start()
        finally:
            os.umask(old_umask)
        os.chmod(path, 0o600)
        config.agent_socket = path
    except (OSError, ValueError) as exc:  # e.g. a home path longer than a socket path may be
        log.warning("no agent socket at %s (%s): SSH workers tunnel to the TCP port instead", path, exc)


def run_foreground(config: SidecarConfig, ready: Callable[[str], None] | None = None) -> int:
    """``xpufleet start --foreground``: hold the home lock and serve until stopped."""
    # The heavy work of a request runs in worker threads; the loop thread then waits for the GIL at each
    # of its many switches (a health check makes ~10): a shorter interval than Python's 5 ms keeps those
    # waits short (issue 19; docs/architecture.md "The event loop").
    sys.setswitchinterval(SIDECAR_GIL_SWITCH_INTERVAL_S)
    with home_lock(config.home):
        return asyncio.run(serve(config, ready))
