"""``python -m xpufleet.server`` = the ``xpufleet`` command (the background sidecar starts this way)."""

from __future__ import annotations

import sys

from .cli.main import main

if __name__ == "__main__":
    sys.exit(main())
