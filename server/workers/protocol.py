"""Messages between a worker agent and the sidecar (SPEC W1-W4), and their validation.

One WebSocket (``GET /api/agents/ws``) carries JSON text frames, each an object with a ``type``.
The agent dials and speaks first (``hello``); the sidecar answers ``welcome`` or ``reject`` (then
closes). After that:

agent -> sidecar
  ``heartbeat``  {devices, runs, ts} every ``HEARTBEAT_INTERVAL_S``
  ``event``      {run_id, seq, event_type, payload, ts}: one event of a run's child, with the
                 child's per-run ``seq`` (1, 2, ...). Replays after a reconnect repeat seqs the
                 sidecar may already hold; it stores each seq once.
sidecar -> agent
  ``start_run``  {run_id, graph, options, devices, budget_gib}: machine device names, in the order
                 the run lists them (run cuda:0 = ``devices[0]``)
  ``cancel_run`` {run_id, reason}
  ``ack``        {run_id, seq}: everything up to ``seq`` is stored; after ``run_finished`` is
                 acked the agent forgets the run
  ``forget_run`` {run_id, reason}: the sidecar no longer expects this run (it ended there, e.g.
                 interrupted after the resume grace): stop it if it still runs, drop its events
  ``credential`` {credential}: a reissued credential; the agent keeps it instead of the old one
  ``reject``     {reason, removed}: mid-session with ``removed: true``, the worker was removed: the
                 agent stops

Pure: no I/O. :func:`validate` raises :class:`ProtocolError` naming the field to fix.
"""

from __future__ import annotations

import json
import os
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

AUTH_KINDS = ("session", "credential", "join")
RESERVED_NAMES = frozenset({LOCAL_PROVIDER, "any"})  # run targets, never worker names
MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # a graph can be large; a frame beyond this is refused


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


# --- field checks -------------------------------------------------------------------------------

def _req(msg: dict[str, Any], key: str, types: type | tuple[type, ...], what: str) -> Any:
    if key not in msg:
        raise ProtocolError(f"{msg.get('type', 'message')}: missing field {key!r} ({what})")
    value = msg[key]
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise ProtocolError(f"{msg.get('type')}: field {key!r} must be {what}, got a boolean")
    if not isinstance(value, types):
        raise ProtocolError(f"{msg.get('type')}: field {key!r} must be {what}, got {type(value).__name__}")
    return value


def _opt(msg: dict[str, Any], key: str, types: type | tuple[type, ...], what: str) -> Any:
    if msg.get(key) is None:
        return None
    return _req(msg, key, types, what)


def _check_device(dev: Any, where: str) -> None:
    if not isinstance(dev, dict):
        raise ProtocolError(f"{where}: each device must be an object")
    name = dev.get("name")
    if not isinstance(name, str) or not name:
        raise ProtocolError(f"{where}: a device lacks its 'name' (e.g. 'cuda:0')")
    kind = dev.get("kind")
    if kind not in ("cpu", "cuda", "xpu", "mps"):
        raise ProtocolError(f"{where}: device {name!r} has kind {kind!r}; use cpu, cuda, xpu or mps")
    for key in ("total_gib", "free_gib"):
        v = dev.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise ProtocolError(f"{where}: device {name!r} field {key!r} must be a number or null")
    if dev.get("uuid") is not None and not isinstance(dev["uuid"], str):
        raise ProtocolError(f"{where}: device {name!r} field 'uuid' must be a string or null")


def _check_devices(msg: dict[str, Any]) -> None:
    devices = _req(msg, "devices", list, "a list of devices")
    names = set()
    for dev in devices:
        _check_device(dev, msg["type"])
        if dev["name"] in names:
            raise ProtocolError(f"{msg['type']}: device {dev['name']!r} is listed twice")
        names.add(dev["name"])


def _check_runs(msg: dict[str, Any]) -> None:
    runs = _opt(msg, "runs", list, "a list of {run_id, last_seq, status}")
    for r in runs or []:
        if not isinstance(r, dict) or not isinstance(r.get("run_id"), str):
            raise ProtocolError(f"{msg['type']}: each entry of 'runs' needs a string 'run_id'")
        if not isinstance(r.get("last_seq", 0), int):
            raise ProtocolError(f"{msg['type']}: run {r['run_id']!r} field 'last_seq' must be an integer")


def _hello(msg: dict[str, Any]) -> None:
    name = _req(msg, "name", str, "the worker's name")
    if not WORKER_NAME_RE.match(name):
        raise ProtocolError("hello: 'name' must be 1-64 letters, digits, '.', '_' or '-' (starting with a "
                            "letter or digit)")
    _req(msg, "version", str, "the agent's version string")
    _req(msg, "protocol", int, "the protocol number")
    auth = _req(msg, "auth", dict, "an object {kind, token}")
    if auth.get("kind") not in AUTH_KINDS:
        raise ProtocolError(f"hello: auth.kind must be one of {', '.join(AUTH_KINDS)}")
    if not isinstance(auth.get("token"), str) or not auth["token"]:
        raise ProtocolError("hello: auth.token must be a non-empty string")
    node_types = _req(msg, "node_types", list, "a list of node class names")
    if not all(isinstance(t, str) for t in node_types):
        raise ProtocolError("hello: every entry of 'node_types' must be a string")
    _check_devices(msg)
    _opt(msg, "env", dict, "an object describing the environment")
    _check_runs(msg)


def _heartbeat(msg: dict[str, Any]) -> None:
    _check_devices(msg)
    _check_runs(msg)


def _event(msg: dict[str, Any]) -> None:
    _req(msg, "run_id", str, "the run id")
    seq = _req(msg, "seq", int, "the event's per-run sequence number")
    if seq < 1:
        raise ProtocolError("event: 'seq' starts at 1")
    _req(msg, "event_type", str, "the event type (e.g. 'progress')")
    _req(msg, "payload", dict, "an object")


def _welcome(msg: dict[str, Any]) -> None:
    _req(msg, "name", str, "the worker's name")
    _req(msg, "server_version", str, "the sidecar's version")
    runs = _req(msg, "runs", dict, "an object run_id -> last stored seq")
    if not all(isinstance(v, int) for v in runs.values()):
        raise ProtocolError("welcome: every value of 'runs' must be an integer seq")
    _opt(msg, "credential", str, "the worker's new credential")
    for key in ("heartbeat_interval_s", "resume_grace_s"):  # the server's settings; the agent follows them
        value = _opt(msg, key, (int, float), "a number of seconds")
        if value is not None and value <= 0:
            raise ProtocolError(f"welcome: {key!r} must be more than 0 seconds")


def _reject(msg: dict[str, Any]) -> None:
    _req(msg, "reason", str, "why the connection is refused")
    _opt(msg, "removed", bool, "true when the worker was removed")


def _credential(msg: dict[str, Any]) -> None:
    token = _req(msg, "credential", str, "the worker's new credential")
    if not token:
        raise ProtocolError("credential: 'credential' must not be empty")


def _start_run(msg: dict[str, Any]) -> None:
    _req(msg, "run_id", str, "the run id")
    _req(msg, "graph", dict, "the run's graph (API prompt format)")
    _opt(msg, "options", dict, "the run's options")
    devices = _req(msg, "devices", list, "the machine device names of the run, in order")
    if not devices or not all(isinstance(d, str) and d for d in devices):
        raise ProtocolError("start_run: 'devices' must list at least one device name")
    budget = msg.get("budget_gib")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float))):
        raise ProtocolError("start_run: 'budget_gib' must be a number or null")


def _run_ref(msg: dict[str, Any]) -> None:
    _req(msg, "run_id", str, "the run id")


def _ack(msg: dict[str, Any]) -> None:
    _req(msg, "run_id", str, "the run id")
    _req(msg, "seq", int, "the last stored seq")


_VALIDATORS = {
    "hello": _hello,
    "heartbeat": _heartbeat,
    "event": _event,
    "welcome": _welcome,
    "reject": _reject,
    "start_run": _start_run,
    "cancel_run": _run_ref,
    "forget_run": _run_ref,
    "ack": _ack,
    "credential": _credential,
}
AGENT_TO_SIDECAR = frozenset({"hello", "heartbeat", "event"})
SIDECAR_TO_AGENT = frozenset({"welcome", "reject", "start_run", "cancel_run", "forget_run", "ack", "credential"})


def validate(msg: Any, allowed: frozenset[str] | None = None) -> dict[str, Any]:
    """Check one decoded message; return it, or raise :class:`ProtocolError`."""
    if not isinstance(msg, dict):
        raise ProtocolError("a message must be a JSON object")
    mtype = msg.get("type")
    if mtype not in _VALIDATORS or (allowed is not None and mtype not in allowed):
        expected = ", ".join(sorted(allowed if allowed is not None else _VALIDATORS))
        raise ProtocolError(f"unknown message type {mtype!r}; expected one of {expected}")
    _VALIDATORS[mtype](msg)
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
