"""The run process: ``python -m xpufleet.server.run.runner RUN_DIR [--events-fd N]`` (cold), or the same
:func:`run` called in a child forked from the warm parent (warm.py). Started by the launcher
(launcher.py) for the sidecar (target ``local``) and for worker agents alike.

One queued run = one process (a group of processes for ddp ranks), so a crash or an out-of-memory kill
ends that run only (docs/sidecar.md, docs/workers.md). The parent writes ``RUN_DIR/spec.json`` (:class:`~.spec.RunSpec`) and
starts this with the run's environment, stdin a pipe, stdout and stderr to the member's log, and the
write end of a pipe as the events fd.

Events are JSON lines ``{"seq", "type", "payload", "ts"}`` (``seq`` from 1, per run; events.py) written
to the events fd and appended to ``RUN_DIR/events.jsonl`` (so a parent that died can recover what the
run reported). The last event is always ``run_finished`` ``{"status", "error", "final_metrics",
"peak_memory", "execution_facts"}`` (plus ``validation`` for a graph that failed validation, and
``out_of_memory`` {device, budget_gib, simulated} when the run failed for lack of memory: the server then
says where the budget came from). On simulated cards the run's tensor bytes are counted (and capped to
``budget_gib``): see :mod:`.memory`.

ddp (docs/ddp.md, server/run/ddp.py): a follower rank runs this same module on the same run directory with
``XPUFLEET_DDP_RANK=k`` set: it executes only the ddp loops and the nodes feeding them, writes its events
to ``ddp/events-rank<k>.jsonl`` (the launcher reads its pipe; the run's own events.jsonl is rank 0's),
and its ``run_finished`` carries ``ddp_peer_lost`` when its loop failed only because another rank went
away. Rank 0 of a ddp run refuses, before any node runs, a graph with ddp loops on parallel branches.

stdin commands: ``stop`` = cancel (cooperative: TrainingLoop writes its interrupt checkpoint; the run
ends ``cancelled``); ``interrupt`` = the parent is shutting down (same stop; the run ends
``interrupted``). End of file on stdin means the parent is gone: the run stops and ends ``interrupted``.
The exit code is 0 when the run succeeded, 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import socket
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

from ...constants import CUBLAS_WORKSPACE_CONFIG_DETERMINISTIC, RUN_KIND_COMFYUI, VERSION, WARM_PRELOAD_MODULE
from . import ddp, spread
from .events import EventSink
from .memory import apply_memory_budget, is_out_of_memory, peak_memory, simulated_card_memory
from .outputs import OutputRecorder, record_mode
from .spec import SPEC_FILENAME, RunSpec


class StopWatcher(threading.Thread):
    """Reads stdin: ``stop`` -> cancel, ``interrupt`` -> interrupted, EOF -> parent gone (interrupted)."""

    def __init__(self, stop_event: threading.Event, stream: Any = None) -> None:
        super().__init__(name="xpufleet-stop-watcher", daemon=True)
        self.stop_event = stop_event
        self.stream = stream if stream is not None else _own_stdin()
        self.reason: str | None = None

    def run(self) -> None:
        try:
            for line in self.stream:
                cmd = line.strip().lower()
                if cmd == "stop":
                    self.request_stop("cancel")
                elif cmd == "interrupt":
                    self.request_stop("interrupt")
        except (OSError, ValueError):
            pass
        self.request_stop("parent_gone")

    # Not `_stop`: threading.Thread has its own, which Python calls on every other thread after a
    # fork (DataLoader workers fork): overriding it broke every run with num_workers > 0 (a hang).
    def request_stop(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
        self.stop_event.set()


def _own_stdin() -> Any:
    """stdin as a file object of this thread's own (a dup of fd 0). A process forked while the
    watcher blocks in a read of ``sys.stdin`` (a DataLoader worker) closes ``sys.stdin`` first thing,
    and would wait forever for the lock of a read that never ends in it."""
    try:
        return os.fdopen(os.dup(sys.stdin.fileno()), "r", encoding="utf-8", errors="replace")
    except (AttributeError, OSError, ValueError):  # no real stdin (tests, embedded)
        return sys.stdin


STOP_ERRORS = {
    "cancel": None,
    "interrupt": "the server was stopped while this run was executing",
    "parent_gone": "the process that started this run went away (server or agent stopped)",
}


def frozen_objects() -> int:
    """How many objects a warm start froze: the warm parent's count after its preload (preload.py), taken
    once there, since counting them in each child costs 40 ms of its start; 0 in a cold process."""
    return int(getattr(sys.modules.get(WARM_PRELOAD_MODULE), "OBJECTS", 0))


def base_facts(spec: dict[str, Any]) -> dict[str, Any]:
    """Facts recorded for every run (docs/sidecar.md: visible_devices, device_aliases)."""
    facts: dict[str, Any] = dict(spec.get("execution_facts") or {})
    devices = list(spec.get("devices") or ["cpu"])
    facts.setdefault("visible_devices", devices)
    facts.setdefault("device_aliases", dict(spec.get("device_aliases") or {d: d for d in devices}))
    facts.setdefault("placement", spec.get("placement", "local"))
    if spec.get("simulated"):
        facts.setdefault("simulated_devices", True)
    facts.update({
        "pid": os.getpid(),
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
        "xpufleet": VERSION,
        # a warm start's inherited objects, frozen out of the cyclic collector (warm.py): 0 when cold
        "gc_frozen_objects": frozen_objects(),
    })
    for var in ("CUDA_VISIBLE_DEVICES", "ZE_AFFINITY_MASK"):
        if var in os.environ:
            facts.setdefault("env", {})[var] = os.environ[var]
    return facts


def run(run_dir: Path, events_fd: int | None = None, stdin: Any = None) -> int:
    """Execute the run described by ``run_dir/spec.json``; return the exit code."""
    run_dir = Path(run_dir)
    rank = ddp.follower_rank(os.environ)
    pipe = os.fdopen(events_fd, "wb", buffering=0) if events_fd is not None else None
    events_path = run_dir / "events.jsonl" if rank == 0 else ddp.follower_events_path(run_dir, rank)
    events_path.parent.mkdir(parents=True, exist_ok=True)
    sink = EventSink(pipe, events_path, console=sys.stdout)
    status, error, extra = "failed", None, {}
    facts: dict[str, Any] = {}
    tracker: Any = None
    devices: list[str] = []
    try:
        spec = RunSpec.read(run_dir).to_json()
        for key, value in (spec.get("env") or {}).items():
            os.environ.setdefault(str(key), str(value))
        facts = base_facts(spec)
        if spec.get("kind") == RUN_KIND_COMFYUI:  # a ComfyUI on the run's cards executes it (comfy_client.py)
            status, error, extra = _execute_comfy(spec, run_dir, sink, facts, stdin)
            return _finish(sink, status, error, extra, facts, None, [])
        role = spread.role_for(spec, run_dir, rank, os.environ) if spec.get("spread") else \
            ddp.role_for(spec, run_dir, rank)
        if rank and role is None:
            raise RuntimeError(f"this process is ddp rank {rank}, but the run has no ddp loop to train")
        apply_memory_budget(spec, facts, role)
        # A ddp rank's memory is its own card's (rank k on cards[k]).
        devices = [role.cards[rank]] if role is not None else list(spec.get("devices") or [])
        tracker = _simulated_tracker(spec, facts, devices)
        status, error, extra = _execute(spec, run_dir, sink, facts, stdin, tracker, role)
    except Exception as exc:  # noqa: BLE001 - spec unreadable: still end with run_finished
        traceback.print_exc()
        status, error = "failed", f"the run could not start: {type(exc).__name__}: {exc}"
    except BaseException:
        _finish(sink, status, error, extra, facts, tracker, devices)
        raise
    return _finish(sink, status, error, extra, facts, tracker, devices)


def _finish(sink: EventSink, status: str, error: str | None, extra: dict[str, Any], facts: dict[str, Any],
            tracker: Any, devices: list[str]) -> int:
    """The last event, ``run_finished``; the exit code."""
    payload = {"status": status, "error": error, "final_metrics": dict(sink.final_metrics),
               "peak_memory": peak_memory(tracker, devices), "execution_facts": facts, **extra}
    sink.emit("run_finished", payload)
    sink.close()
    code = 0 if status == "succeeded" else 1
    _leave_ddp(code, bool(extra.get("ddp_peer_lost")))
    return code


def _execute_comfy(spec: dict[str, Any], run_dir: Path, sink: EventSink, facts: dict[str, Any],
                   stdin: Any) -> tuple[str, str | None, dict[str, Any]]:
    """A ``comfyui`` run: its prompt on the host's warm ComfyUI (no torch in this process)."""
    from .comfy_client import run_comfy

    stop_event = threading.Event()
    watcher = StopWatcher(stop_event, stdin)
    watcher.start()
    try:
        return run_comfy(spec, run_dir, sink.emit, facts, stop_event, lambda: _stopped(watcher))
    except Exception as exc:  # noqa: BLE001 - reported, never a silent death
        traceback.print_exc()
        return "failed", f"{type(exc).__name__}: {exc}", {}


def _leave_ddp(code: int, peer_lost: bool) -> None:
    """A ddp rank leaves its process group; one whose peer died exits at once, since gloo's and NCCL's
    threads can abort the interpreter's shutdown over the broken connections (its result is out)."""
    if "torch.distributed" not in sys.modules:
        return
    if peer_lost:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)
    from ...nodes.ddp import shutdown

    shutdown()


def _simulated_tracker(spec: dict[str, Any], facts: dict[str, Any], devices: list[str]) -> Any:
    """On simulated CUDA cards: count the run's tensor bytes, capped to the budget (a simulated cap)."""
    cuda = [d for d in devices if d.startswith("cuda")]
    if not spec.get("simulated") or not cuda:
        return None
    budget = spec.get("budget_gib")
    machine = (spec.get("device_aliases") or {}).get(cuda[0], cuda[0])
    if budget is not None:
        facts["simulated_cap"] = {"budget_gib": budget, "device": machine,
                                  "counts": "tensor storage the run holds on the CPU (simulated card)"}
    return simulated_card_memory(budget, machine)


def _execute(spec: dict[str, Any], run_dir: Path, sink: EventSink, facts: dict[str, Any],
             stdin: Any, tracker: Any = None, role: Any = None) -> tuple[str, str | None, dict[str, Any]]:
    from ...nodes import runtime
    from ...nodes.ddp import DdpPeerLost
    from .executor import GraphValidationError, NodeExecutionError, execute_graph, format_errors

    options = dict(spec.get("options") or {})
    rank = role.rank if role is not None else 0
    devices = ddp.rank_devices(list(spec.get("devices") or ["cpu"]), role)
    aliases = dict(spec.get("device_aliases") or {d: d for d in devices})
    placement = spec.get("placement", "local")
    graph = spec["graph"] if rank == 0 else ddp.follower_graph(spec["graph"])
    stop_event = threading.Event()
    watcher = StopWatcher(stop_event, stdin)
    watcher.start()
    deterministic = bool(options.get("deterministic", False))
    if deterministic:  # before any CUDA call: cuBLAS reads it when it makes its first handle
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE_CONFIG_DETERMINISTIC)
        facts["cublas_workspace_config"] = os.environ["CUBLAS_WORKSPACE_CONFIG"]
    seed = options.get("seed")
    if seed is not None:
        import random

        random.seed(int(seed) + rank)  # rank k: the run's seed + k (the TrainingLoop does the same)
    ctx = runtime.RunContext(
        emit=sink.emit,
        stop_event=stop_event,
        run_dir=run_dir,
        run_id=spec.get("run_id"),
        seed=None if seed is None else int(seed),
        deterministic=deterministic,
        devices=devices,
        device_aliases=aliases,
        placement=placement,
        ddp_allowed=role is not None,
        rank=rank,
        world_size=role.world_size if role is not None else 1,
        ddp=role,
        execution_facts=facts,
        memory_meter=tracker,
    )
    sink.emit("run_started", {"run_id": spec.get("run_id"), "pid": os.getpid(), "devices": devices,
                              "device_aliases": aliases, "placement": placement,
                              **({"ddp_rank": rank} if role is not None else {})})
    recorder = recorder_for(spec, run_dir, sink) if rank == 0 else None  # rank 0 speaks for the run
    try:
        parallel = ddp.parallel_loops_error(graph) if role is not None else None
        if parallel is not None:
            raise parallel
        with runtime.use(ctx), (tracker if tracker is not None else contextlib.nullcontext()):
            execute_graph(graph, ctx, on_outputs=recorder.record if recorder is not None else None)
    except GraphValidationError as exc:
        return "failed", "the graph failed validation: " + format_errors(exc.response), {"validation": exc.response}
    except NodeExecutionError as exc:
        if exc.node_id not in sink.node_errors:
            sink.emit("node_error", {"node": exc.node_id, "class_type": exc.class_type, "message": str(exc),
                                     "traceback": exc.traceback})
        if isinstance(exc.original, runtime.RunStopped):
            return _stopped(watcher)
        if is_out_of_memory(exc.original):
            return "failed", str(exc), {"out_of_memory": _oom_facts({**spec, "devices": devices}, tracker)}
        return "failed", str(exc), ({"ddp_peer_lost": True} if isinstance(exc.original, DdpPeerLost) else {})
    except runtime.RunStopped:
        return _stopped(watcher)
    except Exception as exc:  # noqa: BLE001 - anything else is still reported, never a silent death
        traceback.print_exc()
        return "failed", f"{type(exc).__name__}: {exc}", {}
    finally:
        if recorder is not None:
            sink.emit("outputs_recorded", recorder.finish())
    # A stop that came after the last stop check changes nothing: the graph finished, it succeeded.
    return "succeeded", None, {}


def recorder_for(spec: dict[str, Any], run_dir: Path, sink: EventSink) -> OutputRecorder | None:
    """The run's output recorder when ``options.record_outputs`` asks for one (docs/workers.md)."""
    mode = record_mode(spec.get("options") or {})
    if mode is None:
        return None
    return OutputRecorder(run_dir, spec.get("run_id"), mode,
                          warn=lambda kind, message: sink.emit("run_warning", {"kind": kind, "message": message}))


def _oom_facts(spec: dict[str, Any], tracker: Any) -> dict[str, Any]:
    """Which card ran out of memory (the machine's name for it) under which budget."""
    cuda = [d for d in (spec.get("devices") or []) if d.startswith(("cuda", "mps", "xpu"))]
    first = cuda[0] if cuda else "cuda:0"
    return {"device": (spec.get("device_aliases") or {}).get(first, first), "budget_gib": spec.get("budget_gib"),
            "simulated": tracker is not None}


def _stopped(watcher: StopWatcher) -> tuple[str, str | None, dict[str, Any]]:
    reason = watcher.reason or "cancel"
    if reason == "cancel":
        return "cancelled", "cancelled by request", {}
    return "interrupted", STOP_ERRORS[reason], {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m xpufleet.server.run.runner",
                                     description="Execute one queued run (started by the sidecar or an agent).")
    parser.add_argument("run_dir", type=Path, help="the run directory holding spec.json")
    parser.add_argument("--events-fd", type=int, default=None, help="file descriptor to write events to")
    args = parser.parse_args(argv)
    if not (args.run_dir / SPEC_FILENAME).is_file():
        parser.error(f"{args.run_dir / SPEC_FILENAME} does not exist")
    return run(args.run_dir, args.events_fd)


if __name__ == "__main__":
    sys.exit(main())
