"""The child processes a test starts (sidecars, agents, sshd): stopped by their PID, never by name; and the
bounded wait for what such a process changes.

Test files and harnesses use it as ``import processes`` (tests/conftest.py registers it: test folders are
not packages); the benchmarks load it through bench/benchlib.py."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import Any


def stop_process(proc: subprocess.Popen, grace_s: float = 60.0) -> None:
    """SIGTERM to a child the test started, SIGKILL after ``grace_s``; waits for its end."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def wait_until(check: Callable[[], Any], what: str, timeout: float = 60.0, every: float = 0.1) -> Any:
    """Poll ``check()`` until it returns something true, and return that (for state another process holds,
    with no push channel to the caller: a worker's status, a file); AssertionError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"not {what} after {timeout} s")
