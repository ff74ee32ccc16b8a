"""The layer contracts (``.importlinter``, run by ``lint-imports`` in ``make lint``) hold, can fail, and are
the list docs/architecture.md shows."""

from __future__ import annotations

import configparser
import re
from pathlib import Path

from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / ".importlinter"


def _layers_of_config() -> list[str]:
    parser = configparser.ConfigParser()
    parser.read(CONFIG, encoding="utf-8")
    return [line.strip() for line in parser["importlinter:contract:layers"]["layers"].splitlines() if line.strip()]


def _layers_of_docs() -> list[str]:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("## Layers", 1)[1]
    block = re.search(r"```text\n(.*?)```", section, re.S)
    assert block, "docs/architecture.md's Layers section has no ```text block of layers"
    return [line.strip() for line in block.group(1).splitlines() if line.strip()]


def test_the_layer_contracts_hold():
    assert lint_imports(config_filename=str(CONFIG), no_cache=True, no_logo=True) == 0


def test_a_broken_contract_fails(tmp_path):
    # sidecar's routes import the common HTTP toolkit: forbidding it must break the check.
    config = tmp_path / "broken.ini"
    config.write_text("[importlinter]\nroot_package = xpufleet\n\n"
                      "[importlinter:contract:x]\nname = sidecar without common\ntype = forbidden\n"
                      "source_modules =\n    xpufleet.server.sidecar\nforbidden_modules =\n    xpufleet.common\n",
                      encoding="utf-8")
    assert lint_imports(config_filename=str(config), no_cache=True, no_logo=True) == 1


def test_the_docs_list_the_contracts_layers():
    assert _layers_of_docs() == _layers_of_config()
