"""Restart recovery (docs/sidecar.md): what the sidecar finds of the runs it was running when it stopped.

A local run whose process is still alive (an orphan: it got EOF on stdin and is stopping) keeps its
slot until it is gone; the others end ``interrupted``, keeping a result their process wrote to
events.jsonl meanwhile. Worker runs keep their slots: the worker registry takes them over when the
agent reconnects. A canvas run (docs/canvas-runs.md) stays running while its ComfyUI process lives (the plugin
goes on reporting to the new sidecar), else it ends ``interrupted``; from then on a watch checks every
``CANVAS_WATCH_S`` that each running canvas run's ComfyUI lives (else ``interrupted``), and ends
``cancelled`` one whose cancel ComfyUI has not confirmed within ``CANVAS_CANCEL_GRACE_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any

from ...constants import CANVAS_CANCEL_GRACE_S, CANVAS_WATCH_S, LOCAL_PROVIDER
from .canvas_liveness import comfy_alive
from .providers import RunHost
from .slots import SlotBook


class Recovery:
    """What the sidecar finds at start of the runs it was running (see the module docstring).

    ``store``: the runs; ``slots``: where surviving runs keep their slots; ``events``: the run-events
    interface a recovered child's late events go through; ``release(run_id)``: the dispatcher frees an
    orphan's slot once it is gone; ``spawn``: background tasks; ``notify(run_id)``: the run's watchers."""

    def __init__(self, store: Any, slots: SlotBook, events: RunHost, release: Callable[[str], None],
                 spawn: Callable[[Coroutine[Any, Any, Any]], None], notify: Callable[[str], None],
                 stop_grace_s: float) -> None:
        self._store = store
        self._slots = slots
        self._events = events
        self._release = release
        self._spawn = spawn
        self._notify = notify
        self._stop_grace_s = stop_grace_s

    async def recover(self) -> None:
        """Runs that were assigned or running here when the sidecar died end ``interrupted`` (unless
        their child recorded a result in events.jsonl first). Worker runs keep their slots: the worker
        issue takes them over when the agent reconnects."""
        for run in self._store.active():
            if run.get("source") == "canvas":  # ComfyUI runs it: it goes on reporting unless ComfyUI is gone
                self._end_if_gone(run)
                continue
            is_local = run["placement"] == "local" or (run["placement"] is None and run["target"] == LOCAL_PROVIDER)
            if not is_local:
                if run["worker_id"]:
                    self._slots.holdings[run["id"]] = (run["worker_id"], tuple(run["devices"]))
                continue
            pid = run.get("pid")
            if pid and _is_runner_of(pid, run):
                # The orphaned child got EOF on stdin and is stopping; keep its slot until it is gone.
                self._slots.holdings[run["id"]] = (LOCAL_PROVIDER, tuple(run["devices"]))
                self._spawn(self._await_orphan(run))
            else:
                self._finish_recovered(run)

        self._spawn(self._watch_canvas())

    def _end_if_gone(self, run: dict[str, Any]) -> bool:
        if comfy_alive(run["execution_facts"]):
            return False
        pid = run["execution_facts"].get("comfy_pid")
        if self._store.finish(run["id"], "interrupted",
                              error=f"ComfyUI (pid {pid}) is gone; the run's end never reached the server"):
            self._notify(run["id"])
        return True

    def running_canvas(self) -> list[dict[str, Any]]:
        """The running canvas runs (reads the store, whose lock a big write may hold: call it off the loop)."""
        return self._store.list_runs(statuses=["running"], source="canvas", limit=1000)[0]

    def check_canvas(self, cancels: dict[str, float], running: list[dict[str, Any]]) -> None:
        """One pass of the watch over ``running`` (:meth:`running_canvas`): runs whose ComfyUI is gone end
        ``interrupted``; those whose cancel was asked ``CANVAS_CANCEL_GRACE_S`` ago (first seen by
        ``cancels``: run id -> monotonic) and that ComfyUI has not ended end ``cancelled``."""
        now = time.monotonic()
        for run in running:
            if self._end_if_gone(run) or not run["cancel_requested"]:
                continue
            if now - cancels.setdefault(run["id"], now) >= CANVAS_CANCEL_GRACE_S and self._store.finish(
                    run["id"], "cancelled", error=f"cancelled; ComfyUI did not confirm within "
                                                  f"{CANVAS_CANCEL_GRACE_S:g} s, so the sidecar ended the run"):
                self._notify(run["id"])
        alive = {r["id"] for r in running}
        for run_id in [r for r in cancels if r not in alive]:
            del cancels[run_id]

    async def _watch_canvas(self) -> None:
        cancels: dict[str, float] = {}
        while True:
            await asyncio.sleep(CANVAS_WATCH_S)
            # off the loop: a sweep's thousands of inserts hold the store's lock for a second or more
            running = await asyncio.to_thread(self.running_canvas)
            if running or cancels:
                self.check_canvas(cancels, running)

    async def _await_orphan(self, run: dict[str, Any]) -> None:
        pid = int(run["pid"])
        if not await _wait_pid(pid, self._stop_grace_s):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, 9)
            await _wait_pid(pid, 5.0)
        self._finish_recovered(run)
        self._release(run["id"])

    def _finish_recovered(self, run: dict[str, Any]) -> None:
        run_id = run["id"]
        if run.get("run_dir"):
            self._import_event_log(run_id, Path(run["run_dir"]) / "events.jsonl")
        self._store.finish(
            run_id, "interrupted",
            error="the server stopped while this run was executing (it ended without reporting a result)",
        )
        self._notify(run_id)

    def _import_event_log(self, run_id: str, path: Path) -> None:
        """Events the child wrote after the sidecar died (a run that finished meanwhile keeps its result)."""
        if not path.is_file():
            return
        last = self._store.last_source_seq(run_id)
        batch: list[dict[str, Any]] = []
        with open(path, "rb") as f:
            for line in f:
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue  # a torn last line
                if isinstance(ev, dict) and isinstance(ev.get("seq"), int) and ev["seq"] > last:
                    batch.append(ev)
        if batch:
            self._events.ingest(run_id, batch)


def _is_runner_of(pid: int, run: Mapping[str, Any]) -> bool:
    """True when ``pid`` is alive and is a process of ``run`` (not a reused pid): a run process, cold
    or forked warm, works in its run directory."""
    try:
        import psutil

        cwd = psutil.Process(pid).cwd()
    except Exception:  # noqa: BLE001 - gone, no access, or psutil missing: not ours
        return False
    return bool(run.get("run_dir")) and Path(cwd).resolve() == Path(run["run_dir"]).resolve()


async def _wait_pid(pid: int, timeout: float) -> bool:
    """Wait for an unrelated process to exit (pidfd on Linux: no polling); True when it is gone."""
    loop = asyncio.get_running_loop()
    try:
        fd = os.pidfd_open(pid)  # type: ignore[attr-defined]
    except (AttributeError, OSError):
        fd = None
    if fd is not None:
        done = loop.create_future()
        loop.add_reader(fd, lambda: done.done() or done.set_result(None))
        try:
            await asyncio.wait_for(done, timeout)
            return True
        except asyncio.TimeoutError:
            return False
        finally:
            loop.remove_reader(fd)
            os.close(fd)
    try:
        import psutil

        await asyncio.to_thread(psutil.Process(pid).wait, timeout)
        return True
    except Exception:  # noqa: BLE001 - gone already (NoSuchProcess) or timed out
        try:
            import psutil

            return not psutil.pid_exists(pid)
        except ImportError:
            return True
