"""What ``POST /api/services`` (and ``PUT``) accepts (docs/services.md), validated into a typed :class:`ServiceSpec`.

Pure: no I/O. Every field is checked with a 400 that names it and says what to fix; an option that is
not built is refused by name (docs/limits.md). The body::

    {"name": "digits",
     "program": {"model": {"path": "models/mlp_digits.safetensors", "split": "pipeline", "max_batch": 64}}
             or {"command": ["vllm", "serve", "...", "--port", "{port}"], "health_path": "/health",
                 "infer_path": "/v1/completions", "env": {"K": "V"}},
     "unit": {"size": 2, "guard": true},
     "replicas": 1,
     "target": {"worker": "any", "device": "cuda"},
     "restart": {"max_restarts": 5, "window_s": 600, "backoff_s": 0.5, "backoff_max_s": 30},
     "routing": {"wait_s": 10, "request_timeout_s": 60},
     "ready_timeout_s": 300, "drain_timeout_s": 30}
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from ...common.errors import ApiError
from ...constants import WORKER_NAME_RE
from ..contracts.base import ContractError, not_available, validate
from ..contracts.services import (
    NAME_TEXT,
    SERVICE_NAME_PATTERN,
    Restart,
    Routing,
    ServiceUpdate,
    Unit,
)
from ..contracts.services import ServiceSpec as ServiceSpecBody
from ..devices.names import DeviceSpecError, normalize_device

# A DNS-1123 label, so the same name works as a Kubernetes object name (``services export --format lws``).
SERVICE_NAME_RE = re.compile(SERVICE_NAME_PATTERN)
MAX_BATCH_LIMIT = 4096
T = TypeVar("T")
SPLITS = ("pipeline",)  # tensor-parallel splitting is not built yet (refused by name)
PLACEHOLDERS = ("{port}", "{host}", "{rank}", "{size}", "{master_addr}", "{master_port}")

# Defaults (this module owns them: they are the service body's defaults).
DEFAULT_MAX_BATCH = 64
DEFAULT_MAX_RESTARTS = 5
DEFAULT_RESTART_WINDOW_S = 600.0
DEFAULT_BACKOFF_S = 0.5
DEFAULT_BACKOFF_MAX_S = 30.0
DEFAULT_ROUTE_WAIT_S = 10.0
DEFAULT_REQUEST_TIMEOUT_S = 60.0
DEFAULT_READY_TIMEOUT_S = 300.0
DEFAULT_DRAIN_TIMEOUT_S = 30.0
DEFAULT_COLLECTIVE_TIMEOUT_S = 60.0

TOP_FIELDS = tuple(ServiceSpecBody.model_fields)  # the contract model's (it gives the OpenAPI schema)


class SpecError(ApiError):
    """A service body the server rejects (400); the text names the field and what to fix."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(status, message)


@dataclass(frozen=True)
class ModelProgram:
    """The built-in model server: a model saved by ModelSaver, split across the unit's ranks."""

    path: str
    split: str = "pipeline"
    max_batch: int = DEFAULT_MAX_BATCH
    collective_timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S


@dataclass(frozen=True)
class CommandProgram:
    """A command with its arguments (an inference engine's own server); placeholders such as
    ``{port}`` are filled in by the agent. Rank 0 must answer ``health_path`` and ``infer_path``."""

    argv: tuple[str, ...]
    health_path: str = "/health"
    infer_path: str = "/infer"
    env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class RestartPolicy:
    """The restart budget: at most ``max_restarts`` within ``window_s``; the k-th waits
    ``backoff_s * 2**(k-1)``, at most ``backoff_max_s``."""

    max_restarts: int = DEFAULT_MAX_RESTARTS
    window_s: float = DEFAULT_RESTART_WINDOW_S
    backoff_s: float = DEFAULT_BACKOFF_S
    backoff_max_s: float = DEFAULT_BACKOFF_MAX_S


@dataclass(frozen=True)
class ServiceSpec:
    """A validated service body."""

    name: str
    program: ModelProgram | CommandProgram
    size: int = 1
    guard: bool = False
    replicas: int = 1
    worker: str = "any"
    device: str = "auto"
    restart: RestartPolicy = field(default_factory=RestartPolicy)
    route_wait_s: float = DEFAULT_ROUTE_WAIT_S
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S

    @property
    def kind(self) -> str:
        return "model" if isinstance(self.program, ModelProgram) else "command"

    @property
    def health_path(self) -> str:
        return self.program.health_path if isinstance(self.program, CommandProgram) else "/health"

    @property
    def infer_path(self) -> str:
        return self.program.infer_path if isinstance(self.program, CommandProgram) else "/infer"

    def to_json(self) -> dict[str, Any]:
        """The body this spec was made from, every default filled in (``from_json`` reads it back)."""
        if isinstance(self.program, ModelProgram):
            program: dict[str, Any] = {"model": asdict(self.program)}
        else:
            p = self.program
            program = {"command": list(p.argv), "health_path": p.health_path, "infer_path": p.infer_path,
                       "env": dict(p.env)}
        return {
            "name": self.name, "program": program, "unit": {"size": self.size, "guard": self.guard},
            "replicas": self.replicas, "target": {"worker": self.worker, "device": self.device},
            "restart": asdict(self.restart),
            "routing": {"wait_s": self.route_wait_s, "request_timeout_s": self.request_timeout_s},
            "ready_timeout_s": self.ready_timeout_s, "drain_timeout_s": self.drain_timeout_s,
        }

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> ServiceSpec:
        return parse_service(data)


# --- field checks -------------------------------------------------------------------------------

def _object(value: Any, where: str, allowed: tuple[str, ...]) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SpecError(f"{where}: must be an object")
    unknown = sorted(set(value) - set(allowed))
    if unknown:
        raise SpecError(f"{where}: unknown field(s) {', '.join(unknown)}; known: {', '.join(allowed)}")
    return value


def _int(obj: Mapping[str, Any], key: str, where: str, default: int, lo: int, hi: int) -> int:
    value = obj.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise SpecError(f"{where}.{key}: must be an integer from {lo} to {hi}, got {value!r}")
    return value


def _num(obj: Mapping[str, Any], key: str, where: str, default: float, lo: float, hi: float,
         lo_open: bool = False) -> float:
    value = obj.get(key, default)
    ok = not isinstance(value, bool) and isinstance(value, int | float)
    if ok:
        value = float(value)
        ok = (lo < value if lo_open else lo <= value) and value <= hi
    if not ok:
        low = f"more than {lo:g}" if lo_open else f"from {lo:g}"
        field_name = f"{where}.{key}" if where else key
        raise SpecError(f"{field_name}: must be a number of seconds {low} to {hi:g}, got {obj.get(key)!r}")
    return float(value)


def _path_field(obj: Mapping[str, Any], key: str, where: str, default: str) -> str:
    value = obj.get(key, default)
    if not isinstance(value, str) or not value.startswith("/") or len(value) > 500 or any(c.isspace() for c in value):
        raise SpecError(f"{where}.{key}: must be a URL path starting with '/', e.g. {default!r}")
    return value


def _model_program(raw: Any) -> ModelProgram:
    m = _object(raw, "program.model", ("path", "split", "max_batch", "collective_timeout_s"))
    path = m.get("path")
    if not isinstance(path, str) or not path.strip() or "\x00" in path:
        raise SpecError("program.model.path: give the file ModelSaver wrote, e.g. 'models/mlp_digits.safetensors' "
                        "(relative: the worker's outputs folder)")
    split = m.get("split", "pipeline")
    if split == "tensor":
        raise SpecError(not_available("program.model.split 'tensor'", "tensor-parallel splitting", "use 'pipeline'"))
    if split not in SPLITS:
        raise SpecError(f"program.model.split: must be one of {', '.join(SPLITS)}, got {split!r}")
    return ModelProgram(
        path=path.strip(), split=split,
        max_batch=_int(m, "max_batch", "program.model", DEFAULT_MAX_BATCH, 1, MAX_BATCH_LIMIT),
        collective_timeout_s=_num(m, "collective_timeout_s", "program.model", DEFAULT_COLLECTIVE_TIMEOUT_S, 1, 3600),
    )


def _command_program(p: Mapping[str, Any]) -> CommandProgram:
    argv = p.get("command")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) and "\x00" not in a for a in argv):
        raise SpecError("program.command: must be a non-empty list of strings (the program and its arguments)")
    if not argv[0].strip():
        raise SpecError("program.command[0]: the program to run is empty")
    env = p.get("env") or {}
    if not isinstance(env, Mapping) or not all(
            isinstance(k, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) and isinstance(v, str)
            for k, v in env.items()):
        raise SpecError("program.env: must be an object of NAME: \"value\" strings")
    return CommandProgram(
        argv=tuple(argv), health_path=_path_field(p, "health_path", "program", "/health"),
        infer_path=_path_field(p, "infer_path", "program", "/infer"),
        env=tuple(sorted((str(k), str(v)) for k, v in env.items())),
    )


def _program(raw: Any) -> ModelProgram | CommandProgram:
    p = _object(raw, "program", ("model", "command", "health_path", "infer_path", "env"))
    has_model, has_command = "model" in p, "command" in p
    if has_model == has_command:
        raise SpecError("program: give exactly one of \"model\" (the built-in model server: {\"path\": ...}) or "
                        "\"command\" (a list: the program and its arguments)")
    if has_model:
        extra = sorted(k for k in p if k != "model")
        if extra:
            raise SpecError(f"program: {', '.join(extra)} go with \"command\" only (the built-in model server "
                            f"answers /health and /infer)")
        return _model_program(p["model"])
    return _command_program(p)


def _target(raw: Any) -> tuple[str, str]:
    if isinstance(raw, str):
        raw = {"worker": raw}
    allowed = ("worker", "device", "devices", "memory_gib", "memory_source", "wait", "pool")
    t = _object(raw, "target", allowed)
    for key, feature in (("devices", "device sets per instance (each instance takes exactly one card)"),
                         ("memory_gib", "memory budgets for service instances"),
                         ("memory_source", "memory budgets for service instances"),
                         ("wait", "memory budgets for service instances"),
                         ("pool", "service instances on one-shot pools")):
        if key in t:
            raise SpecError(not_available(f"target.{key}", feature))
    worker = t.get("worker", "any")
    if worker == "local":
        raise SpecError("target.worker 'local': service instances run on worker agents; start one on this machine "
                        "(`xpufleet agent start`) and use \"any\" or its name")
    if not isinstance(worker, str) or not (worker == "any" or WORKER_NAME_RE.match(worker)):
        raise SpecError(f"target.worker: must be \"any\" or a worker's name, got {worker!r}")
    device = t.get("device", "auto")
    if not isinstance(device, str):
        raise SpecError("target.device: must be a string: auto, cpu, cuda, cuda:N, xpu, xpu:N")
    if device not in ("auto", "cuda", "xpu", "mps"):
        try:
            device = normalize_device(device)
        except DeviceSpecError as exc:
            raise SpecError(f"target.device: {exc}") from None
    return worker, device


def parse_service(body: Any, name: str | None = None) -> ServiceSpec:
    """Validate a service body (``name``: the name from the URL of a PUT, which the body may omit)."""
    try:  # the contract first: the shape, the known fields, the name, the ranges (their texts)
        sent = validate(ServiceSpecBody if name is None else ServiceUpdate, body)
    except ContractError as exc:
        raise SpecError(exc.message, exc.status) from None
    svc_name = body.get("name", name)
    if name is not None and svc_name != name:
        raise SpecError(f"name: the body names {svc_name!r} but the URL names {name!r}; a service cannot be renamed")
    if not SERVICE_NAME_RE.match(svc_name):  # (the URL's name of a PUT)
        raise SpecError(NAME_TEXT)
    program = _program(body["program"])
    unit, r, rt = sent.unit or Unit(), sent.restart or Restart(), sent.routing or Routing()
    worker, device = _target(body.get("target"))
    restart = RestartPolicy(
        max_restarts=_or(r.max_restarts, DEFAULT_MAX_RESTARTS), window_s=_or(r.window_s, DEFAULT_RESTART_WINDOW_S),
        backoff_s=_or(r.backoff_s, DEFAULT_BACKOFF_S), backoff_max_s=_or(r.backoff_max_s, DEFAULT_BACKOFF_MAX_S))
    if restart.backoff_max_s < restart.backoff_s:
        raise SpecError("restart.backoff_max_s: must be at least restart.backoff_s")
    return ServiceSpec(
        name=svc_name, program=program, size=_or(unit.size, 1), guard=_or(unit.guard, False),
        replicas=_or(sent.replicas, 1), worker=worker, device=device, restart=restart,
        route_wait_s=_or(rt.wait_s, DEFAULT_ROUTE_WAIT_S),
        request_timeout_s=_or(rt.request_timeout_s, DEFAULT_REQUEST_TIMEOUT_S),
        ready_timeout_s=_or(sent.ready_timeout_s, DEFAULT_READY_TIMEOUT_S),
        drain_timeout_s=_or(sent.drain_timeout_s, DEFAULT_DRAIN_TIMEOUT_S),
    )


def _or(value: T | None, default: T) -> T:
    """A field's value, or its default when the body left it out."""
    return default if value is None else value


def fill_placeholders(argv: tuple[str, ...] | list[str], values: Mapping[str, str]) -> list[str]:
    """A command's argv with ``{port}``, ``{host}``, ``{rank}``, ``{size}``, ``{master_addr}``,
    ``{master_port}`` filled in (plain text replacement: other braces stay as they are)."""
    out = []
    for arg in argv:
        for key, value in values.items():
            arg = arg.replace("{" + key + "}", value)
        out.append(arg)
    return out
