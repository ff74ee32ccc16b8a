"""One SSH worker's connection (docs/workers.md): probe the host, install or update the copy, hold the tunnel.

A connection is three ssh invocations: a probe (python version, dependencies, the build installed, the
stale end of the last tunnel removed), an install when the build differs (the bundle on stdin), then the
long one: ``ssh -R DIR/agent.sock:<the sidecar's socket>`` running a script that writes the agent's
credential (sent on stdin), starts the agent if it is not running, says ``ready`` and holds the session
open. The agent dials the Unix socket on its host; sshd carries it to the sidecar's own Unix socket, so
no TCP port opens on either machine. When that ssh ends (a network drop, ``kill -9``), the agent keeps
running its runs and retries; the supervisor reconnects with a jittered backoff (about 1, 2, 4 ... 30 s) and the agent
finds the new tunnel at the same path.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from ...common.backoff import Backoff
from . import commands
from .bundle import bundle

log = logging.getLogger("xpufleet.ssh")

RECONNECT_MAX_S = 30.0
PROBE_TIMEOUT_S = 90.0
INSTALL_TIMEOUT_S = 600.0
READY_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 75.0
STDERR_KEEP = 8192


class SshStepError(RuntimeError):
    """One step of a connection failed; ``state`` is what the Workers panel shows, the text the detail."""

    def __init__(self, state: str, detail: str, retry: bool = True) -> None:
        super().__init__(detail)
        self.state = state
        self.detail = detail
        self.retry = retry


class SshSupervisor:
    """Keeps one SSH worker connected until stopped (one asyncio task)."""

    def __init__(self, name: str, target: commands.SshTarget, agent_args: list[str], credential: str,
                 tunnel_target: Callable[[], str | None], ssh_bin: str, ssh_config: str | None,
                 on_change: Callable[[], None] | None = None) -> None:
        self.name = name
        self.target = target
        self.agent_args = agent_args
        self.credential = credential
        self.tunnel_target = tunnel_target
        self.ssh_bin = ssh_bin
        self.ssh_config = ssh_config
        self.on_change = on_change
        self.state = "starting"
        self.detail = ""
        self.pid: int | None = None  # the tunnel's ssh process
        self.remote_dir: str | None = None  # absolute, once probed
        self.build: str | None = None
        self.connects = 0
        self.connected_at: float | None = None
        self._stop = asyncio.Event()
        self._proc: asyncio.subprocess.Process | None = None
        self._task: asyncio.Task[None] | None = None

    # --- life cycle --------------------------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None or self._task.done():
            self._stop.clear()
            self._task = asyncio.get_running_loop().create_task(self._loop(), name=f"xpufleet-ssh-{self.name}")

    async def stop(self) -> None:
        """End the tunnel (the agent on the host keeps running unless told to stop first)."""
        self._stop.set()
        proc = self._proc
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(self._task, 30)
        self.pid = None

    def _set(self, state: str, detail: str = "") -> None:
        if (state, detail) != (self.state, self.detail):
            log.info("SSH worker %s: %s%s", self.name, state, f": {detail}" if detail else "")
        self.state, self.detail = state, detail
        if self.on_change is not None:
            self.on_change()

    def describe(self) -> dict[str, Any]:
        return {"state": self.state, "detail": self.detail, "pid": self.pid, "remote_dir_abs": self.remote_dir,
                "build": self.build, "connects": self.connects,
                "tunnel_up_s": None if self.connected_at is None else round(time.monotonic() - self.connected_at, 1)}

    async def _loop(self) -> None:
        retry = Backoff(1.0, RECONNECT_MAX_S)
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                await self._connect_once()
                state, detail = "disconnected", "the ssh session ended"
            except SshStepError as exc:
                state, detail = exc.state, exc.detail
            except (OSError, ValueError) as exc:
                state, detail = "ssh failed", f"{type(exc).__name__}: {exc}"
            self.connected_at = None
            self.pid = None
            if self._stop.is_set():
                break
            if time.monotonic() - began > 2 * RECONNECT_MAX_S:
                retry.reset()  # it was up a while: this is a fresh drop
            wait = retry.next()
            self._set(state, f"{detail}; reconnecting in {wait:.0f} s")
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stop.wait(), wait)
        self._set("stopped", "")

    # --- one connection ---------------------------------------------------------------------------------
    def _argv(self, remote: list[str], forward: str | None = None) -> list[str]:
        return commands.ssh_argv(self.ssh_bin, self.target, self.ssh_config, remote, forward=forward)

    async def run_script(self, script: str, *args: str, stdin: bytes | None = None,
                         timeout: float = PROBE_TIMEOUT_S, state: str = "ssh failed") -> dict[str, Any]:
        """Run one script on the host; its last stdout line, parsed as JSON."""
        argv = self._argv(commands.script_command(self.target, script, *args))
        proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.PIPE,
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            out, err = await asyncio.wait_for(proc.communicate(stdin or b""), timeout)
        except asyncio.TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise SshStepError(state, f"ssh {self.target.target} did not answer within {timeout:g} s") from None
        text = err.decode(errors="replace")
        lines = [ln for ln in out.decode(errors="replace").splitlines() if ln.strip()]
        if proc.returncode == 255 or not lines:
            raise SshStepError(state, commands.ssh_failure(proc.returncode or 0, text))
        try:
            result = json.loads(lines[-1])
        except ValueError:
            raise SshStepError(state, f"unexpected answer from the host: {lines[-1][:300]}") from None
        if proc.returncode != 0 and not isinstance(result, dict):
            raise SshStepError(state, commands.ssh_failure(proc.returncode or 0, text))
        return result

    async def _connect_once(self) -> None:
        t = self.target
        self._set("connecting", f"ssh {t.target}" + (f" -p {t.port}" if t.port else ""))
        probe = await self.run_script(commands.PROBE, t.remote_dir, self.name,
                                      json.dumps(list(commands.REQUIRED_MODULES)))
        self.remote_dir = probe.get("dir")
        if probe.get("foreign"):
            raise SshStepError("cannot use the host", f"{probe['dir']} exists and is not this SSH worker's folder: "
                                                      f"choose another --remote-dir")
        if not probe.get("python_ok"):
            raise SshStepError("cannot use the host", f"{t.python} on the host is Python {probe.get('python')}; "
                                                      f"xpufleet needs 3.10 or later (pass --python)")
        if probe.get("missing"):
            raise SshStepError("cannot use the host", f"{t.python} on the host lacks {', '.join(probe['missing'])}: "
                                                      f"install xpufleet's dependencies there (or pass --python)")
        build, data = bundle()
        if probe.get("build") != build:
            self._set("installing", f"xpufleet {build} into {probe['dir']}"
                                    + (f" (replacing {probe['build']})" if probe.get("build") else ""))
            done = await self.run_script(commands.INSTALL, t.remote_dir, self.name, build, t.python, stdin=data,
                                         timeout=INSTALL_TIMEOUT_S, state="install failed")
            if not done.get("ok"):
                raise SshStepError("install failed", str(done.get("error")))
        self.build = build
        local = self.tunnel_target()
        if local is None:
            raise SshStepError("no tunnel end", "the sidecar has no agent socket and serves TLS on its port: "
                                                "see the sidecar's log", retry=True)
        try:
            forward = commands.forward_spec(str(probe.get("dir")), local)
        except commands.SshConfigError as exc:
            raise SshStepError("cannot use the host", str(exc)) from None
        await self._tunnel(forward)

    async def _tunnel(self, forward: str) -> None:
        t = self.target
        argv = self._argv(commands.script_command(t, commands.START, t.remote_dir, self.name), forward=forward)
        self._set("opening the tunnel", forward.split(":", 1)[0])
        proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.PIPE,
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        self._proc, self.pid = proc, proc.pid
        err = bytearray()

        async def drain_stderr() -> None:
            assert proc.stderr is not None
            while chunk := await proc.stderr.read(4096):
                err.extend(chunk)
                del err[:-STDERR_KEEP]

        stderr_task = asyncio.get_running_loop().create_task(drain_stderr())
        try:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(json.dumps({"credential": self.credential, "args": self.agent_args}).encode() + b"\n")
            with contextlib.suppress(ConnectionError):
                await proc.stdin.drain()

            async def wait_ready() -> str:
                said = ""
                while True:
                    line = (await proc.stdout.readline()).decode(errors="replace").strip()
                    if not line:
                        raise SshStepError("tunnel failed", commands.ssh_failure(await proc.wait(),
                                                                                err.decode(errors="replace")))
                    if line == "ready":
                        return said
                    said = line

            try:
                agent_line = await asyncio.wait_for(wait_ready(), READY_TIMEOUT_S)
            except asyncio.TimeoutError:
                raise SshStepError("tunnel failed",
                                   f"the host did not start the agent within {READY_TIMEOUT_S:g} s") from None
            self.connects += 1
            self.connected_at = time.monotonic()
            self._set("tunnel up", f"{agent_line}; ssh pid {proc.pid}")
            stop = asyncio.get_running_loop().create_task(self._stop.wait())
            ended = asyncio.get_running_loop().create_task(proc.wait())
            await asyncio.wait({stop, ended}, return_when=asyncio.FIRST_COMPLETED)
            stop.cancel()
            if not ended.done():
                with contextlib.suppress(ProcessLookupError):
                    proc.terminate()
            rc = await ended
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stderr_task, 5)
            if not self._stop.is_set():
                raise SshStepError("ssh connection lost", commands.ssh_failure(rc, err.decode(errors="replace"))
                                   if rc == 255 else f"ssh exited with code {rc}")
        finally:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
            stderr_task.cancel()
            self._proc = None
