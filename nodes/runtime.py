"""The run context nodes talk to, and the progress adapter of docs/nodes.md.

A node never knows whether it runs inside ComfyUI's executor or ours. It calls the functions of this
module (``progress``, ``metric``, ``warn``, ``should_stop``, ``log``); they go to the active
:class:`RunContext` when our executor runs the graph, and to ComfyUI's ``ProgressBar`` /
interrupt flag when ComfyUI hosts the node (or to Python logging when neither is there).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import math
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..constants import CANVAS_METRIC_EVENT

log = logging.getLogger("xpufleet.nodes")

EmitFn = Callable[[str, dict[str, Any]], None]

# Hosted in ComfyUI, what nodes report also goes here (set by server/comfy/routes.py: the canvas run on
# the sidecar, docs/canvas-runs.md); None everywhere else.
_hosted_sink: EmitFn | None = None


def set_hosted_sink(sink: EmitFn | None) -> None:
    """Where hosted nodes' events go besides ComfyUI's own channels (None: nowhere)."""
    global _hosted_sink
    _hosted_sink = sink


def _hosted_event(type_: str, payload: dict[str, Any]) -> None:
    """A hosted node's event to the sink, with the node ComfyUI is executing; never raises into the node."""
    sink, node = _hosted_sink, hosted_node_id()
    if sink is None or node is None:
        return
    try:
        sink(type_, {"node": node, **payload})
    except Exception as exc:  # the record is a view: the node goes on without it
        log.debug("hosted event %s not recorded: %s", type_, exc)


class RunStopped(Exception):
    """Raised inside a node when a cooperative stop was requested (cancel / interrupt)."""


@dataclass
class DdpRole:
    """This process's part in ddp training (docs/ddp.md), given by the runner of a worker run with two or
    more cards of one kind: rank 0 is the run itself, ranks 1..N-1 are followers started when rank 0
    reaches its first ddp loop (``ddp_ready``)."""

    rank: int
    world_size: int
    cards: list[str]  # in-run names of the run's cards; rank k trains on cards[k]
    rendezvous: Path  # the FileStore file in the run directory (torch.distributed ``file://`` init)
    loops: frozenset[str] = frozenset()  # ids of the TrainingLoops the graph sets to ddp
    simulated: bool = False  # simulated cards (docs/architecture.md): every rank computes on the CPU, backend gloo
    # ddp across workers (docs/architecture.md): rank 0's TCPStore on its worker's advertised address
    # instead of the file; rank 0 has the host only (it opens the store on a free port).
    store_host: str | None = None
    store_port: int | None = None


@dataclass
class RunContext:
    """Everything a queued run gives its nodes.

    ``emit(type, payload)`` receives the run's events: ``node_started``, ``node_finished``,
    ``progress``, ``metric``, ``run_warning``, ``log``, ``artifact``, ... (see docs/events.md).
    ``devices`` are the run's devices by their in-run names (``cuda:0``..), ``device_aliases`` maps
    each in-run name to the machine's name for it (``cuda:0`` -> ``cuda:2``).
    """

    emit: EmitFn
    stop_event: threading.Event = field(default_factory=threading.Event)
    run_dir: Path | None = None
    run_id: str | None = None
    seed: int | None = None
    deterministic: bool = False
    devices: list[str] = field(default_factory=lambda: ["cpu"])
    device_aliases: dict[str, str] = field(default_factory=dict)
    # Where the run executes: "canvas" (ComfyUI's own Queue Prompt), "local" (sidecar child),
    # "worker" (agent child). ddp needs a worker run with >= 2 accelerator cards (docs/ddp.md).
    placement: str = "local"
    ddp_allowed: bool = False
    rank: int = 0
    world_size: int = 1
    ddp: DdpRole | None = None  # set when a ddp loop of this run may train on several cards
    # Set by the executor while a node runs, so events carry the node they came from.
    node_id: str | None = None
    class_type: str | None = None
    # Free-form facts the run records (visible_devices, device_aliases, strategy, ...).
    execution_facts: dict[str, Any] = field(default_factory=dict)
    # Simulated cards only: the run's tensor-byte meter (server/run/memory.py), which a training loop
    # may pause over its repeating steps (see pause_memory_meter). None on real cards and when hosted.
    memory_meter: Any = None

    def event(self, type_: str, payload: dict[str, Any]) -> None:
        if self.node_id is not None:
            payload = {"node": self.node_id, "class_type": self.class_type, **payload}
        self.emit(type_, payload)


_current: contextvars.ContextVar[RunContext | None] = contextvars.ContextVar("xpufleet_run", default=None)


def current() -> RunContext | None:
    """The active run context, or ``None`` when a host (ComfyUI) or plain Python calls the node."""
    return _current.get()


@contextlib.contextmanager
def use(ctx: RunContext) -> Iterator[RunContext]:
    """Make ``ctx`` the active run context for the calling thread/task."""
    token = _current.set(ctx)
    try:
        yield ctx
    finally:
        _current.reset(token)


# --- the adapter ------------------------------------------------------------------------------

class _HostedProgress:
    """ComfyUI's ProgressBar when ComfyUI hosts the node (comfy.utils is importable)."""

    def update(self, value: int, total: int) -> bool:
        # ComfyUI has imported comfy.utils long before any node runs; a lookup instead of an import
        # keeps this free (no failing import per batch) when nothing hosts us.
        utils = sys.modules.get("comfy.utils")
        if utils is None:
            return False
        mm = sys.modules.get("comfy.model_management")
        interrupt = hosted_interrupt() or ()
        # ComfyUI's progress hook raises its interrupt exception when Cancel was pressed (and clears
        # the flag). Raised from here it would end the node mid-step, before the loop writes its
        # interrupt checkpoint; so the update is skipped once a stop is pending, and a Cancel that
        # lands during the update is put back for the loop's own per-batch check to find.
        if should_stop():
            return False
        try:
            # A bar is cheap (it captures ComfyUI's current hook); making one per update keeps no
            # state that could outlive the prompt that is executing.
            utils.ProgressBar(total).update_absolute(value, total)
        except interrupt:
            with contextlib.suppress(Exception):
                mm.interrupt_current_processing(True)
            return False
        return True


_hosted = _HostedProgress()


def progress(value: int, total: int, text: str = "", **extra: Any) -> None:
    """Report progress of the current node (``value`` of ``total`` steps)."""
    ctx = current()
    if ctx is not None:
        ctx.event("progress", {"value": int(value), "max": int(total), "text": text, **extra})
        return
    _hosted.update(int(value), int(total))
    _hosted_event("progress", {"value": int(value), "max": int(total), "text": text})


def metric(name: str, value: float, **extra: Any) -> None:
    """Record a metric point (``step``, ``epoch`` go in ``extra``)."""
    ctx = current()
    if ctx is not None:
        ctx.event("metric", {"name": name, "value": float(value), **extra})
    else:
        log.debug("metric %s=%s %s", name, value, extra)
        _to_canvas(name, float(value), extra)
        if math.isfinite(float(value)):
            _hosted_event("metric", {"name": name, "value": float(value),
                                     **{k: v for k, v in extra.items() if isinstance(v, (int, float, str))}})


def _to_canvas(name: str, value: float, extra: dict[str, Any]) -> None:
    """Hosted in ComfyUI: the point to the browser that queued the prompt, as ComfyUI sends its own
    progress (``send_sync`` to its ``client_id``), for the node's live chart (docs/canvas.md)."""
    node = hosted_node_id()
    comfy_server = sys.modules.get("server")  # ComfyUI's server.py, imported long before any node runs
    instance = getattr(getattr(comfy_server, "PromptServer", None), "instance", None)
    if node is None or instance is None or not math.isfinite(value):
        return
    payload = {"node": node, "prompt_id": getattr(instance, "last_prompt_id", None), "name": name, "value": value,
               **{k: v for k, v in extra.items() if isinstance(v, (int, float, str))}}
    try:
        instance.send_sync(CANVAS_METRIC_EVENT, payload, getattr(instance, "client_id", None))
    except Exception as exc:  # the canvas chart is a view: training goes on without it
        log.debug("canvas metric not sent: %s", exc)


_shown: contextvars.ContextVar[list[dict[str, str]] | None] = contextvars.ContextVar("xpufleet_shown", default=None)


@contextlib.contextmanager
def collect_warnings() -> Iterator[list[dict[str, str]]]:
    """Keep the warnings raised in the block (``{"kind", "message"}``) so a node can show them on the
    canvas: hosted in ComfyUI there is no run event log, only the node's ``ui`` output and the log."""
    found: list[dict[str, str]] = []
    token = _shown.set(found)
    try:
        yield found
    finally:
        _shown.reset(token)


def warn(kind: str, message: str, **extra: Any) -> None:
    """A ``run_warning`` event (kind e.g. ``device_fallback``, ``ddp_not_available``)."""
    ctx = current()
    if ctx is not None:
        ctx.event("run_warning", {"kind": kind, "message": message, **extra})
    else:
        _hosted_event("run_warning", {"kind": kind, "message": message})
    shown = _shown.get()
    if shown is not None:
        shown.append({"kind": kind, "message": message})
    log.warning("%s: %s", kind, message)


def info(message: str, **extra: Any) -> None:
    """A ``log`` line in the run's event log (and Python logging)."""
    ctx = current()
    if ctx is not None:
        ctx.event("log", {"message": message, **extra})
    else:
        _hosted_event("log", {"message": message})
    log.info("%s", message)


def artifact(path: str | Path, kind: str, **extra: Any) -> None:
    """Announce a file the run produced (checkpoint, saved model, TensorBoard dir)."""
    ctx = current()
    if ctx is not None:
        ctx.event("artifact", {"path": str(path), "kind": kind, **extra})
    else:
        _hosted_event("artifact", {"path": str(path), "kind": kind})


def pause_memory_meter() -> bool:
    """Pause the simulated card's per-op tensor meter, if the run has one and it can step aside now.

    The meter sees every op through Python (docs/architecture.md, "Simulated cards"): the training loop
    lets it count the first steps of each epoch in full, where the peak is reached (parameters, gradients,
    optimizer state and activations all alive), then pauses it over the steps that repeat those
    allocations. True when paused."""
    ctx = current()
    meter = ctx.memory_meter if ctx is not None else None
    return bool(meter is not None and meter.pause())


def resume_memory_meter(live: Callable[[], Any]) -> None:
    """Resume a paused meter; ``live()`` yields the tensors that outlive the paused steps (parameters,
    gradients, optimizer state), which it counts again so the figure misses nothing kept."""
    ctx = current()
    meter = ctx.memory_meter if ctx is not None else None
    if meter is not None and meter.paused:
        meter.resume(live())


def should_stop() -> bool:
    """True when the run was asked to stop; checked by long nodes once per batch."""
    ctx = current()
    if ctx is not None:
        return ctx.stop_event.is_set()
    mm = sys.modules.get("comfy.model_management")  # present whenever ComfyUI hosts the node
    if mm is None:
        return False
    try:
        return bool(mm.processing_interrupted())
    except Exception:
        return False


def hosted_interrupt() -> type[BaseException] | None:
    """ComfyUI's ``InterruptProcessingException`` when ComfyUI hosts the node, else None.

    Its base class changed: ``Exception`` up to early 2026, ``BaseException`` since ComfyUI commit
    9949c19c (2026-04-22, so that a node's ``except Exception`` no longer swallows a Cancel). Any
    subclass of ``BaseException`` is accepted, so both sides of that change raise ComfyUI's own."""
    mm = sys.modules.get("comfy.model_management")  # present whenever ComfyUI hosts the node
    exc_type = getattr(mm, "InterruptProcessingException", None)
    return exc_type if isinstance(exc_type, type) and issubclass(exc_type, BaseException) else None


def stopped(message: str) -> BaseException:
    """The exception a node raises when it stops on request.

    Hosted in ComfyUI, that is ComfyUI's own ``InterruptProcessingException`` whatever its base class (its
    executor then reports the prompt as interrupted, not as a node error) and the interrupt flag is
    cleared, as ComfyUI's ``throw_exception_if_processing_interrupted`` does; everywhere else
    :class:`RunStopped`.
    """
    exc_type = hosted_interrupt() if current() is None else None
    if exc_type is not None:
        with contextlib.suppress(Exception):
            sys.modules["comfy.model_management"].interrupt_current_processing(False)
        return exc_type(message)
    return RunStopped(message)


def hosted_node_id() -> str | None:
    """The id of the node ComfyUI is executing right now (its ``comfy_execution.utils`` context), or None."""
    utils = sys.modules.get("comfy_execution.utils")
    get = getattr(utils, "get_executing_context", None)
    if get is None:
        return None
    try:
        found = get()
    except Exception:
        return None
    node = getattr(found, "node_id", None)
    return str(node) if node is not None else None


def run_dir() -> Path | None:
    ctx = current()
    return ctx.run_dir if ctx is not None else None
