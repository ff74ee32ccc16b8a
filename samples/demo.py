"""`make demo`: the main job on an embedded default, all on this machine.

Starts the sidecar, a worker agent with two SIMULATED CUDA cards (the work runs on the CPU; only the
memory figures are simulated), queues the MLP and CNN digit examples on the worker's cards, follows
them, lists runs and workers, and stops everything it started. State lives in a fresh XPUFLEET_HOME
(a temporary folder) unless XPUFLEET_HOME is set.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
XPUFLEET = [sys.executable, "-m", "xpufleet.server"]


def step(title: str) -> None:
    print(f"\n=== {title}", flush=True)


def xpufleet(*args: str, check: bool = True, env: dict[str, str]) -> int:
    print("$ xpufleet " + " ".join(args), flush=True)
    code = subprocess.run([*XPUFLEET, *args], env=env, cwd=REPO).returncode
    if check and code != 0:
        raise SystemExit(f"demo: `xpufleet {' '.join(args)}` exited {code}")
    return code


def main() -> int:
    home = os.environ.get("XPUFLEET_HOME") or tempfile.mkdtemp(prefix="xpufleet-demo-")
    env = {**os.environ, "XPUFLEET_HOME": home, "PYTHONUNBUFFERED": "1"}
    print(f"XPUFLEET_HOME={home}")
    codes: list[int] = []
    started_agent = False
    step("start the sidecar (127.0.0.1, a free port)")
    xpufleet("start", "--port", "0", env=env)
    try:
        step("start a worker agent with two simulated 24 GiB CUDA cards (work runs on the CPU)")
        xpufleet("agent", "start", "--name", "demo-gpu", "--simulate", "cuda:0=24,cuda:1=24", env=env)
        started_agent = True
        xpufleet("workers", env=env)
        step("queue the MLP on the worker's cards cuda:1,cuda:0 (the run sees them as cuda:0, cuda:1)")
        codes.append(
            xpufleet("run", "samples/mlp_digits.json", "--target", "demo-gpu", "--devices", "cuda:1,cuda:0",
                     "--name", "demo-mlp", "--seed", "1", "--follow", check=False, env=env)
        )
        step("queue the CNN on whichever worker has a free CUDA card first (--target any)")
        codes.append(
            xpufleet("run", "samples/cnn_digits.json", "--target", "any", "--device", "cuda", "--name",
                     "demo-cnn", "--seed", "1", "--follow", check=False, env=env)
        )
        step("runs and workers")
        xpufleet("runs", env=env)
        xpufleet("workers", env=env)
    finally:
        step("stop what the demo started")
        if started_agent:
            xpufleet("agent", "stop", "--name", "demo-gpu", check=False, env=env)
        xpufleet("stop", check=False, env=env)
    ok = all(c == 0 for c in codes)
    print("\ndemo " + ("succeeded" if ok else f"failed (run exit codes {codes})"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
