"""The package list, computed: the repository root is the ``xpufleet`` package (ComfyUI loads it from
``custom_nodes/``), and every subpackage of ``nodes/``, ``server/`` and ``predictor/`` is found here,
so a new subpackage can never be left out of the wheel. Everything else is in pyproject.toml."""

from setuptools import find_packages, setup

SUBPACKAGES = ("common", "nodes", "server", "predictor")

packages = ["xpufleet"] + [
    f"xpufleet.{name}" for name in find_packages(".", include=[f"{p}*" for p in SUBPACKAGES] + list(SUBPACKAGES))
]

setup(packages=packages, package_dir={"xpufleet": "."})
