"""One HTTP toolkit for every sidecar route: JSON errors, body reading, query parameters.

Every error any route (ours, aiohttp's 404/405/413, an unexpected exception) answers is
``{"error": message}`` with a 4xx/5xx status (docs/sidecar.md): :class:`ApiError` is how a handler says so,
:func:`errors_middleware` turns everything else into that shape, never a traceback.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from aiohttp import web

from ..constants import OFF_LOOP_BODY_BYTES
from .errors import ApiError
from .jsonbody import decode_body

log = logging.getLogger("xpufleet.sidecar")


def json_error(status: int, message: str, extra: dict[str, Any] | None = None,
               headers: dict[str, str] | None = None) -> web.Response:
    """The one error answer: ``{"error": message, ...extra}``."""
    return web.json_response({"error": message, **(extra or {})}, status=status, headers=headers)


@web.middleware
async def errors_middleware(request: web.Request, handler: Callable[..., Any]) -> web.StreamResponse:
    """Every error is ``{"error": message}``: ours, aiohttp's (404, 405, 413) and unexpected ones."""
    try:
        return await handler(request)
    except ApiError as exc:
        return json_error(exc.status, exc.message, exc.extra)
    except web.HTTPRequestEntityTooLarge:
        cap = request.client_max_size
        return json_error(413, f"the request body is larger than the {cap} bytes ({cap / 2**20:g} MiB) this server accepts")
    except web.HTTPException as exc:
        if exc.status >= 400:
            text = exc.reason
            if exc.status == 404:
                text = f"no route {request.method} {request.path}: see GET /api/openapi.json"
            elif exc.status == 405:
                text = f"method {request.method} is not allowed on {request.path}"
            return json_error(exc.status, text)
        raise
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception as exc:  # noqa: BLE001 - never a traceback (nor a server path) to the client
        log.exception("unhandled error on %s %s", request.method, request.path)
        return json_error(500, f"internal error ({type(exc).__name__}); the sidecar log has the details")


NO_BODY = object()


async def read_body(request: web.Request, max_bytes: int | None = None) -> bytes:
    """The whole request body, read until its end however many writes it came in; ApiError 413 as soon
    as it passes ``max_bytes`` (None: the server's ``client_max_size``), never reading further.

    ``request.content.read(n)`` returns only the bytes that have arrived (the first chunk of a body sent
    in several writes), so every body is read here: the sidecar's routes, ComfyUI's and the proxy."""
    cap = request.client_max_size if max_bytes is None else max_bytes
    too_big = ApiError(413, f"the request body is larger than the {cap} bytes"
                            f"{f' ({cap / 2**20:g} MiB)' if cap >= 2**20 else ''} this route accepts")
    if request.content_length is not None and request.content_length > cap:
        raise too_big
    parts: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_any():  # until EOF (chunked or Content-Length)
        size += len(chunk)
        if size > cap:
            raise too_big
        parts.append(chunk)
    return b"".join(parts)


async def read_json(request: web.Request, *, optional: bool = False, max_bytes: int | None = None) -> Any:
    """The request body as JSON; 400 naming what is wrong, 413 when over the cap.

    ``max_bytes`` caps the body where no ``client_max_size`` does (routes on ComfyUI's server); the body
    is read whole (:func:`read_body`).
    With ``optional``, an empty body gives ``NO_BODY`` (JSON ``null`` is a body, and not an object).
    Nesting deeper than ``MAX_JSON_DEPTH``, lone surrogates and over-long integers are 400s
    (jsonbody.py), so nothing after this can hit RecursionError or UnicodeEncodeError."""
    body = await read_body(request, max_bytes)
    if not body.strip():
        if optional and not body:  # no body at all; whitespace alone is not JSON (the fuzz suite sends it)
            return NO_BODY
        raise ApiError(400, "the body is empty: send a JSON object")
    if len(body) > OFF_LOOP_BODY_BYTES:  # a large body is parsed off the event loop
        return await asyncio.to_thread(decode_body, body)
    return decode_body(body)


def json_errors(handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) \
        -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """For routes served where ``errors_middleware`` is not installed (ComfyUI's server): an
    :class:`ApiError` raised by the handler becomes the same ``{"error": ...}`` answer."""

    @functools.wraps(handler)
    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except ApiError as exc:
            return json_error(exc.status, exc.message, exc.extra)

    return wrapped


INT_PARAM_MAX = 2**63 - 1  # SQLite's INTEGER and a file offset: a larger value is a 400, not a 500


def int_param(request: web.Request, name: str, default: int, lo: int, hi: int | None = None) -> int:
    """The integer query parameter ``name`` in ``[lo, hi]`` (``hi`` None: up to 2^63-1); 400 otherwise."""
    raw = request.query.get(name)
    if raw is None:  # absent; an empty value (`?limit=`) is refused like any other non-integer
        return default
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or value < lo or value > (INT_PARAM_MAX if hi is None else hi):
        rng = f"between {lo} and {hi}" if hi is not None else f">= {lo} (at most 2^63-1)"
        raise ApiError(400, f"{name}: must be an integer {rng}, got {raw!r}")
    return value


def float_param(request: web.Request, name: str, default: float, lo: float, hi: float) -> float:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not lo <= value <= hi:
        raise ApiError(400, f"{name}: must be a number between {lo:g} and {hi:g}, got {raw!r}")
    return value




async def read_object(request: web.Request, allowed: Iterable[str] | None = None, *,
                      optional: bool = False, max_bytes: int | None = None) -> dict[str, Any]:
    """The body as a JSON object whose keys are all in ``allowed`` (None: any); 400 otherwise.

    With ``optional``, an empty body is ``{}``."""
    body = await read_json(request, optional=optional, max_bytes=max_bytes)
    if body is NO_BODY:
        return {}
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object")
    if allowed is not None:
        allowed = set(allowed)
        unknown = sorted(set(body) - allowed)
        if unknown:
            raise ApiError(400, f"unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(allowed)) or 'none'}")
    return body
