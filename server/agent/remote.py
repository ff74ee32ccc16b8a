"""What an agent does for the remote-worker features: serve the outputs its runs recorded (docs/workers.md),
and tell a server whose TLS certificate it refused that it did. Two components of
:class:`~.agent.Agent`, each with its own state and explicit dependencies."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from ...common import tls
from ...constants import VERSION
from ..workers import protocol
from .config import AuthChoice, ws_url
from .files import OutputsUnavailable, read_output_chunk

log = logging.getLogger("xpufleet.agent")


class RefusalReporter:
    """Tells a server (once per certificate seen) that this agent refused its certificate, so it shows
    under "Rejected connections" there."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.reported: set[str] = set()  # fingerprints already reported

    async def report(self, auth: AuthChoice, seen: bytes) -> None:
        """The message holds the agent's name and the two fingerprints, no secret: the connection is not
        trusted, so no credential is ever sent on it."""
        import aiohttp

        seen_text = tls.fingerprint_of_hex(seen.hex())
        if seen_text in self.reported:
            return
        self.reported.add(seen_text)
        timeout = aiohttp.ClientTimeout(total=10)
        with contextlib.suppress(aiohttp.ClientError, OSError, asyncio.TimeoutError, ValueError):
            async with aiohttp.ClientSession(timeout=timeout) as session:
                async with session.ws_connect(ws_url(auth.url), ssl=False) as ws:
                    await ws.send_str(protocol.encode(
                        "refused_server", name=self.name, version=VERSION,
                        pinned=tls.normalize_fingerprint(auth.fingerprint or "0" * 64), seen=seen_text))
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(ws.receive(), 5)


class OutputsServer:
    """Answers ``read_outputs``: a chunk of a file a run recorded here (record_outputs, docs/workers.md), of
    its run folder or of that folder's listing (``scope``, agent/files.py)."""

    def __init__(self, worker: str, run_dir: Callable[[str], Path], send: Callable[[str], Awaitable[bool]]) -> None:
        self.worker = worker
        self.run_dir = run_dir
        self.send = send

    async def serve(self, msg: dict[str, Any]) -> None:
        """Read the chunk off the loop and send ``outputs_data`` (ok, or the reason it is unavailable)."""
        rid = msg["request_id"]
        try:
            data, size, eof = await asyncio.to_thread(
                read_output_chunk, self.run_dir(msg["run_id"]), msg["run_id"], msg["file"], msg["offset"],
                msg["length"], self.worker, msg.get("scope") or "outputs")
            frame = protocol.encode("outputs_data", request_id=rid, ok=True, size=size, offset=msg["offset"],
                                    data=base64.b64encode(data).decode("ascii"), eof=eof)
        except OutputsUnavailable as exc:
            frame = protocol.encode("outputs_data", request_id=rid, ok=False, error=str(exc), status=exc.status)
        await self.send(frame)
