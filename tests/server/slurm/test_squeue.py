"""squeue output parsing (server/slurm/squeue.py)."""

from __future__ import annotations

import pytest

from xpufleet.server.slurm.squeue import JobStatus, parse_squeue, state_text


def test_lines_become_jobs_with_their_state_texts():
    jobs = parse_squeue("12|PENDING|Resources|xpufleet-ab\n\n13|RUNNING|None|xpufleet-ab\n14|FAILED|NonZeroExitCode|x\n")
    assert jobs == [JobStatus("12", "PENDING", "Resources", "xpufleet-ab"),
                    JobStatus("13", "RUNNING", "None", "xpufleet-ab"),
                    JobStatus("14", "FAILED", "NonZeroExitCode", "x")]
    assert [j.text for j in jobs] == ["PENDING (Resources)", "RUNNING", "FAILED (NonZeroExitCode)"]
    assert [j.live for j in jobs] == [True, True, False]
    assert state_text("COMPLETED", "(null)") == "COMPLETED"


def test_a_name_with_the_separator_is_kept_whole_and_a_short_line_is_an_error():
    assert parse_squeue("5|RUNNING|None|a|b")[0].name == "a|b"
    with pytest.raises(ValueError, match="unexpected squeue line"):
        parse_squeue("5|RUNNING")
