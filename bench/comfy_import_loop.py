"""A plain torch training loop after importing what a ComfyUI build imports (issue 31, item 5;
docs/benchmarks.md "Training in ComfyUI 0.33.0 vs 0.3.64"): whether the import alone slows each op.

    <comfyui venv>/bin/python bench/comfy_import_loop.py plain|kitchen|nodes [--comfyui DIR] [--steps N]

``plain`` imports torch only; ``kitchen`` first imports comfy_kitchen (0.33's torch custom ops);
``nodes`` first imports ComfyUI's ``nodes`` (and with it comfy.*) from ``--comfyui`` with ``--cpu``.
Prints the mode and the seconds of ``--steps`` Adam steps of a small MLP (after 50 warm-up steps).
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=("plain", "kitchen", "nodes"))
    ap.add_argument("--comfyui", default=os.environ.get("COMFYUI_DIR"), help="ComfyUI's folder (mode nodes)")
    ap.add_argument("--steps", type=int, default=600)
    args = ap.parse_args()
    if args.mode == "kitchen":
        import comfy_kitchen  # noqa: F401
    elif args.mode == "nodes":
        if not args.comfyui:
            ap.error("mode nodes needs --comfyui or COMFYUI_DIR")
        sys.path.insert(0, args.comfyui)
        os.chdir(args.comfyui)
        sys.argv = [sys.argv[0], "--cpu"]  # ComfyUI parses its own arguments at import
        import comfy.options
        comfy.options.enable_args_parsing()
        import nodes  # noqa: F401
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                torch.nn.ReLU(), torch.nn.Linear(256, 10))
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    x, y = torch.randn(64, 64), torch.randint(0, 10, (64,))

    def steps(n: int) -> None:
        for _ in range(n):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()

    steps(50)
    t0 = time.perf_counter()
    steps(args.steps)
    print(args.mode, round(time.perf_counter() - t0, 3))


if __name__ == "__main__":
    main()
