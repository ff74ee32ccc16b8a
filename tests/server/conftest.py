"""Makes tests/server/sidecar_harness.py and scripted_agent.py importable by name (test dirs are not packages)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

for _name in ("sidecar_harness", "scripted_agent", "fleet_harness"):  # fleet_harness: the remote-worker tests
    if _name not in sys.modules:
        _spec = importlib.util.spec_from_file_location(_name, Path(__file__).with_name(f"{_name}.py"))
        _module = importlib.util.module_from_spec(_spec)
        sys.modules[_name] = _module
        _spec.loader.exec_module(_module)


@pytest.fixture
def fleet(tmp_path):
    """Processes a remote-worker test starts (fleet_harness.Fleet); all stopped at the end, by PID."""
    f = sys.modules["fleet_harness"].Fleet(tmp_path)
    yield f
    f.close()


CPU_ONLY = [{"name": "cpu", "kind": "cpu", "uuid": None, "total_gib": None}]


@pytest.fixture
def sidecar_client(aiohttp_client, tmp_path):
    """Starts the sidecar's app in this process on loopback (pytest-aiohttp's ``aiohttp_client``, so its
    cleanup runs even when the test fails): ``client, config = await sidecar_client(**SidecarConfig
    fields)``; the home is ``tmp_path/home``, the devices this CPU only unless ``local_devices`` says."""
    from xpufleet.server.sidecar.app import SidecarConfig, create_app

    async def start(**fields: Any) -> tuple[Any, Any]:
        config = SidecarConfig(**{"home": tmp_path / "home", "port": 0, "local_devices": CPU_ONLY, **fields})
        return await aiohttp_client(create_app(config)), config

    return start
