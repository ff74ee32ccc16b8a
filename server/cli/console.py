"""Terminal rendering of a run's event stream: a live progress bar and the final metrics summary.

Used by ``xpufleet run --local`` (events straight from the executor) and by ``xpufleet run --follow``
(events read from the sidecar), so both look the same.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from .text import safe


def _number(value: Any) -> float:
    """A metric value for display; JSON has no NaN, so a stored NaN comes back as null."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


class ProgressView:
    """Feed it events with :meth:`handle`; it draws at most every ``min_interval`` seconds."""

    def __init__(self, stream: TextIO | None = None, min_interval: float = 0.1) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.min_interval = min_interval if self.tty else 2.0
        self.last_draw = 0.0
        self.metrics: dict[str, float] = {}
        self.warnings: list[str] = []
        self.saved: list[str] = []  # files the run saved (ModelSaver), listed in the summary
        self.node = ""
        self._line_open = False

    def handle(self, type_: str, payload: dict[str, Any]) -> None:
        if type_ == "node_started":
            self.node = f"{payload.get('node')} {payload.get('class_type')}"
            self._draw(f"[{payload.get('index', 0) + 1}/{payload.get('total', '?')}] {self.node}", force=True)
        elif type_ == "progress":
            self._draw(self._bar(payload))
        elif type_ == "metric":
            self.metrics[str(payload.get("name"))] = _number(payload.get("value"))
        elif type_ == "run_warning":
            msg = f"warning ({payload.get('kind')}): {payload.get('message')}"
            self.warnings.append(msg)
            self._print(msg)
        elif type_ in ("node_error", "run_error"):
            self._print(f"error: {payload.get('message')}")
        elif type_ == "artifact" and payload.get("kind") == "model":
            self.saved.append(str(payload.get("path")))
        elif type_ == "log" and payload.get("level") in ("warning", "error"):
            self._print(str(payload.get("message")))

    def _bar(self, p: dict[str, Any]) -> str:
        value, total = int(p.get("value", 0)), max(1, int(p.get("max", 1)))
        width = 24
        filled = int(width * min(1.0, value / total))
        extra = []
        text = p.get("text") or ""
        if p.get("epoch") is not None and "epoch" not in text:  # the TrainingLoop's text already says it
            extra.append(f"epoch {p['epoch']}")
        if p.get("loss") is not None:
            extra.append(f"loss {_number(p['loss']):.4f}")
        return f"{self.node} [{'#' * filled}{'.' * (width - filled)}] {value}/{total} {text} {' '.join(extra)}".rstrip()

    def _draw(self, line: str, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last_draw < self.min_interval:
            return
        self.last_draw = now
        line = safe(line)  # node names, progress texts: the graph's own text
        if self.tty:
            self.stream.write("\r\x1b[2K" + line[:160])
            self._line_open = True
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def _print(self, line: str) -> None:
        line = safe(line, lines=True)  # warnings, errors, log lines of the run
        if self._line_open:
            self.stream.write("\n")
            self._line_open = False
        self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self._line_open:
            self.stream.write("\n")
            self._line_open = False
            self.stream.flush()

    def summary(self, status: str, seconds: float | None = None, error: str | None = None,
                outputs: list[str] | None = None) -> str:
        """The closing block: status, duration, the last value of every metric, saved models and
        (``outputs``) what the output nodes showed."""
        lines = [f"run {safe(status)}" + (f" in {seconds:.1f}s" if seconds is not None else "")]
        if error:
            lines.append(f"error: {safe(error, lines=True)}")
        for name in sorted(self.metrics):
            lines.append(f"  {safe(name):<20} {self.metrics[name]:.6g}")
        lines += [f"  saved model: {safe(path)}" for path in self.saved]
        lines += [f"  {safe(line)}" for line in outputs or []]
        return "\n".join(lines)
