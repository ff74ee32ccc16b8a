"""Restart recovery (docs/sidecar.md): what the sidecar finds of the runs it was running when it stopped.

A local run whose process is still alive (an orphan: it got EOF on stdin and is stopping) keeps its
slot until it is gone; the others end ``interrupted``, keeping a result their process wrote to
events.jsonl meanwhile. Worker runs keep their slots: the worker registry takes them over when the
agent reconnects. A canvas run (docs/canvas-runs.md) stays running while its ComfyUI process lives (the plugin
goes on reporting to the new sidecar), else it ends ``interrupted``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...common.runtime_file import pid_alive
from ...constants import LOCAL_PROVIDER

if TYPE_CHECKING:
    from .hub import EventHub
    from .store import Store


class Recovery:
    """The restart-recovery part of :class:`~.dispatcher.Dispatcher` (mixed in)."""

    store: Store
    hub: EventHub
    stop_grace_s: float
    _holdings: dict[str, tuple[str, tuple[str, ...]]]

    if TYPE_CHECKING:  # the dispatcher's own
        def _spawn(self, coro: Any) -> None: ...
        def _release(self, run_id: str) -> None: ...
        def ingest(self, run_id: str, events: Any) -> None: ...

    async def _recover(self) -> None:
        """Runs that were assigned or running here when the sidecar died end ``interrupted`` (unless
        their child recorded a result in events.jsonl first). Worker runs keep their slots: the worker
        issue takes them over when the agent reconnects."""
        for run in self.store.active():
            if run.get("source") == "canvas":  # ComfyUI runs it: it goes on reporting unless ComfyUI is gone
                pid = run["execution_facts"].get("comfy_pid")
                if not pid_alive(pid) and self.store.finish(
                        run["id"], "interrupted", error=f"ComfyUI (pid {pid}) is gone; the run's end never reached the server"):
                    self.hub.notify(run["id"])
                continue
            is_local = run["placement"] == "local" or (run["placement"] is None and run["target"] == LOCAL_PROVIDER)
            if not is_local:
                if run["worker_id"]:
                    self._holdings[run["id"]] = (run["worker_id"], tuple(run["devices"]))
                continue
            pid = run.get("pid")
            if pid and _is_runner_of(pid, run):
                # The orphaned child got EOF on stdin and is stopping; keep its slot until it is gone.
                self._holdings[run["id"]] = (LOCAL_PROVIDER, tuple(run["devices"]))
                self._spawn(self._await_orphan(run))
            else:
                self._finish_recovered(run)

    async def _await_orphan(self, run: dict[str, Any]) -> None:
        pid = int(run["pid"])
        if not await _wait_pid(pid, self.stop_grace_s):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, 9)
            await _wait_pid(pid, 5.0)
        self._finish_recovered(run)
        self._release(run["id"])

    def _finish_recovered(self, run: dict[str, Any]) -> None:
        run_id = run["id"]
        if run.get("run_dir"):
            self._import_event_log(run_id, Path(run["run_dir"]) / "events.jsonl")
        self.store.finish(
            run_id, "interrupted",
            error="the server stopped while this run was executing (it ended without reporting a result)",
        )
        self.hub.notify(run_id)

    def _import_event_log(self, run_id: str, path: Path) -> None:
        """Events the child wrote after the sidecar died (a run that finished meanwhile keeps its result)."""
        if not path.is_file():
            return
        last = self.store.last_source_seq(run_id)
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
            self.ingest(run_id, batch)


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
