"""The wheel holds every subpackage (setup.py computes the list) and works on its own: built from this
checkout, installed into a fresh virtual environment, every subpackage imports and `xpufleet --help`
runs."""

from __future__ import annotations

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import arch_imports as arch
import pytest

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(arch.REPO)],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout + built.stderr
    (path,) = out.glob("xpufleet-*.whl")
    return path


def test_the_wheel_holds_every_module_and_the_front_end(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {str(p.relative_to(arch.REPO).as_posix()) for p in arch.modules().values()}
    in_wheel = {n.removeprefix("xpufleet/") for n in names if n.startswith("xpufleet/")}
    assert expected - in_wheel == set()
    assert "web/xpu_monitor.js" in in_wheel and "samples/mlp_digits.json" in in_wheel
    assert {"example_workflows/mlp_digits.json", "example_workflows/mlp_digits.jpg", "locales/en/main.json"} <= in_wheel
    tops = {n.split("/")[0] for n in names if not n.startswith("xpufleet-")}
    assert tops == {"xpufleet"}  # nothing that could shadow ComfyUI's own nodes/ or server.py


def test_installed_in_a_fresh_venv_every_subpackage_imports(wheel, tmp_path):
    env_dir = tmp_path / "venv"
    # The machine's site-packages provide torch & co. (a fresh CUDA torch download is not an option
    # here); xpufleet itself comes only from the wheel, which the check below proves.
    venv.create(env_dir, system_site_packages=True, with_pip=True)
    python = env_dir / "bin" / "python"
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", str(wheel)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    packages = sorted(n for n, p in arch.modules().items() if p.name == "__init__.py")
    code = ("import importlib, sys, xpufleet; "
            f"[importlib.import_module(m) for m in {packages!r}]; "
            "print(xpufleet.__file__)")
    shown = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert str(env_dir) in shown.stdout.strip(), f"imported from {shown.stdout!r}, not the venv"
    helped = subprocess.run([str(env_dir / "bin" / "xpufleet"), "--help"], capture_output=True, text=True,
                            timeout=300, cwd=tmp_path)
    assert helped.returncode == 0 and "usage: xpufleet" in helped.stdout, helped.stderr
