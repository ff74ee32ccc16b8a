"""The one HTTP client of the sidecar: synchronous, standard library only, starts fast (docs/architecture.md).

The CLI, ``xpufleet predict``, the ComfyUI host's calls (in a thread) and the test harnesses use it.

It finds a same-machine sidecar through the runtime file (URL + session token) and turns answers into
Python values: ``ApiError`` for a 4xx/5xx answer (with the server's message), ``SidecarUnreachable``
when nothing answers.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..constants import EVENTS_LONG_POLL_MAX_S, home_dir
from . import tls
from .runtime_file import read_runtime, runtime_path


class SidecarUnreachable(RuntimeError):
    """No sidecar answers (not started, stopped, or the runtime file is stale)."""


class ApiError(RuntimeError):
    """The sidecar answered with an error status; ``message`` is its ``error`` text."""

    def __init__(self, status: int, message: str, body: Any = None) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message
        self.body = body


class Client:
    """``Client(url, token)``, or :meth:`from_home` for the sidecar of ``XPUFLEET_HOME``."""

    def __init__(self, url: str, token: str | None, timeout: float = 30.0, fingerprint: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.fingerprint = fingerprint  # a TLS sidecar's certificate, pinned (docs/workers.md)

    @classmethod
    def from_home(cls, home: Path | None = None, timeout: float = 30.0) -> Client:
        home = home if home is not None else home_dir()
        info = read_runtime(home)
        if info is None:
            raise SidecarUnreachable(
                f"no sidecar is running for XPUFLEET_HOME={home} (no {runtime_path(home).name}): "
                f"start one with `xpufleet start`"
            )
        return cls(info["url"], info.get("token"), timeout, info.get("tls_fingerprint"))

    # --- plumbing ---------------------------------------------------------------------------------

    def call(self, method: str, path: str, body: Any = None, params: dict[str, Any] | None = None,
             timeout: float | None = None, raw: bool = False) -> tuple[int, Any]:
        """``(HTTP status, answer)``: the JSON answer (the bytes with ``raw``), an error answer's JSON
        payload too; :class:`SidecarUnreachable` when nothing answers."""
        url = self.url + path
        if params:
            clean = {k: v for k, v in params.items() if v is not None}
            if clean:
                url += "?" + urllib.parse.urlencode(clean)
        data = None
        headers = {"Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        req = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with tls.urlopen(req, timeout or self.timeout, self.fingerprint) as resp:
                content = resp.read()
                if raw:
                    return resp.status, content
                return resp.status, (json.loads(content) if content else None)
        except urllib.error.HTTPError as exc:
            content = exc.read()
            try:
                payload = json.loads(content)
            except ValueError:
                payload = content.decode("utf-8", "replace") or exc.reason
            return exc.code, payload
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise SidecarUnreachable(f"the sidecar at {self.url} does not answer ({reason})") from None

    def request(self, method: str, path: str, body: Any = None, params: dict[str, Any] | None = None,
                timeout: float | None = None, raw: bool = False) -> Any:
        """The answer of a 2xx; :class:`ApiError` with the server's message otherwise."""
        status, answer = self.call(method, path, body, params, timeout, raw)
        if status >= 400:
            message = answer.get("error") if isinstance(answer, dict) else None
            structured = isinstance(answer, (dict, list))
            raise ApiError(status, message or (json.dumps(answer) if structured else str(answer)),
                           answer if structured else None)
        return answer

    # --- API --------------------------------------------------------------------------------------

    def health(self, timeout: float = 5.0) -> dict[str, Any]:
        return self.request("GET", "/api/health", timeout=timeout)

    def status(self) -> dict[str, Any]:
        return self.request("GET", "/api/status")

    def submit(self, graph: dict[str, Any], options: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.request("POST", "/api/runs", {"graph": graph, "options": options or {}})

    def runs(self, status: str | None = None, name: str | None = None, worker: str | None = None,
             limit: int = 50, offset: int = 0, source: str | None = None) -> dict[str, Any]:
        return self.request("GET", "/api/runs", params={"status": status, "name": name, "worker": worker,
                                                        "limit": limit, "offset": offset, "source": source})

    def run(self, run_id: str) -> dict[str, Any]:
        return self.request("GET", f"/api/runs/{urllib.parse.quote(run_id)}")

    def cancel(self, run_id: str, reason: str | None = None) -> dict[str, Any]:
        return self.request("POST", f"/api/runs/{urllib.parse.quote(run_id)}/cancel",
                            {"reason": reason} if reason else None)

    def delete(self, run_id: str) -> dict[str, Any]:
        return self.request("DELETE", f"/api/runs/{urllib.parse.quote(run_id)}")

    def events(self, run_id: str, cursor: int = 0, wait: float = 0.0, limit: int = 500) -> dict[str, Any]:
        wait = min(wait, EVENTS_LONG_POLL_MAX_S)
        return self.request("GET", f"/api/runs/{urllib.parse.quote(run_id)}/events",
                            params={"cursor": cursor, "wait": wait, "limit": limit}, timeout=wait + self.timeout)

    def metrics(self, run_id: str) -> dict[str, Any]:
        return self.request("GET", f"/api/runs/{urllib.parse.quote(run_id)}/metrics")

    def iter_events(self, run_id: str, cursor: int = 0, wait: float = 30.0) -> Iterator[dict[str, Any]]:
        """Every event from ``cursor`` on, long-polling, until the run has ended and all are read."""
        while True:
            page = self.events(run_id, cursor=cursor, wait=wait)
            yield from page["events"]
            cursor = page["cursor"]
            if page.get("done"):
                return

    def follow(self, run_id: str, on_event: Callable[[dict[str, Any]], None] | None = None,
               cursor: int = 0) -> dict[str, Any]:
        """Wait for the run to end (calling ``on_event`` for each event); return the final run."""
        for ev in self.iter_events(run_id, cursor):
            if on_event is not None:
                on_event(ev)
        return self.run(run_id)
