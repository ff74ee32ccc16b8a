"""The warm start (docs/architecture.md): run processes forked from a pre-warmed parent instead of a new interpreter.

A cold run process spends 1.5 to 4 s on ``import torch`` and the node modules before its first node.
The standard library's forkserver keeps one parent per sidecar (or agent) that imported those once
(``preload.py``; CUDA is never initialised there) and forks a child per member on request, in
milliseconds. Each child is still a process of its own: its own session (so its process group can be
killed as one), its own environment set before any device call (``CUDA_VISIBLE_DEVICES`` /
``ZE_AFFINITY_MASK`` are read when CUDA or Level Zero initialise, which never happened in the parent),
its own random state, its own stdin, log and event pipe (passed as file descriptors with the start
request), and its own crash isolation. :class:`~.launcher.ColdStarter` stays the fallback: where
forkserver is not available, when ``XPUFLEET_WARM_START=0``, or when a warm start fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from ...constants import ENV_WARM_START, WARM_PRELOAD_MODULE
from .launcher import ColdStarter, MemberSpec, Starter, signal_process_group

log = logging.getLogger("xpufleet.launcher")

PRELOAD = (WARM_PRELOAD_MODULE,)


class PassFd:
    """A file descriptor that travels with a forkserver start request (SCM_RIGHTS), through
    multiprocessing's own ``DupFd`` reduction; it arrives in the child as a plain ``int``."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        from multiprocessing import reduction

        return _detach, (reduction.DupFd(self.fd),)


def _detach(dup: Any) -> int:
    return dup.detach()


def become_member(run_dir: str, log_fd: int, env: dict[str, str]) -> None:
    """In the forked child: become a process of its own, as a cold child would start (own session and
    process group, so stop and kill reach its DataLoader workers too; its log on stdout and stderr;
    its environment and folder; its own random state)."""
    os.setsid()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(run_dir)
    _fresh_process_state(env)


def member_main(run_dir: str, events_fd: int, stdin_fd: int, log_fd: int, env: dict[str, str]) -> None:
    """The forked child of a run: its own process, then the runner like a cold child would run it."""
    become_member(run_dir, log_fd, env)
    from .runner import run

    # Everything inherited from the warm parent (torch, the nodes: ~360 k objects) leaves the cyclic
    # collector's generations: its collections would walk them over and over during training, and write
    # to their pages (copy-on-write). Measured: 5-10 % more CPU per ddp step (docs/benchmarks.md).
    gc.freeze()

    # Never closed here: the stop watcher thread is blocked reading it, and closing a file another
    # thread reads from waits for that read forever. The process exit releases it.
    stdin = os.fdopen(stdin_fd, "r", encoding="utf-8", errors="replace")
    sys.exit(run(run_dir, events_fd, stdin=stdin))


def _fresh_process_state(env: dict[str, str]) -> None:
    """What a forked child must not inherit from the warm parent: its random state (``random`` is
    reseeded by Python at fork; numpy's and torch's global generators are not) and a thread count
    decided from the parent's environment (OpenMP read OMP_NUM_THREADS when the parent loaded it)."""
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed()
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.seed()
        threads = env.get("OMP_NUM_THREADS", "").strip()
        if threads.isdigit() and int(threads) > 0:
            torch.set_num_threads(int(threads))


class _WarmProcess:
    """A member forked by the forkserver: stdin is our pipe; the exit code comes through its sentinel."""

    def __init__(self, proc: Any, stdin_w: int) -> None:
        self.proc = proc
        self.pid = int(proc.pid)
        self._stdin_w: int | None = stdin_w
        self._returncode: int | None = None

    def send(self, data: bytes) -> None:
        if self._stdin_w is None or self._returncode is not None:
            return
        try:
            os.write(self._stdin_w, data)
        except OSError:  # the child is gone or closed its stdin
            pass

    def signal_group(self, sig: int) -> None:
        if self._returncode is None:
            signal_process_group(self.pid, sig)

    async def wait(self) -> int:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        sentinel = self.proc.sentinel
        loop.add_reader(sentinel, lambda: done.done() or done.set_result(None))
        try:
            await done
        finally:
            loop.remove_reader(sentinel)
        code = self.proc.exitcode
        self._returncode = 255 if code is None else int(code)
        if self._stdin_w is not None:
            with contextlib.suppress(OSError):
                os.close(self._stdin_w)
            self._stdin_w = None
        with contextlib.suppress(Exception):
            self.proc.close()
        return self._returncode


class WarmStarter:
    """Forks members from the sidecar's (or agent's) forkserver; see the module docstring."""

    name = "warm"

    def __init__(self, preload: tuple[str, ...] = PRELOAD) -> None:
        self._ctx = multiprocessing.get_context("forkserver")
        self._ctx.set_forkserver_preload(list(preload))
        self._lock = threading.Lock()

    def warm_up(self) -> None:
        """Start the forkserver now (blocking: seconds, the preload), so the first run starts warm."""
        from multiprocessing import forkserver

        with self._lock:
            forkserver.ensure_running()

    async def start(self, member: MemberSpec, events_fd: int) -> _WarmProcess:
        return await self.fork(member_main, f"xpufleet-run-{member.run_dir.name}-rank{member.rank}", member, events_fd)

    async def fork(self, target: Callable[..., None], name: str, member: MemberSpec, events_fd: int) -> _WarmProcess:
        """Fork ``target(run_dir, events_fd, stdin_fd, log_fd, env)`` from the forkserver as ``member``
        (runs: :func:`member_main`; the built-in model server's instances: units/starter.py)."""
        log_fd = os.open(member.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        stdin_r, stdin_w = os.pipe()
        try:
            proc = self._ctx.Process(
                target=target, name=name,
                args=(str(member.run_dir), PassFd(events_fd), PassFd(stdin_r), PassFd(log_fd), dict(member.env)),
            )
            await asyncio.to_thread(self._start, proc)
        except BaseException:
            os.close(stdin_w)
            raise
        finally:
            os.close(stdin_r)
            os.close(log_fd)
        return _WarmProcess(proc, stdin_w)

    def _start(self, proc: Any) -> None:
        with self._lock:  # one start request at a time: the forkserver serves them in order anyway
            proc.start()
        # Our members are supervised by the launcher, not by multiprocessing: it must neither join
        # nor terminate them when this process exits (a sidecar restart leaves its runs to end
        # cooperatively, as with cold children).
        multiprocessing.process._children.discard(proc)  # type: ignore[attr-defined]


_STARTER: Starter | None = None
_STARTER_LOCK = threading.Lock()


def warm_enabled() -> bool:
    """Warm starts are on unless ``XPUFLEET_WARM_START=0`` or this platform has no forkserver."""
    if os.environ.get(ENV_WARM_START, "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    return "forkserver" in multiprocessing.get_all_start_methods() and hasattr(signal, "SIGKILL")


def default_starter() -> Starter:
    """This process's starter: warm when enabled (one forkserver per process), else cold."""
    global _STARTER
    with _STARTER_LOCK:
        if _STARTER is None:
            _STARTER = WarmStarter() if warm_enabled() else ColdStarter()
        return _STARTER


async def warm_up() -> str:
    """Start the warm parent in the background (called when the sidecar or an agent starts); the
    starter's name. A failure only means cold starts, logged once."""
    starter = default_starter()
    if isinstance(starter, WarmStarter):
        try:
            await asyncio.to_thread(starter.warm_up)
        except Exception as exc:  # noqa: BLE001 - cold starts still work
            log.warning("the warm start parent did not start (%s); runs start cold", exc)
            return "cold"
    return starter.name
