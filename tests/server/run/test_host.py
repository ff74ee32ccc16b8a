"""The one run host's wording of how a run ended without a result (server/run/host.py): the sidecar's local
provider and the agent both use it, so a run killed by the OOM killer reads the same wherever it ran."""

from __future__ import annotations

import signal

import pytest

from xpufleet.server.run.host import Ending, RunProcess, cancel_text, death_text, ending_without_result
from xpufleet.server.run.launcher import GroupResult, MemberExit


def _exit(rc: int | None, finished: dict | None = None, start_error: str | None = None) -> MemberExit:
    return MemberExit(0, 123, rc, finished=finished, start_error=start_error)


@pytest.mark.parametrize(("rc", "worker", "text"), [
    (-signal.SIGKILL, None, "the run's process was killed by SIGKILL (out of memory?); see its log"),
    (-signal.SIGSEGV, None, "the run's process was killed by SIGSEGV; see its log"),
    (3, None, "the run's process exited with code 3 without reporting a result; see its log"),
    (-signal.SIGKILL, "box", "the run's process on worker box was killed by SIGKILL (out of memory?); see its log"),
    (1, "box", "the run's process on worker box exited with code 1 without reporting a result; see its log"),
])
def test_death_text_names_the_signal_the_code_and_the_worker(rc, worker, text):
    assert death_text(_exit(rc), worker) == text


def test_death_text_of_a_process_that_never_started_and_of_one_that_reported_its_error():
    assert death_text(_exit(None, start_error="no such file")) == (
        "the run's process could not be started: no such file; see its log")
    assert death_text(_exit(1, finished={"status": "failed", "error": "boom"})) == "the run's process boom; see its log"


def test_ending_follows_the_hosts_stop_first():
    killed = _exit(-signal.SIGKILL)
    assert ending_without_result("interrupt", killed, interrupted="the server was stopped", stop_grace_s=10) == \
        Ending("interrupted", "the server was stopped")
    assert ending_without_result("cancel", killed, interrupted="x", stop_grace_s=2.5) == \
        Ending("cancelled", "cancelled; the run did not stop within 2.5 s and was killed")
    assert cancel_text(30) == "cancelled; the run did not stop within 30 s and was killed"
    for reason in (None, "member_failed"):  # not stopped by its host: it died by itself
        assert ending_without_result(reason, killed, interrupted="x", stop_grace_s=1, worker="w") == \
            Ending("failed", "the run's process on worker w was killed by SIGKILL (out of memory?); see its log")


def test_a_run_process_words_its_result_with_its_own_grace(tmp_path):
    proc = RunProcess("r1", tmp_path, {}, lambda rank, events: None, stop_grace_s=7)
    result = GroupResult(exits=[_exit(-signal.SIGKILL)], stop_reason="cancel")
    assert proc.ending(result, interrupted="x").error == cancel_text(7)
    assert proc.pid is None  # not started
