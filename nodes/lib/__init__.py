"""The torch-only library the nodes run and ``xpufleet export`` inlines (docs/export.md).

Each module here imports only the standard library, torch, numpy, scikit-learn and safetensors (inside
the functions: a control-plane host imports the nodes without them), never xpufleet or ComfyUI. The
nodes call these functions, and the exporter copies each module's code after its ``SCRIPT_MARKER``
line into the script it writes (``server/run/export.py``), so an exported script computes what a run
computes with the same code. In a script the modules share one namespace, so a module that uses
another imports it above its marker line only.
"""

from __future__ import annotations

SCRIPT_MARKER = "# --- inlined by xpufleet export from here"
# The modules an exported script holds, in the order they are inlined.
SCRIPT_MODULES = ("datasets", "layers", "optim", "losses", "precision", "evaluation", "modelfile")
