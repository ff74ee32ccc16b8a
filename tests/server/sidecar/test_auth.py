"""Secrets are safe to pass on a command line (`--join TOKEN`) and say what they are."""

from __future__ import annotations

import argparse

from xpufleet.common.secrets import new_secret
from xpufleet.server.sidecar import auth


def test_secrets_never_look_like_an_option():
    parser = argparse.ArgumentParser()
    parser.add_argument("--join")
    for prefix in ("xfs", "xfc", "xfj"):
        seen = {new_secret(prefix, 24) for _ in range(300)}
        assert len(seen) == 300  # fresh every time
        for secret in seen:
            assert secret.startswith(prefix + "_") and len(secret) > 30
            assert parser.parse_args(["--join", secret]).join == secret
    assert auth.new_token().startswith("xfs_")
