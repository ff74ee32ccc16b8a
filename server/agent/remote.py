"""What an agent does for the remote-worker features (mixed into :class:`~.agent.Agent`): serve the outputs
its runs recorded (docs/workers.md), exit once a one-shot agent's run is reported (W8), and tell a server whose TLS
certificate it refused that it did (S3)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
from typing import TYPE_CHECKING, Any

from ...common import tls
from ...constants import VERSION
from ..workers import protocol
from .config import AuthChoice, ws_url
from .files import OutputsUnavailable, read_output_chunk

if TYPE_CHECKING:
    from .agent import RunState

log = logging.getLogger("xpufleet.agent")


class RemoteFeatures:
    """Remote-worker parts of the agent; the attributes are the :class:`~.agent.Agent`'s."""

    cfg: Any
    runs: dict[str, Any]
    stopping: asyncio.Event
    took_run: str | None
    _refusals_reported: set[str]
    _tasks: set[asyncio.Task[Any]]

    async def _report_refusal(self, auth: AuthChoice, seen: bytes) -> None:
        """Tell the server (once per certificate seen) that this agent refused its certificate, so it
        shows under "Rejected connections" there. The message holds the agent's name and the two
        fingerprints, no secret: the connection is not trusted, so no credential is ever sent on it."""
        import aiohttp

        seen_text = tls.fingerprint_of_hex(seen.hex())
        if seen_text in self._refusals_reported:
            return
        self._refusals_reported.add(seen_text)
        timeout = aiohttp.ClientTimeout(total=10)
        with contextlib.suppress(aiohttp.ClientError, OSError, asyncio.TimeoutError, ValueError):
            async with aiohttp.ClientSession(timeout=timeout) as session:
                async with session.ws_connect(ws_url(auth.url), ssl=False) as ws:
                    await ws.send_str(protocol.encode(
                        "refused_server", name=self.cfg.name, version=VERSION,
                        pinned=tls.normalize_fingerprint(auth.fingerprint or "0" * 64), seen=seen_text))
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(ws.receive(), 5)

    def _done_with(self, rs: RunState) -> None:
        """The server holds everything of a finished run: forget it; a one-shot agent then exits."""
        self.runs.pop(rs.run_id, None)
        if self.cfg.one_shot and self.took_run is not None and not self.runs:
            log.info("one-shot agent: run %s ended and is reported; exiting", self.took_run)
            self.stopping.set()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve_outputs(self, msg: dict[str, Any]) -> None:
        """Answer ``read_outputs``: a chunk of a file the run recorded here (record_outputs, docs/workers.md), or
        of its run folder or that folder's listing (``scope``, agent/files.py)."""
        rid = msg["request_id"]
        try:
            data, size, eof = await asyncio.to_thread(
                read_output_chunk, self._run_dir(msg["run_id"]), msg["run_id"], msg["file"], msg["offset"],
                msg["length"], self.cfg.name, msg.get("scope") or "outputs")
            frame = protocol.encode("outputs_data", request_id=rid, ok=True, size=size, offset=msg["offset"],
                                    data=base64.b64encode(data).decode("ascii"), eof=eof)
        except OutputsUnavailable as exc:
            frame = protocol.encode("outputs_data", request_id=rid, ok=False, error=str(exc), status=exc.status)
        await self._send(frame)
