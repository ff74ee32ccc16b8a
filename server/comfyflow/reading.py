"""A worker's ComfyUI as the sidecar knows it: the typed form of the agent's ``comfyui`` message
(server/contracts/agent_protocol.py ``ComfyuiInfo``): node classes with their inputs (type, required,
COMBO options) and outputs, and the model files per folder. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# The states of a provider's ComfyUI (the Workers panel's ``comfyui.state``): ``none``: it has none;
# ``probing``: its agent announced one (hello capability ``comfyui``) and is still reading it; ``ready``:
# read; ``failed``: it could not be read.
STATE_NONE, STATE_PROBING, STATE_READY, STATE_FAILED = "none", "probing", "ready", "failed"
STATES = (STATE_NONE, STATE_PROBING, STATE_READY, STATE_FAILED)
CAPABILITY = "comfyui"  # in hello's capabilities: a reading is coming


@dataclass(frozen=True)
class InputSpec:
    """One input of a node class: its type, whether it is required, a COMBO's values."""

    type: str
    required: bool
    options: tuple[Any, ...] | None = None


@dataclass(frozen=True)
class ClassSpec:
    """One node class: its inputs by name and its output types in order."""

    inputs: Mapping[str, InputSpec]
    outputs: tuple[str, ...]


@dataclass(frozen=True)
class Reading:
    """What one ComfyUI offers (``ok`` false: it could not be read, ``error`` says why)."""

    ok: bool
    error: str | None = None
    version: str | None = None
    path: str | None = None
    classes: Mapping[str, ClassSpec] = field(default_factory=dict)
    models: Mapping[str, frozenset[str]] = field(default_factory=dict)

    def has_file(self, folder: str, name: str) -> bool:
        """Whether ``folder`` holds ``name`` (``/`` or ``\\`` separated, as a workflow may write it)."""
        return norm_file(name) in self.models.get(folder, frozenset())

    @property
    def state(self) -> str:
        return STATE_READY if self.ok else STATE_FAILED

    def summary(self) -> dict[str, Any]:
        """The Workers panel's view: ``{state, version, classes: N, error}``."""
        return {"state": self.state, "version": self.version, "classes": len(self.classes), "error": self.error}


def norm_file(name: str) -> str:
    """A model file name as the readings store it: ``/`` separated."""
    return name.replace("\\", "/")


def _input(raw: Mapping[str, Any]) -> InputSpec:
    opts = raw.get("options")
    return InputSpec(type=str(raw.get("type") or "*"), required=bool(raw.get("required")),
                     options=tuple(opts) if isinstance(opts, list | tuple) else None)


def reading_of(msg: Mapping[str, Any]) -> Reading:
    """The typed reading of a validated ``comfyui`` message (extra keys ignored)."""
    classes: dict[str, ClassSpec] = {}
    for name, raw in (msg.get("classes") or {}).items():
        if not isinstance(raw, Mapping):
            continue
        inputs = {str(k): _input(v) for k, v in (raw.get("inputs") or {}).items() if isinstance(v, Mapping)}
        classes[str(name)] = ClassSpec(inputs=inputs, outputs=tuple(str(o) for o in raw.get("outputs") or ()))
    models = {str(folder): frozenset(norm_file(str(f)) for f in files or ())
              for folder, files in (msg.get("models") or {}).items()}
    return Reading(ok=bool(msg.get("ok")), error=msg.get("error"), version=msg.get("version"),
                   path=msg.get("path"), classes=classes, models=models)


def summary(state: str, reading: Reading | None) -> dict[str, Any]:
    """``{state, version, classes, error}`` for a provider whose ComfyUI is in ``state``."""
    if reading is not None and state in (STATE_READY, STATE_FAILED):
        return reading.summary()
    return {"state": state, "version": None, "classes": 0, "error": None}
