"""The CLI's own words for the probe's cases (issue 9, item 8): what the user typed, named, with
what to do, and the exit codes the README documents. No sidecar is needed: each is refused first."""

from __future__ import annotations

import pytest

from xpufleet.server.cli.main import main


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse refusals
        code = int(exc.code)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("local", [False, True])
def test_a_directory_is_named_as_one(capsys, tmp_path, local):
    code, _, err = run_cli(capsys, "run", str(tmp_path), *(["--local"] if local else []))
    assert code == 2 and f"{str(tmp_path)!r} is a directory; give the graph's JSON file" in err
    assert "does not exist" not in err


def test_a_non_utf8_file_is_named(capsys, tmp_path):
    bad = tmp_path / "latin1.json"
    bad.write_bytes('{"1": {"class_type": "Caf\xe9"}}'.encode("latin-1"))
    code, _, err = run_cli(capsys, "run", str(bad))
    assert code == 2 and f"graph file {str(bad)!r} is not UTF-8 text" in err and "save it as UTF-8" in err
    assert "codec" not in err


@pytest.mark.parametrize("seed,fragment", [
    ("-1", "a run's seed is 0 or more and overrides every node's seed; -1 (unseeded) is a node setting"),
    ("x", "must be a whole number, got 'x'"), (str(2**63), "at most 2^63-1"),
])
def test_seed_is_refused_in_the_clis_words(capsys, tmp_path, seed, fragment):
    code, _, err = run_cli(capsys, "run", str(tmp_path / "g.json"), "--seed", seed)
    assert code == 2 and "argument --seed" in err and fragment in err and "options.seed" not in err


def test_agent_status_without_an_agent_exits_1_as_documented(capsys, xpufleet_home):
    code, out, _ = run_cli(capsys, "agent", "status")
    assert code == 1 and "no worker agents on this machine" in out
    code, _, _ = run_cli(capsys, "agent", "stop")
    assert code == 0
