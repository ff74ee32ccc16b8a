"""The child processes a test starts (sidecars, agents, sshd): stopped by their PID, never by name.

Test files and harnesses use it as ``import processes`` (tests/conftest.py registers it: test folders are
not packages)."""

from __future__ import annotations

import subprocess


def stop_process(proc: subprocess.Popen, grace_s: float = 60.0) -> None:
    """SIGTERM to a child the test started, SIGKILL after ``grace_s``; waits for its end."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
