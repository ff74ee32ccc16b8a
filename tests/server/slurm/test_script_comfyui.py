"""A Slurm pool that runs ComfyUI workflows: its jobs' agents start with --comfyui PATH (quoted, one line)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from xpufleet.server.contracts.base import ContractError, validate
from xpufleet.server.contracts.workers import PoolCreate
from xpufleet.server.slurm.script import JobPaths, job_script
from xpufleet.server.slurm.spec import SpecError, parse_spec


def test_the_pool_s_comfyui_folder_is_given_to_its_agents() -> None:
    script = job_script(parse_spec({}), "burst", JobPaths.under("/w"), comfyui="/opt/Comfy UI")
    assert "comfyui='/opt/Comfy UI'" in script
    assert 'if [ -n "$comfyui" ]; then args+=(--comfyui "$comfyui"); fi' in script
    assert "comfyui=''" in job_script(parse_spec({}), "burst", JobPaths.under("/w"))


def test_a_control_character_is_refused() -> None:
    with pytest.raises(SpecError, match="comfyui"):
        job_script(parse_spec({}), "burst", JobPaths.under("/w"), comfyui="/opt\nrm -rf /")


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash checks the script's syntax")
def test_the_script_parses() -> None:
    script = job_script(parse_spec({}), "burst", JobPaths.under("/w"), comfyui="/opt/$(x) `y`")
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


@pytest.mark.parametrize("path", ["relative/ComfyUI", "-x", "/a;rm -rf /", "/a\nb", "/$(id)", "/a`b`", "/" + "a" * 1100])
def test_a_pools_comfyui_folder_is_an_absolute_path_from_an_allow_list(path: str) -> None:
    with pytest.raises(ContractError) as err:
        validate(PoolCreate, {"name": "burst", "comfyui": path})
    assert "absolute path of letters, digits" in err.value.message
    assert validate(PoolCreate, {"name": "burst", "comfyui": "/opt/ComfyUI-0.3.64"}).comfyui == "/opt/ComfyUI-0.3.64"
