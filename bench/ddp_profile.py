"""Where a training step's time goes, from py-spy samples (bench_ddp.py ``--profile``).

py-spy (``pip install py-spy``; not a dependency of the package) samples every rank's Python stack,
idle waits included (``--idle``: a rank blocked in a gloo wait shows the Python frame that waits), in
raw ("collapsed") format: one line per distinct stack, ``frame;frame;... count``, each frame
``function (file:line)``. A sample belongs to the training loop when a frame of the loop function
(``_epochs`` for ours, ``train_loop`` for the torchrun script) is on its stack; it goes to the first
phase recognised below that frame. The shares, times the measured time per step, give microseconds per
step for each phase.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

PHASES = ("forward (model + loss)", "backward + gradient all-reduce", "optimizer (step, zero_grad, clip)",
          "data (DataLoader next)", "stop/report agreement", "everything else")
OURS_LOOP, TORCHRUN_LOOP = "_epochs", "train_loop"


def phase_of(frames: list[str], loop: str) -> str | None:
    """The phase of one sampled stack (outermost frame first), or None when it is outside ``loop``."""
    inside = False
    for frame in frames:
        name, _, where = frame.partition(" (")
        name = name.rpartition(".")[2]  # py-spy writes methods as Class.method
        if not inside:
            inside = name == loop
            continue
        if name in ("agree", "settle"):
            return PHASES[4]
        if "torch/optim/" in where or name in ("zero_grad", "clip_grad_norm_"):
            return PHASES[2]
        if name == "backward" and ("_tensor.py" in where or "autograd" in where):
            return PHASES[1]
        if (name == "_wrapped_call_impl" and "nn/modules/module.py" in where) or (
                name == "__call__" and "nodes/specs.py" in where):  # ours: the Loss node's LossFn
            return PHASES[0]
        if name == "__next__" and "utils/data/dataloader.py" in where:
            return PHASES[3]
    return PHASES[5] if inside else None


def shares(raw: str, loop: str) -> tuple[dict[str, float], int]:
    """Each phase's share of the loop's samples in py-spy raw output, and the number of loop samples."""
    counts: Counter[str] = Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        phase = phase_of(stack.split(";"), loop)
        if phase is not None:
            counts[phase] += int(count)
    total = sum(counts.values())
    return {p: counts[p] / total if total else 0.0 for p in PHASES}, total


@dataclass
class Recorder:
    """``py-spy record`` on a process tree, stopped with SIGINT (py-spy then writes its output)."""

    out: Path
    proc: subprocess.Popen[bytes] | None = None
    RATE = 500

    @staticmethod
    def available() -> bool:
        return shutil.which("py-spy") is not None

    def args(self) -> list[str]:
        return ["py-spy", "record", "--idle", "--nonblocking", "--subprocesses", "--rate", str(self.RATE),
                "--format", "raw", "-o", str(self.out)]

    def attach(self, pid: int) -> None:
        self.proc = subprocess.Popen([*self.args(), "--pid", str(pid)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)

    def wrap(self, cmd: list[str]) -> list[str]:
        """``cmd`` run under py-spy (it ends, and writes, when ``cmd`` exits)."""
        return [*self.args(), "--", *cmd]

    def stop(self) -> str:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGINT)
            self.proc.wait(timeout=120)
        return self.out.read_text() if self.out.is_file() else ""


def table(rows: dict[str, tuple[dict[str, float], int, float]]) -> str:
    """A Markdown table: for each side (its shares, its samples, its measured µs per step) µs per phase."""
    names = list(rows)
    lines = ["| per step (µs) | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for p in PHASES:
        lines.append(f"| {p} | " + " | ".join(f"{rows[n][0][p] * rows[n][2]:,.0f}" for n in names) + " |")
    lines.append("| **total (measured, unprofiled runs)** | "
                 + " | ".join(f"**{rows[n][2]:,.0f}**" for n in names) + " |")
    lines.append("| py-spy samples in the loop | " + " | ".join(f"{rows[n][1]:,}" for n in names) + " |")
    return "\n".join(lines)
