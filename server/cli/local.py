"""``xpufleet run GRAPH.json --local``: run a graph in this process, with no sidecar."""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ...nodes import runtime
from ...nodes.device import available_devices, parse_device
from ...nodes.types import MODEL_SAVER_NODE
from .console import ProgressView
from .text import safe

EXIT_OK, EXIT_RUN_FAILED, EXIT_USAGE = 0, 1, 2


def load_graph(path: str | Path) -> dict[str, Any]:
    """Read an API-format graph file; raise ValueError with what to fix."""
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{str(p)!r} is a directory; give the graph's JSON file (ComfyUI's API format)")
    if not p.exists():
        raise ValueError(f"graph file {str(p)!r} does not exist")
    try:
        text = p.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ValueError(f"graph file {str(p)!r} is not UTF-8 text (byte {exc.start} is {exc.object[exc.start]:#04x}); "
                         f"save it as UTF-8 JSON") from None
    except OSError as exc:
        raise ValueError(f"cannot read graph file {str(p)!r}: {exc.strerror or exc}") from None
    try:
        graph = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"graph file {str(p)!r} is not valid JSON: {exc}") from exc
    except ValueError as exc:  # an integer of more digits than Python converts
        raise ValueError(f"graph file {str(p)!r} is not usable JSON: {str(exc).split(';')[0]}") from None
    except RecursionError:
        raise ValueError(f"graph file {str(p)!r} nests too deeply to be a graph") from None
    if isinstance(graph, dict) and "prompt" in graph and isinstance(graph["prompt"], dict):
        graph = graph["prompt"]  # a saved /prompt request body
    if not isinstance(graph, dict):
        raise ValueError(f"graph file {str(p)!r} must hold a JSON object in ComfyUI's API format")
    return graph


def local_devices(requested: str | None) -> tuple[list[str], str | None]:
    """The run's single device for an in-process run, and a fallback message if it had to change."""
    offered = available_devices()
    if not requested or requested == "auto":
        accel = [d for d in offered if d != "cpu"]
        return [accel[0] if accel else "cpu"], None
    kind, index = parse_device(requested)
    want = requested if index is not None else kind
    for d in offered:
        if d == want or (index is None and d.split(":")[0] == kind):
            return [d], None
    return ["cpu"], f"--device {requested}: this machine offers {', '.join(offered)}, so the run executes on cpu"


def run_local(graph_path: str, args: Any) -> int:
    """Execute ``graph_path`` in-process; print progress and a metrics summary; return an exit code."""
    from ..run.executor import GraphValidationError, NodeExecutionError, execute_graph, format_errors

    try:
        graph = load_graph(graph_path)
        devices, fallback = local_devices(getattr(args, "device", None))
    except ValueError as exc:
        print(f"error: {safe(exc, lines=True)}", file=sys.stderr)
        return EXIT_USAGE
    chosen = getattr(args, "output_dir", None)
    out_dir = Path(chosen or Path.cwd() / "runs" / time.strftime("local-%Y%m%d-%H%M%S"))
    made_parent = not chosen and not out_dir.parent.exists()
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"error: cannot create the run folder {str(out_dir)!r} ({exc.strerror or exc}); "
              f"choose another --output-dir", file=sys.stderr)
        return EXIT_USAGE
    view = ProgressView()
    ctx = runtime.RunContext(
        emit=view.handle,
        run_dir=out_dir,
        seed=getattr(args, "seed", None),
        devices=devices,
        placement="local",
        execution_facts={"visible_devices": devices, "device_aliases": {d: d for d in devices}},
    )
    def on_sigint(signum: int, frame: Any) -> None:
        # First Ctrl-C: cooperative stop (TrainingLoop writes its interrupt checkpoint); second: abort.
        if ctx.stop_event.is_set():
            raise KeyboardInterrupt
        print("\nstopping after the current batch (Ctrl-C again to abort)", file=sys.stderr)
        ctx.stop_event.set()

    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGINT, on_sigint)
    started = time.perf_counter()
    status, error, code = "succeeded", None, EXIT_OK
    shown: list[str] = []
    with runtime.use(ctx):
        if fallback:
            runtime.warn("device_fallback", fallback)
        try:
            result = execute_graph(graph, ctx)
            shown = output_lines(graph, result.ui)
        except GraphValidationError as exc:
            view.close()
            print(safe(format_errors(exc.response), lines=True), file=sys.stderr)
            _remove_if_empty(out_dir, made_parent)
            return EXIT_USAGE
        except NodeExecutionError as exc:
            status, error, code = "failed", str(exc), EXIT_RUN_FAILED
        except runtime.RunStopped:
            status, code = "cancelled", EXIT_RUN_FAILED
        except KeyboardInterrupt:
            status, code = "cancelled", EXIT_RUN_FAILED
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
    view.close()
    print(view.summary(status, time.perf_counter() - started, error, shown))
    if not _remove_if_empty(out_dir, made_parent):  # checkpoints, TensorBoard files
        print(f"  run files: {out_dir}")
    return code


def _remove_if_empty(folder: Path, with_parent: bool = False) -> bool:
    """Remove ``folder`` (and the ``runs/`` folder made for it) when nothing was written there, so a
    run leaves no empty folders behind; True if removed."""
    try:
        folder.rmdir()
    except OSError:
        return False
    if with_parent:
        with contextlib.suppress(OSError):
            folder.parent.rmdir()
    return True


def output_lines(graph: dict[str, Any], ui: dict[str, Any]) -> list[str]:
    """What the output nodes showed (their ``ui`` text, as the canvas would), one line per text line."""
    lines: list[str] = []
    for nid, shown in ui.items():
        texts = shown.get("text") if isinstance(shown, dict) else None
        if not texts or graph[nid].get("class_type") == MODEL_SAVER_NODE:  # the path is in "saved model"
            continue
        head = f"node {nid} ({graph[nid].get('class_type')}): "
        for i, line in enumerate("\n".join(map(str, texts)).splitlines()):
            lines.append((head if i == 0 else " " * len(head)) + line)
    return lines
