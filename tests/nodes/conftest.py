"""Fixtures for the graph-node tests: real digits data, loaders, and a run context that records events."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from xpufleet.nodes import NODE_CLASS_MAPPINGS as N
from xpufleet.nodes import runtime


@dataclass
class RecordedRun:
    """A RunContext whose events are kept in order, plus helpers to read them."""

    ctx: runtime.RunContext
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def of(self, type_: str) -> list[dict[str, Any]]:
        return [p for t, p in self.events if t == type_]

    def metrics(self, name: str) -> list[dict[str, Any]]:
        return [p for p in self.of("metric") if p["name"] == name]

    def warnings(self, kind: str) -> list[dict[str, Any]]:
        return [p for p in self.of("run_warning") if p["kind"] == kind]


@pytest.fixture
def make_run(tmp_path: Path):
    """Factory: ``make_run(**RunContext fields)`` -> RecordedRun with a run dir under tmp_path."""

    def make(**kwargs: Any) -> RecordedRun:
        rec = RecordedRun(ctx=None)  # type: ignore[arg-type]
        kwargs.setdefault("run_dir", tmp_path / "run")
        kwargs["run_dir"].mkdir(parents=True, exist_ok=True)
        rec.ctx = runtime.RunContext(emit=lambda t, p: rec.events.append((t, p)), **kwargs)
        return rec

    return make


@pytest.fixture(scope="session")
def digits() -> tuple[Any, Any, dict[str, Any]]:
    return N["XPUDataset"]().load("digits", val_split=0.2, seed=0, normalize="standard")


@pytest.fixture(scope="session")
def digits_images() -> tuple[Any, Any, dict[str, Any]]:
    return N["XPUDataset"]().load("digits", val_split=0.2, seed=0, normalize="standard", as_image=True)


@pytest.fixture
def loaders(digits):
    train, val, _info = digits
    (tl,) = N["XPUDataLoader"]().make(train, 64, True)
    (vl,) = N["XPUDataLoader"]().make(val, 256, False)
    return tl, vl


def _build_mlp(info: dict[str, Any], hidden: str = "64,32", seed: int = 0, **kw: Any) -> Any:
    (model,) = N["XPUMLP"]().build(hidden, dataset_info=info, seed=seed, **kw)
    return model


def _train(model: Any, loader: Any, *, optimizer: str = "adam", lr: float = 2e-3, loss: str = "cross_entropy",
          **kw: Any) -> tuple[Any, dict[str, Any]]:
    """Run the TrainingLoop node with test-friendly defaults (no TensorBoard unless asked)."""
    (opt,) = N["XPUOptimizer"]().make(optimizer, lr)
    (loss_spec,) = N["XPULoss"]().make(loss)
    kw.setdefault("tensorboard", False)
    kw.setdefault("device", "cpu")
    return N["XPUTrainingLoop"]().train(model, loader, opt, loss_spec, **kw)["result"]


@pytest.fixture
def build_mlp():
    """``build_mlp(info, hidden="64,32", seed=0, **kw)`` -> an MLP from the MLP node."""
    return _build_mlp


@pytest.fixture
def train_node():
    """``train_node(model, loader, optimizer=, lr=, loss=, **TrainingLoop inputs)`` -> (model, metrics)."""
    return _train
