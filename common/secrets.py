"""Random secrets: tokens, credentials, one-time join keys (one generator for all of them)."""

from __future__ import annotations

import secrets


def new_secret(prefix: str, nbytes: int = 32) -> str:
    """A fresh secret, ``<prefix>_<urlsafe base64>``. The prefix says what kind of secret a leaked
    string is, and keeps it from starting with ``-``, which a command line (``--join TOKEN``) would
    take for an option."""
    return f"{prefix}_{secrets.token_urlsafe(nbytes)}"
