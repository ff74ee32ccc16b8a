"""Messages between a worker agent and the sidecar (docs/workers.md), and their validation.

One WebSocket (``GET /api/agents/ws``) carries JSON text frames, each an object with a ``type``.
The agent dials and speaks first (``hello``); the sidecar answers ``welcome`` or ``reject`` (then
closes). Every message type and its fields: docs/workers.md, "The agent protocol" (generated from the models).

Each message type's fields are a model in ``server/contracts/agent_protocol.py`` (the field tables of
docs/workers.md are made from them); :func:`validate` raises :class:`ProtocolError` naming the field to fix.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterable, AsyncIterator, Callable
from typing import Any

from ...constants import (
    ENV_HEARTBEAT_INTERVAL_S,
    ENV_WORKER_RESUME_GRACE_S,
    HEARTBEAT_INTERVAL_S,
    HEARTBEAT_LATE_BEATS,
    LOCAL_PROVIDER,
    WORKER_NAME_RE,
    WORKER_RESUME_GRACE_S,
)
from ..contracts.agent_protocol import (  # noqa: F401 - the protocol's enums, re-exported to both sides
    AGENT_MESSAGES,
    AUTH_KINDS,
    INSTANCE_STATES,
    OUTPUTS_CHUNK_BYTES,
    READ_SCOPES,
    SIDECAR_MESSAGES,
    STOP_MODES,
    check,
    model_for,
)
from ..contracts.base import ContractError

POOL_SECRET_PREFIX = "xfp"  # a pool's shared credential starts "xfp_"; the agent then says auth.kind "pool"
RESERVED_NAMES = frozenset({LOCAL_PROVIDER, "any"})  # run targets, never worker names
MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # a graph can be large; a frame beyond this is refused
AGENT_TO_SIDECAR = frozenset(AGENT_MESSAGES)
SIDECAR_TO_AGENT = frozenset(SIDECAR_MESSAGES)
ALL_TYPES = AGENT_TO_SIDECAR | SIDECAR_TO_AGENT


class ProtocolError(ValueError):
    """A message that does not follow this protocol (the text says which field is wrong)."""


def _env_seconds(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        return default
    return value if value > 0 else default


def heartbeat_interval_s() -> float:
    """Heartbeat period: ``XPUFLEET_HEARTBEAT_INTERVAL_S`` (tests shorten it), else 10 s."""
    return _env_seconds(ENV_HEARTBEAT_INTERVAL_S, HEARTBEAT_INTERVAL_S)


def heartbeat_late_s() -> float:
    """A worker whose last heartbeat is older than this is Degraded (three missed beats)."""
    return HEARTBEAT_LATE_BEATS * heartbeat_interval_s()


def resume_grace_s() -> float:
    """How long a disconnected worker keeps running its runs: ``XPUFLEET_WORKER_RESUME_GRACE_S``."""
    return _env_seconds(ENV_WORKER_RESUME_GRACE_S, WORKER_RESUME_GRACE_S)


def worker_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a worker's name (None when it can): the text says what to use."""
    if not WORKER_NAME_RE.match(name) or name.lower() in RESERVED_NAMES:
        return (f"invalid worker name {name!r}: letters, digits, '.', '_', '-' (up to 64, starting with a "
                f"letter or digit), not 'local' or 'any'")
    return None


def _spread(mtype: str, spread: Any, needs_store: bool) -> None:
    """A layout's rules are the launcher's (one place, also for a spec's ``spread``): server/run/spread.py."""
    from ..run.spread import Layout, LayoutError

    try:
        layout = Layout.from_json(spread)
    except LayoutError as exc:
        raise ProtocolError(f"{mtype}: {exc}") from None
    if needs_store and layout.store is None:
        raise ProtocolError(f"{mtype}: 'spread.store' must name rank 0's store (host:port)")


def validate(msg: Any, allowed: frozenset[str] | None = None) -> dict[str, Any]:
    """Check one decoded message against its type's model (server/contracts/agent_protocol.py); return it
    as it is, or raise :class:`ProtocolError` naming the field to fix."""
    if not isinstance(msg, dict):
        raise ProtocolError("a message must be a JSON object")
    mtype = msg.get("type")
    if mtype not in ALL_TYPES or (allowed is not None and mtype not in allowed):
        expected = ", ".join(sorted(allowed if allowed is not None else ALL_TYPES))
        raise ProtocolError(f"unknown message type {mtype!r}; expected one of {expected}")
    try:
        check(model_for(mtype, msg), msg)
    except ContractError as exc:
        raise ProtocolError(f"{mtype}: {exc.message}") from None
    if mtype == "start_part" or (mtype == "start_run" and msg.get("spread") is not None):
        _spread(mtype, msg["spread"], needs_store=mtype == "start_part")
    return msg


def decode(text: str | bytes, allowed: frozenset[str] | None = None) -> dict[str, Any]:
    """Parse and validate one frame."""
    if len(text) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"message of {len(text)} bytes exceeds the {MAX_MESSAGE_BYTES}-byte limit")
    try:
        msg = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"a message must be JSON: {exc}") from None
    return validate(msg, allowed)


def encode(mtype: str, **fields: Any) -> str:
    """One frame: ``{"type": mtype, **fields}`` as JSON (validated, so a bug shows at the sender)."""
    msg = {"type": mtype, **fields}
    validate(msg)
    return json.dumps(msg, separators=(",", ":"))


async def messages(frames: AsyncIterable[Any], allowed: frozenset[str],
                   on_bad: Callable[[ProtocolError], None]) -> AsyncIterator[dict[str, Any]]:
    """The valid messages of a WebSocket's ``frames`` until one is not text (the peer closed): a bad one
    is given to ``on_bad(error)`` and skipped (one wrong message does not end the session)."""
    import aiohttp

    async for frame in frames:
        if frame.type != aiohttp.WSMsgType.TEXT:
            return
        try:
            msg = decode(frame.data, allowed)
        except ProtocolError as exc:
            on_bad(exc)
            continue
        yield msg
