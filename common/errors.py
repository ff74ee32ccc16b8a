"""The one error type a sidecar route answers with: ``{"error": message, ...extra}`` and ``status``.

Request validation (requests.py), the store, the worker registry and the route handlers raise
subclasses; ``http.errors_middleware`` turns any of them into the JSON answer (docs/sidecar.md, docs/limits.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class ApiError(Exception):
    """An answer with a 4xx/5xx ``status``; the message says what to fix."""

    def __init__(self, status: int, message: str, extra: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.extra = dict(extra or {})


class StoreError(ApiError):
    """A store operation that cannot apply (unknown run, wrong status); ``status`` is the HTTP code."""

    def __init__(self, message: str, status: int = 409) -> None:
        super().__init__(status, message)


class RequestError(ApiError):
    """A submission the server rejects with 400; ``extra`` joins the answer (e.g. ``node_errors``)."""

    def __init__(self, message: str, extra: Mapping[str, Any] | None = None, status: int = 400) -> None:
        super().__init__(status, message, extra)


def not_available(option: str, feature: str, instead: str = "leave it out") -> str:
    """The 400 text for an option whose feature is not built yet (docs/limits.md: refused, never ignored)."""
    return f"{option} is not available yet: {feature} is not built in this version; {instead}"
