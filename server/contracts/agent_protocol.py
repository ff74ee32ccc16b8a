"""The agent protocol's messages as typed models (docs/workers.md, "The agent protocol"): one model per
message type, the one source of what each message carries, of its validation (``server/workers/protocol.py``)
and of the field table in the docs (``python -m xpufleet.server.sidecar.make_protocol_docs``).

The models only validate: a message travels and is read as the JSON object it is, so the wire format is the
dicts both sides have always sent. Unknown fields are ignored (not refused, unlike an HTTP body), as they
always were, so a newer peer may add one.

The refusal texts are the protocol's (tests assert them): a field's ``description`` says what it holds and
gives the plain texts (``missing field 'seq' (the event's per-run sequence number)``, ``field 'seq' must be
..., got a boolean``); a model's ``TEXTS`` give a field's own text for a broken rule (a range, a pattern, an
entry of a list), formatted with the object's fields, ``field`` and ``at`` (the list index or mapping key).
A message's type is put before the text by ``protocol.validate``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal, get_args

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from ...constants import DEVICE_KINDS, WORKER_NAME_RE
from ...nodes.mounts import LABEL_RE as MOUNT_LABEL_RE
from .base import Contract, ContractError

AUTH_KINDS = ("session", "credential", "join", "pool")
READ_SCOPES = ("outputs", "run", "listing")  # read_outputs' folders (server/agent/files.py)
OUTPUTS_CHUNK_BYTES = 4 * 1024 * 1024  # raw bytes per outputs_data answer (base64 keeps it under the frame cap)
INSTANCE_STATES = ("starting", "running", "arrived", "exited")
STOP_MODES = ("kill", "graceful")
PART_STATUSES = ("succeeded", "cancelled", "failed")
FINGERPRINT_CHARS = 200
# A certificate fingerprint as agents send it (common/tls.py's spelling): hex pairs only, so nothing a peer
# writes there can read as words or a URL where the Workers panel quotes it.
FINGERPRINT_RE = r"^sha256:(?:[0-9A-F]{2}:){31}[0-9A-F]{2}$"


class Shape(Contract):
    """An object of the protocol: validated in strict mode, unknown fields ignored, its refusal texts.

    ``TEXTS``: a field's text for a broken rule; ``ALWAYS``: the fields whose text also answers a missing
    field or a wrong type (else those get the plain texts made from the field's description);
    ``NOT_OBJECT``: the text when the value is not an object at all (an entry of a list)."""

    model_config = ConfigDict(extra="ignore")
    TEXTS: ClassVar[dict[str, str]] = {}
    ALWAYS: ClassVar[frozenset[str]] = frozenset()
    NOT_OBJECT: ClassVar[str] = "must be an object"


def _unique_names(devices: list[Device]) -> list[Device]:
    seen: set[str] = set()
    for dev in devices:
        if dev.name in seen:
            raise ContractError(f"device {dev.name!r} is listed twice")
        seen.add(dev.name)
    return devices


def _relative(name: str) -> str:
    if name.startswith(("/", "\\")) or ".." in name.replace("\\", "/").split("/"):
        raise ContractError("'file' must be relative to the outputs folder, without '..'")
    return name


def _one_program(program: dict[str, Any]) -> dict[str, Any]:
    if ("model" in program) == ("command" in program):
        raise ContractError("'program' must hold exactly one of 'model' and 'command'")
    return program


def _labels(mounts: dict[str, str]) -> dict[str, str]:
    for label in mounts:
        if not MOUNT_LABEL_RE.match(label):
            raise ContractError(_MOUNT_TEXT.format(at=label))
    return mounts


_MOUNT_TEXT = "mount {at!r} must be a label (2-32 letters, digits, '_', '-') with a folder string"
WorkerName = Annotated[str, Field(pattern=WORKER_NAME_RE.pattern)]
RunId = Annotated[str, Field(description="the run id")]
Seconds = Annotated[float | None, Field(None, gt=0, description="a number of seconds")]


class Device(Shape):
    """One card (or the CPU) an agent offers, with its memory figures in GiB."""

    TEXTS = {"name": "a device lacks its 'name' (e.g. 'cuda:0')",
             "kind": f"device {{name!r}} has kind {{kind!r}}; use {', '.join(DEVICE_KINDS[:-1])} or {DEVICE_KINDS[-1]}",
             "total_gib": "device {name!r} field 'total_gib' must be a number or null",
             "free_gib": "device {name!r} field 'free_gib' must be a number or null",
             "uuid": "device {name!r} field 'uuid' must be a string or null"}
    ALWAYS = frozenset(TEXTS)
    NOT_OBJECT = "each device must be an object"
    name: str = Field(min_length=1, description="a machine device name (cuda:0)")
    kind: Literal[DEVICE_KINDS]  # type: ignore[valid-type]
    total_gib: float | None = Field(None, description="GiB")
    free_gib: float | None = Field(None, description="GiB")
    uuid: str | None = Field(None, description="the physical card's id (one card offered twice is one slot)")


Devices = Annotated[list[Device], AfterValidator(_unique_names), Field(description="a list of devices")]


class RunSummary(Shape):
    """A run an agent holds: the last seq it wrote, and what its processes use per card."""

    TEXTS = {"run_id": "each entry of 'runs' needs a string 'run_id'",
             "last_seq": "run {run_id!r} field 'last_seq' must be an integer",
             "memory": "run {run_id!r} field 'memory' must map devices to GiB"}
    ALWAYS = frozenset(TEXTS)
    NOT_OBJECT = TEXTS["run_id"]
    run_id: str = Field(description="the run id")
    last_seq: int = Field(0, description="the last seq the agent holds")
    status: str | None = Field(None, description="running or finished")
    memory: dict[str, float] | None = Field(None, description="{device: GiB} by NVML's per-process figures")


class Auth(Shape):
    """How an agent proves who it is: ``pool`` is a pool's shared credential (``xfp_...``)."""

    TEXTS = {"kind": f"auth.kind must be one of {', '.join(AUTH_KINDS)}",
             "token": "auth.token must be a non-empty string"}
    ALWAYS = frozenset(TEXTS)
    kind: Literal[AUTH_KINDS] = Field(description="what the token is")  # type: ignore[valid-type]
    token: str = Field(min_length=1, description="the secret (never logged)")


# --- agent -> sidecar ---------------------------------------------------------------------------------

class Hello(Shape):
    """The agent's first message on a connection. ``instance`` is random per agent process: a second agent
    under a name that is online is refused while the first heartbeats. ``capabilities``: what the agent can
    do beyond the protocol (``memory_cap``: it caps a run's allocator to its budget; an agent that does not
    say so never gets a budgeted run)."""

    TEXTS = {"name": "'name' must be 1-64 letters, digits, '.', '_' or '-' (starting with a letter or digit)",
             "node_types": "every entry of 'node_types' must be a string",
             "instance": "'instance' must be 1-64 characters", "mounts": _MOUNT_TEXT,
             "capabilities": "every entry of 'capabilities' must be a string"}
    name: WorkerName = Field(description="the worker's name")
    version: str = Field(description="the agent's version string")
    protocol: int = Field(description="the protocol number")
    auth: Auth = Field(description="an object {kind, token}")
    node_types: list[str] = Field(description="a list of node class names")
    devices: Devices
    env: dict[str, Any] | None = Field(None, description="an object describing the environment")
    instance: str | None = Field(None, min_length=1, max_length=64, description="the agent process's id (hex)")
    runs: list[RunSummary] | None = Field(None, description="a list of {run_id, last_seq, status}")
    mounts: Annotated[dict[str, str], AfterValidator(_labels)] | None = Field(
        None, description="an object {label: folder}")
    one_shot: bool | None = Field(None, description="true for an agent that takes one run and exits")
    capabilities: list[str] | None = Field(None, description="a list of capability names")
    pid: int | None = Field(None, description="the agent's process id")


class Heartbeat(Shape):
    """Every heartbeat interval: the devices' figures and the runs."""

    devices: Devices
    runs: list[RunSummary] | None = Field(None, description="a list of {run_id, last_seq, status}")
    ts: float | None = Field(None, description="the agent's clock")


class Event(Shape):
    """One event of a run's child, with the child's per-run seq (replays repeat seqs; stored once)."""

    TEXTS = {"seq": "'seq' starts at 1"}
    run_id: RunId
    seq: int = Field(ge=1, description="the event's per-run sequence number")
    event_type: str = Field(description="the event type (e.g. 'progress')")
    payload: dict[str, Any] = Field(description="an object")
    ts: float | None = Field(None, description="when the child wrote it")


class OutputsRead(Shape):
    """The answer to ``read_outputs``: a chunk of the file."""

    request_id: str = Field(description="the request id")
    ok: Literal[True] = Field(description="whether the file was read")
    size: int = Field(description="the file's size in bytes")
    offset: int = Field(description="the offset of this chunk")
    data: str = Field(description="the chunk, base64")
    eof: bool = Field(description="true when this chunk reaches the end of the file")


class OutputsFailed(Shape):
    """The answer to ``read_outputs`` when the file was not read."""

    request_id: str = Field(description="the request id")
    ok: Literal[False] = Field(description="whether the file was read")
    error: str = Field(description="why it was not read")
    status: int | None = Field(None, description="an HTTP status for the error (404, 409)")


class RefusedServer(Shape):
    """Sent instead of hello by an agent that refused the server's certificate; it carries no secret."""

    TEXTS = {"name": "'name' is not a worker name",
             "pinned": "{field!r} is not a fingerprint (sha256: and 32 upper-case hex pairs), or too long",
             "seen": "{field!r} is not a fingerprint (sha256: and 32 upper-case hex pairs), or too long"}
    name: WorkerName = Field(description="the worker's name")
    version: str = Field(description="the agent's version string")
    pinned: str = Field(max_length=FINGERPRINT_CHARS, pattern=FINGERPRINT_RE, description="a certificate fingerprint")
    seen: str = Field(max_length=FINGERPRINT_CHARS, pattern=FINGERPRINT_RE, description="a certificate fingerprint")


class InstanceEntry(Shape):
    """An inference unit's instance an agent runs (server/units/)."""

    TEXTS = {"rank": "'rank' must be >= 0", "state": f"'state' must be one of {', '.join(INSTANCE_STATES)}"}
    ALWAYS = frozenset({"state"})
    NOT_OBJECT = "each entry must be an object"
    unit_id: str = Field(description="the unit's id")
    rank: int = Field(ge=0, description="the instance's rank")
    generation: int = Field(description="the unit's generation")
    attempt: int = Field(description="the instance's attempt within the generation")
    state: Literal[INSTANCE_STATES]  # type: ignore[valid-type]
    pid: int | None = Field(None, description="an integer")
    port: int | None = Field(None, description="an integer")
    master_port: int | None = Field(None, description="an integer")
    returncode: int | None = Field(None, description="an integer")


class InstanceState(InstanceEntry):
    """An instance is starting (its ports picked), running, arrived (at the unit's barrier) or exited."""

    TEXTS = {**InstanceEntry.TEXTS, "env": "every value of 'env' must be a string"}
    cause: str | None = Field(None, description="how the instance ended")
    address: str | None = Field(None, description="the address the instance listens on")
    env: dict[str, str] | None = Field(None, description="the environment the instance saw")


class Instances(Shape):
    """After welcome: the instances this agent runs (the sidecar takes them over)."""

    instances: list[InstanceEntry] = Field(description="a list of the instances the agent runs")


class PartFinished(Shape):
    """This worker's ranks of a run spread over workers have all ended (server/agent/parts.py)."""

    TEXTS = {"status": f"'status' must be {', '.join(PART_STATUSES[:-1])} or {PART_STATUSES[-1]}"}
    ALWAYS = frozenset(TEXTS)
    run_id: RunId
    part: int = Field(description="the part's index in the run's spread")
    status: Literal[PART_STATUSES]  # type: ignore[valid-type]
    error: str | None = Field(None, description="how the part failed")
    failed_rank: int | None = Field(None, description="the rank that failed by itself")
    peer_lost: bool | None = Field(None, description="true when its ranks only lost their peers")


class ComfyInput(Shape):
    """One input of a node class as the worker's ComfyUI declares it (its ``/object_info``, reduced)."""

    type: str = Field(description="the input's type (INT, FLOAT, STRING, BOOLEAN, COMBO, IMAGE, MODEL, ...)")
    required: bool = Field(description="true for a required input")
    options: list[Any] | None = Field(None, description="a COMBO's values (model files included)")


class ComfyClass(Shape):
    """One node class the worker's ComfyUI has."""

    inputs: dict[str, ComfyInput] = Field(description="an object {input name: {type, required, options}}")
    outputs: list[str] = Field(description="the output types, in order")


class ComfyuiInfo(Shape):
    """What the agent's ComfyUI can run (sent after hello once the agent has read it from a headless ComfyUI,
    and again whenever it reads it anew). ``ok`` false: the agent has a ComfyUI that could not be read
    (``error`` says why); such a worker takes no ComfyUI run."""

    ok: bool = Field(description="whether the ComfyUI was read")
    error: str | None = Field(None, description="why the ComfyUI could not be read")
    version: str | None = Field(None, description="ComfyUI's version")
    path: str | None = Field(None, description="the ComfyUI folder on the worker")
    classes: dict[str, ComfyClass] | None = Field(None, description="an object {node class: {inputs, outputs}}")
    models: dict[str, list[str]] | None = Field(None, description="an object {model folder: [file names]}")


# --- sidecar -> agent ---------------------------------------------------------------------------------

class Welcome(Shape):
    """The answer to hello; the agent follows the server's intervals."""

    TEXTS = {"runs": "every value of 'runs' must be an integer seq",
             "heartbeat_interval_s": "{field!r} must be more than 0 seconds",
             "resume_grace_s": "{field!r} must be more than 0 seconds"}
    name: str = Field(description="the worker's name")
    server_version: str = Field(description="the sidecar's version")
    runs: dict[str, int] = Field(description="an object run_id -> last stored seq")
    credential: str | None = Field(None, description="the worker's new credential")
    heartbeat_interval_s: Seconds
    resume_grace_s: Seconds


class Reject(Shape):
    """The connection is refused (then closed); mid-session with ``removed``, the agent stops."""

    reason: str = Field(description="why the connection is refused")
    removed: bool | None = Field(None, description="true when the worker was removed")


class StartRun(Shape):
    """A run for this worker: machine device names in the order the run lists them (run cuda:0 =
    ``devices[0]``)."""

    TEXTS = {"devices": "'devices' must list at least one device name",
             "budget_gib": "'budget_gib' must be a number or null", "spread": "spread must be an object {{parts, part, store}}"}
    ALWAYS = frozenset({"budget_gib", "spread"})
    run_id: RunId
    graph: dict[str, Any] = Field(description="the run's graph (API prompt format)")
    options: dict[str, Any] | None = Field(None, description="the run's options")
    devices: list[Annotated[str, Field(min_length=1)]] = Field(
        min_length=1, description="the machine device names of the run, in order")
    budget_gib: float | None = Field(None, description="the run's memory budget on shared cards")
    spread: dict[str, Any] | None = Field(None, description="the run's layout over workers, this worker holding "
                                                            "rank 0 (its rules: server/run/spread.py)")


class StartPart(StartRun):
    """This worker's ranks of a run spread over workers; ``spread.store`` names rank 0's store."""

    spread: dict[str, Any] = Field(description="the run's layout over workers, with rank 0's store")


class RunRef(Shape):
    """``cancel_run``, ``stop_part``, ``forget_run`` (the sidecar no longer expects the run)."""

    run_id: RunId
    reason: str | None = Field(None, description="why")


class Ack(Shape):
    """Everything of the run up to ``seq`` is stored; after ``run_finished`` is acked the agent forgets it."""

    run_id: RunId
    seq: int = Field(description="the last stored seq")


class Credential(Shape):
    """A reissued credential: the agent keeps it instead of the old one."""

    TEXTS = {"credential": "'credential' must not be empty"}
    credential: str = Field(min_length=1, description="the worker's new credential")


class ReadOutputs(Shape):
    """Bytes of a file the run recorded; ``scope`` ``run``: relative to the run's folder, ``listing``: that
    folder's files as JSON (``file`` unused)."""

    TEXTS = {"offset": "'offset' must be 0 or more", "length": f"'length' must be 1..{OUTPUTS_CHUNK_BYTES}",
             "scope": f"'scope' must be one of {', '.join(READ_SCOPES)}, got {{scope!r}}"}
    request_id: str = Field(description="the request id")
    run_id: RunId
    file: Annotated[str, AfterValidator(_relative)] = Field(
        description="a file path relative to the run's outputs folder")
    offset: int = Field(ge=0, description="a byte offset")
    length: int = Field(gt=0, le=OUTPUTS_CHUNK_BYTES, description="a number of bytes")
    scope: Literal[READ_SCOPES] | None = Field(None, description="outputs (default), run or listing")  # type: ignore[valid-type]


class StartInstance(Shape):
    """Start one instance of a unit on ``device`` with the environment contract ``env``."""

    TEXTS = {**InstanceEntry.TEXTS, "size": "'size' must be >= 1", "env": "'env' must map names to strings"}
    unit_id: str = Field(description="the unit's id")
    rank: int = Field(ge=0, description="the instance's rank")
    service: str = Field(description="the service's name")
    size: int = Field(ge=1, description="the unit's size")
    generation: int = Field(description="the unit's generation")
    attempt: int = Field(description="the instance's attempt within the generation")
    device: str = Field(description="the machine device name of the instance's card")
    program: Annotated[dict[str, Any], AfterValidator(_one_program)] = Field(
        description="the instance program ({model} or {command})")
    env: dict[str, str] = Field(description="the environment contract")
    pick_ports: bool = Field(description="true when the agent chooses MASTER_PORT")


class StopInstance(Shape):
    """``kill`` now, or ``graceful`` (SIGTERM, killed after ``grace_s``)."""

    TEXTS = {**InstanceEntry.TEXTS, "mode": f"'mode' must be one of {', '.join(STOP_MODES)}"}
    ALWAYS = frozenset({"mode"})
    unit_id: str = Field(description="the unit's id")
    rank: int = Field(ge=0, description="the instance's rank")
    mode: Literal[STOP_MODES]  # type: ignore[valid-type]
    grace_s: float | None = Field(None, description="seconds before a graceful stop kills")


Model = type[Shape] | tuple[type[Shape], type[Shape]]  # a pair: chosen by the message's ``ok``

AGENT_MESSAGES: dict[str, Model] = {
    "hello": Hello, "heartbeat": Heartbeat, "event": Event, "outputs_data": (OutputsRead, OutputsFailed),
    "refused_server": RefusedServer, "instance_state": InstanceState, "instances": Instances,
    "part_finished": PartFinished, "comfyui": ComfyuiInfo,
}
SIDECAR_MESSAGES: dict[str, Model] = {
    "welcome": Welcome, "reject": Reject, "start_run": StartRun, "cancel_run": RunRef, "forget_run": RunRef,
    "ack": Ack, "credential": Credential, "read_outputs": ReadOutputs, "start_instance": StartInstance,
    "stop_instance": StopInstance, "start_part": StartPart, "stop_part": RunRef,
}


def model_for(mtype: str, msg: Mapping[str, Any]) -> type[Shape]:
    """The model that validates message ``msg`` of type ``mtype`` (a known type)."""
    model = AGENT_MESSAGES.get(mtype) or SIDECAR_MESSAGES[mtype]
    if isinstance(model, tuple):
        return model[1] if msg.get("ok") is False else model[0]
    return model


def check(model: type[Shape], msg: Mapping[str, Any]) -> None:
    """Validate ``msg`` against ``model``; raise :class:`ContractError` with the field's text."""
    try:
        model.model_validate(msg)
    except ValidationError as exc:
        raise ContractError(refusal(model, msg, exc.errors(include_url=False)[0])) from None


def refusal(model: type[Shape], obj: Any, err: Mapping[str, Any]) -> str:
    """The text of one pydantic error ``err`` of ``obj`` validated as ``model`` (see the module docstring)."""
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, ContractError):
        return cause.message
    loc = tuple(err["loc"])
    field, rest = str(loc[0]), loc[1:]
    info = model.model_fields.get(field)
    value = obj.get(field) if isinstance(obj, Mapping) else None
    sub = _nested(info.annotation) if info is not None else None
    if sub is not None and rest:
        at, inner = (rest[0], rest[1:]) if rest[0] not in sub.model_fields else (None, rest)
        item = value if at is None else _item(value, at)
        return refusal(sub, item, {**err, "loc": inner}) if inner else sub.NOT_OBJECT
    plain = err["type"] == "missing" or err["type"].endswith("_type")
    template = model.TEXTS.get(field)
    if template is not None and (field in model.ALWAYS or not plain or rest):
        fields = {k: None for k in model.model_fields} | (dict(obj) if isinstance(obj, Mapping) else {})
        return template.format_map({**fields, "field": field, "at": rest[0] if rest else None})
    what = info.description if info is not None and info.description else "of the right type"
    if err["type"] == "missing":
        return f"missing field {field!r} ({what})"
    got = "a boolean" if isinstance(err.get("input"), bool) else type(err.get("input")).__name__
    return f"field {field!r} must be {what}, got {got}"


def _nested(annotation: Any) -> type[Shape] | None:
    """The protocol object a field holds (itself, or as the entries of a list), if any."""
    if isinstance(annotation, type) and issubclass(annotation, Shape):
        return annotation
    for arg in get_args(annotation):
        found = _nested(arg)
        if found is not None:
            return found
    return None


def _item(value: Any, at: Any) -> Any:
    if isinstance(value, list) and isinstance(at, int) and 0 <= at < len(value):
        return value[at]
    return value.get(at) if isinstance(value, Mapping) else None


def models() -> list[type[BaseModel]]:
    """Every message model, each once, agent -> sidecar first (the docs' order)."""
    out: list[type[BaseModel]] = []
    for model in [*AGENT_MESSAGES.values(), *SIDECAR_MESSAGES.values()]:
        for m in model if isinstance(model, tuple) else (model,):
            if m not in out:
                out.append(m)
    return out
