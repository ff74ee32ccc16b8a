"""Messages between a worker agent and the sidecar (docs/workers.md), and their validation.

One WebSocket (``GET /api/agents/ws``) carries JSON text frames, each an object with a ``type``.
The agent dials and speaks first (``hello``); the sidecar answers ``welcome`` or ``reject`` (then
closes). After that:

agent -> sidecar
  ``hello``      {name, version, protocol, auth, node_types, devices, env, runs, capabilities, pid,
                 instance}: ``capabilities`` lists what the agent can do beyond the protocol
                 (``memory_cap``: it caps a run's allocator to its budget; an agent that does not say so
                 never gets a budgeted run); ``instance`` is random per agent process: a second agent
                 under a name that is online (a different instance) is refused while the first heartbeats
  ``heartbeat``  {devices, runs, ts} every ``HEARTBEAT_INTERVAL_S``; each run may carry ``memory``
                 {device: GiB}: what its processes use per card by NVML's per-process figures
  ``event``      {run_id, seq, event_type, payload, ts}: one event of a run's child, with the
                 child's per-run ``seq`` (1, 2, ...). Replays after a reconnect repeat seqs the
                 sidecar may already hold; it stores each seq once.
  ``outputs_data`` {request_id, ok, error, size, offset, data, eof}: the answer to ``read_outputs``
                 (``data`` base64, at most ``OUTPUTS_CHUNK_BYTES`` raw bytes per answer)
  ``refused_server`` {name, version, pinned, seen}: sent INSTEAD of hello by an agent that refused this
                 server's TLS certificate (its SHA-256 fingerprint is not the pinned one); no secret is
                 in it, the sidecar only records it under "Rejected connections" and closes
  ``instance_state`` {unit_id, rank, generation, attempt, state, pid?, port?, master_port?,
                 address?, returncode?, cause?, env?}: an inference unit instance is ``starting`` (its ports
                 picked), ``running``, ``arrived`` (at the unit's barrier) or ``exited``
  ``instances``  {instances: [{unit_id, rank, generation, attempt, state, pid, port, master_port}]}:
                 after welcome, the instances this agent runs (the sidecar takes them over)
  ``part_finished`` {run_id, part, status, error?, failed_rank?, peer_lost?}: this worker's ranks of a
                 run spread over workers have all ended (server/agent/parts.py)
sidecar -> agent
  ``start_run``  {run_id, graph, options, devices, budget_gib}: machine device names, in the order
                 the run lists them (run cuda:0 = ``devices[0]``)
                 ``spread`` (optional): the run's layout over workers, this worker holding rank 0
  ``cancel_run`` {run_id, reason}
  ``start_part`` {run_id, graph, options, devices, budget_gib, spread}: this worker's ranks of a run
                 spread over workers, ``spread.store`` naming rank 0's store (server/run/spread.py)
  ``stop_part``  {run_id, reason}: stop them
  ``ack``        {run_id, seq}: everything up to ``seq`` is stored; after ``run_finished`` is
                 acked the agent forgets the run
  ``forget_run`` {run_id, reason}: the sidecar no longer expects this run (it ended there, e.g.
                 interrupted after the resume grace): stop it if it still runs, drop its events
  ``credential`` {credential}: a reissued credential; the agent keeps it instead of the old one
  ``start_instance`` {unit_id, service, rank, size, generation, attempt, device, program, env,
                 pick_ports}: start one instance of a unit on ``device`` (a machine device name)
                 with the environment contract ``env``; ``pick_ports``: choose MASTER_PORT (rank 0)
  ``stop_instance`` {unit_id, rank, mode, grace_s}: ``kill`` now, or ``graceful`` (SIGTERM, killed
                 after ``grace_s``)
  ``reject``     {reason, removed}: mid-session with ``removed: true``, the worker was removed: the
                 agent stops
  ``read_outputs`` {request_id, run_id, file, offset, length, scope?}: bytes of a file the run recorded
                 (``record_outputs``, docs/workers.md), relative to the run's outputs folder on the worker;
                 ``scope`` ``run``: relative to the run's folder (its log, its files), ``listing``: that
                 folder's files as JSON (``file`` unused); ``outputs`` when absent

``hello`` also carries ``mounts`` ({label: folder}, docs/workers.md) and ``one_shot`` (docs/workers.md: the agent takes
one run and exits); ``auth.kind`` ``pool`` is a pool's shared credential.

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
from ...nodes.mounts import LABEL_RE as MOUNT_LABEL_RE

AUTH_KINDS = ("session", "credential", "join", "pool")
POOL_SECRET_PREFIX = "xfp"  # a pool's shared credential starts "xfp_"; the agent then says auth.kind "pool"
RESERVED_NAMES = frozenset({LOCAL_PROVIDER, "any"})  # run targets, never worker names
MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # a graph can be large; a frame beyond this is refused
READ_SCOPES = ("outputs", "run", "listing")  # read_outputs' folders (server/agent/files.py)
OUTPUTS_CHUNK_BYTES = 4 * 1024 * 1024  # raw bytes per outputs_data answer (base64 keeps it under the cap)


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
        mem = r.get("memory")
        if mem is not None and (not isinstance(mem, dict) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in mem.values())):
            raise ProtocolError(f"{msg['type']}: run {r['run_id']!r} field 'memory' must map devices to GiB")


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
    instance = _opt(msg, "instance", str, "the agent process's id (hex)")
    if instance is not None and not 1 <= len(instance) <= 64:
        raise ProtocolError("hello: 'instance' must be 1-64 characters")
    _check_runs(msg)
    mounts = _opt(msg, "mounts", dict, "an object {label: folder}")
    for label, folder in (mounts or {}).items():
        if not isinstance(folder, str) or not MOUNT_LABEL_RE.match(str(label)):
            raise ProtocolError(f"hello: mount {label!r} must be a label (2-32 letters, digits, '_', '-') "
                                f"with a folder string")
    _opt(msg, "one_shot", bool, "true for an agent that takes one run and exits")
    caps = _opt(msg, "capabilities", list, "a list of capability names")
    if caps is not None and not all(isinstance(c, str) for c in caps):
        raise ProtocolError("hello: every entry of 'capabilities' must be a string")


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


def _spread(msg: dict[str, Any], needs_store: bool = False) -> None:
    from ..run.spread import Layout, LayoutError  # (pure; the launcher's half of the same layout)

    try:
        layout = Layout.from_json(msg.get("spread"))
    except LayoutError as exc:
        raise ProtocolError(f"{msg['type']}: {exc}") from None
    if needs_store and layout.store is None:
        raise ProtocolError(f"{msg['type']}: 'spread.store' must name rank 0's store (host:port)")


def _start_run_spread(msg: dict[str, Any]) -> None:
    _start_run(msg)
    if msg.get("spread") is not None:
        _spread(msg)


def _start_part(msg: dict[str, Any]) -> None:
    _start_run({**msg, "type": "start_part"})
    _spread(msg, needs_store=True)


def _part_finished(msg: dict[str, Any]) -> None:
    _req(msg, "run_id", str, "the run id")
    _req(msg, "part", int, "the part's index in the run's spread")
    if msg.get("status") not in ("succeeded", "cancelled", "failed"):
        raise ProtocolError("part_finished: 'status' must be succeeded, cancelled or failed")
    _opt(msg, "error", str, "how the part failed")
    _opt(msg, "failed_rank", int, "the rank that failed by itself")
    _opt(msg, "peer_lost", bool, "true when its ranks only lost their peers")


def _run_ref(msg: dict[str, Any]) -> None:
    _req(msg, "run_id", str, "the run id")


def _ack(msg: dict[str, Any]) -> None:
    _req(msg, "run_id", str, "the run id")
    _req(msg, "seq", int, "the last stored seq")


def _read_outputs(msg: dict[str, Any]) -> None:
    _req(msg, "request_id", str, "the request id")
    _req(msg, "run_id", str, "the run id")
    name = _req(msg, "file", str, "a file path relative to the run's outputs folder")
    if name.startswith(("/", "\\")) or ".." in name.replace("\\", "/").split("/"):
        raise ProtocolError("read_outputs: 'file' must be relative to the outputs folder, without '..'")
    if _req(msg, "offset", int, "a byte offset") < 0:
        raise ProtocolError("read_outputs: 'offset' must be 0 or more")
    length = _req(msg, "length", int, "a number of bytes")
    if not 0 < length <= OUTPUTS_CHUNK_BYTES:
        raise ProtocolError(f"read_outputs: 'length' must be 1..{OUTPUTS_CHUNK_BYTES}")
    scope = _opt(msg, "scope", str, "outputs, run or listing")
    if scope is not None and scope not in READ_SCOPES:
        raise ProtocolError(f"read_outputs: 'scope' must be one of {', '.join(READ_SCOPES)}, got {scope!r}")


def _outputs_data(msg: dict[str, Any]) -> None:
    _req(msg, "request_id", str, "the request id")
    ok = _req(msg, "ok", bool, "whether the file was read")
    if not ok:
        _req(msg, "error", str, "why it was not read")
        _opt(msg, "status", int, "an HTTP status for the error (404, 409)")
        return
    _req(msg, "size", int, "the file's size in bytes")
    _req(msg, "offset", int, "the offset of this chunk")
    _req(msg, "data", str, "the chunk, base64")
    _req(msg, "eof", bool, "true when this chunk reaches the end of the file")


def _refused_server(msg: dict[str, Any]) -> None:
    name = _req(msg, "name", str, "the worker's name")
    if not WORKER_NAME_RE.match(name):
        raise ProtocolError("refused_server: 'name' is not a worker name")
    _req(msg, "version", str, "the agent's version string")
    for key in ("pinned", "seen"):
        value = _req(msg, key, str, "a certificate fingerprint")
        if len(value) > 200:
            raise ProtocolError(f"refused_server: {key!r} is too long for a fingerprint")


INSTANCE_STATES = ("starting", "running", "arrived", "exited")
STOP_MODES = ("kill", "graceful")


def _instance_ref(msg: dict[str, Any]) -> None:
    _req(msg, "unit_id", str, "the unit's id")
    if _req(msg, "rank", int, "the instance's rank") < 0:
        raise ProtocolError(f"{msg['type']}: 'rank' must be >= 0")


def _instance_entry(msg: dict[str, Any]) -> None:
    _instance_ref(msg)
    _req(msg, "generation", int, "the unit's generation")
    _req(msg, "attempt", int, "the instance's attempt within the generation")
    for key in ("pid", "port", "master_port", "returncode"):
        _opt(msg, key, int, "an integer")
    if msg.get("state") not in INSTANCE_STATES:
        raise ProtocolError(f"{msg['type']}: 'state' must be one of {', '.join(INSTANCE_STATES)}")


def _instance_state(msg: dict[str, Any]) -> None:
    _instance_entry(msg)
    _opt(msg, "cause", str, "how the instance ended")
    _opt(msg, "address", str, "the address the instance listens on")
    env = _opt(msg, "env", dict, "the environment the instance saw")
    if env is not None and not all(isinstance(v, str) for v in env.values()):
        raise ProtocolError("instance_state: every value of 'env' must be a string")


def _instances(msg: dict[str, Any]) -> None:
    for entry in _req(msg, "instances", list, "a list of the instances the agent runs"):
        if not isinstance(entry, dict):
            raise ProtocolError("instances: each entry must be an object")
        _instance_entry({"type": "instances", **entry})


def _start_instance(msg: dict[str, Any]) -> None:
    _instance_ref(msg)
    _req(msg, "service", str, "the service's name")
    if _req(msg, "size", int, "the unit's size") < 1:
        raise ProtocolError("start_instance: 'size' must be >= 1")
    _req(msg, "generation", int, "the unit's generation")
    _req(msg, "attempt", int, "the instance's attempt within the generation")
    _req(msg, "device", str, "the machine device name of the instance's card")
    program = _req(msg, "program", dict, "the instance program ({model} or {command})")
    if ("model" in program) == ("command" in program):
        raise ProtocolError("start_instance: 'program' must hold exactly one of 'model' and 'command'")
    env = _req(msg, "env", dict, "the environment contract")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ProtocolError("start_instance: 'env' must map names to strings")
    _req(msg, "pick_ports", bool, "true when the agent chooses MASTER_PORT")


def _stop_instance(msg: dict[str, Any]) -> None:
    _instance_ref(msg)
    if msg.get("mode") not in STOP_MODES:
        raise ProtocolError(f"stop_instance: 'mode' must be one of {', '.join(STOP_MODES)}")
    _opt(msg, "grace_s", (int, float), "seconds before a graceful stop kills")


_VALIDATORS = {
    "hello": _hello,
    "heartbeat": _heartbeat,
    "event": _event,
    "welcome": _welcome,
    "reject": _reject,
    "start_run": _start_run_spread,
    "cancel_run": _run_ref,
    "start_part": _start_part,
    "stop_part": _run_ref,
    "part_finished": _part_finished,
    "forget_run": _run_ref,
    "ack": _ack,
    "credential": _credential,
    "read_outputs": _read_outputs,
    "outputs_data": _outputs_data,
    "refused_server": _refused_server,
    "instance_state": _instance_state,
    "instances": _instances,
    "start_instance": _start_instance,
    "stop_instance": _stop_instance,
}
AGENT_TO_SIDECAR = frozenset({"hello", "heartbeat", "event", "outputs_data", "refused_server", "instance_state",
                              "instances", "part_finished"})
SIDECAR_TO_AGENT = frozenset({"welcome", "reject", "start_run", "cancel_run", "forget_run", "ack", "credential",
                              "read_outputs", "start_instance", "stop_instance", "start_part", "stop_part"})


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
