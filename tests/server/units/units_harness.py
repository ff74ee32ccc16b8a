"""Helpers of the units tests: a saved model, and a fleet of a real sidecar and real agent processes on
loopback with simulated cards (the e2e tests share one per module). Test files use it as
``import units_harness`` (tests/server/units/conftest.py registers it).

The processes are started and stopped by the remote-worker tests' own classes (tests/server/fleet_harness.py,
registered by tests/server/conftest.py), so both suites start processes the same way.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import fleet_harness as fh


def save_mlp(path: Path, seed: int = 0, hidden: tuple[int, ...] = (48, 32, 16)) -> Path:
    """An MLP for 8x8 digits (64 features, 10 classes) saved by ModelSaver's own function."""
    from xpufleet.nodes.io import save_model
    from xpufleet.nodes.models import build_model, make_spec

    spec = make_spec("mlp", {"in_features": 64, "out_features": 10, "hidden": list(hidden), "activation": "relu",
                             "dropout": 0.0, "batch_norm": False}, {"task": "classification", "num_classes": 10}, [64])
    path.parent.mkdir(parents=True, exist_ok=True)
    save_model(build_model(spec, seed=seed), path, "safetensors")
    return path


class Fleet:
    """One sidecar and its agents for a module's tests; ``call`` speaks to the sidecar's API."""

    def __init__(self, home: Path, agents: dict[str, str]) -> None:
        self.home = home
        home.mkdir(parents=True, exist_ok=True)
        self.env = fh.base_env(home)
        self.sidecar = fh.SidecarProc(home, self.env)
        self.agents = {name: fh.AgentProc(home, self.env, "--name", name, "--simulate", sim, label=f"agent-{name}")
                       for name, sim in agents.items()}

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        return self.sidecar.call(method, path, body)

    def wait_online(self, timeout: float = 240.0) -> None:
        for name in self.agents:
            self.sidecar.wait_worker(name, "Online", timeout)

    def service(self, name: str) -> dict[str, Any]:
        status, body = self.call("GET", f"/api/services/{name}")
        assert status == 200, body
        return body

    def wait_service(self, name: str, pred, timeout: float = 300.0, what: str = "") -> dict[str, Any]:
        """Poll the service (no push channel) until ``pred(service)``; bounded."""
        deadline = time.monotonic() + timeout
        while True:
            svc = self.service(name)
            if pred(svc):
                return svc
            if time.monotonic() > deadline:
                raise AssertionError(f"service {name}: {what or 'condition'} not met within {timeout} s:\n"
                                     f"{json.dumps(svc, indent=1)[:6000]}")
            time.sleep(0.1)

    def cli(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
        return subprocess.run([*fh.CLI, *args], env=self.env, capture_output=True, text=True, timeout=timeout)

    def stop(self) -> None:
        for a in self.agents.values():
            a.stop()
        self.sidecar.stop()
