"""``xpufleet sweep`` / ``study`` without a sidecar: the spec file, the tables, the live view, exit codes.
(The commands against a real sidecar and agents: tests/server/sweeps/test_sweeps_e2e.py.)"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from xpufleet.server.cli import studies as studies_cli
from xpufleet.server.cli import sweeps as sweeps_cli
from xpufleet.server.cli.specs import LiveTable, load_spec, render

REPO = Path(__file__).resolve().parents[3]
DIGITS = json.loads((REPO / "samples" / "mlp_digits.json").read_text())


def test_the_example_specs_load_with_their_graph_read_from_the_file_next_to_them():
    sweep = load_spec(str(REPO / "samples" / "sweep_lr.yaml"))
    assert sweep["graph"] == DIGITS and sweep["parameters"] == {"5.lr": [0.0005, 0.002, 0.008, 0.03]}
    assert sweep["objective"] == {"metric": "val_accuracy", "direction": "maximize"}
    assert sweep["options"] == {"target": {"worker": "any"}} and sweep["set"] == {"10.location": "run_dir"}
    study = load_spec(str(REPO / "samples" / "study_lr.yaml"))
    assert study["parameters"]["5.lr"] == {"low": 1e-4, "high": 0.3, "log": True} and study["n_trials"] == 12


def test_exponent_numbers_are_numbers_and_bad_files_say_what_to_fix(tmp_path):
    (tmp_path / "g.json").write_text(json.dumps(DIGITS))
    spec = tmp_path / "s.yaml"
    spec.write_text("graph: g.json\nparameters:\n  '5.lr': {low: 1e-4, high: 3E-1, log: true}\n  '4.hidden': ['64', 1e3]\n")
    body = load_spec(str(spec))
    assert body["parameters"]["5.lr"] == {"low": 0.0001, "high": 0.3, "log": True}
    assert body["parameters"]["4.hidden"] == ["64", 1000.0] and body["graph"] == DIGITS
    for text, needle in [("graph: [1", "is not valid YAML"), ("- 1\n- 2\n", "must hold a mapping"),
                         ("graph: missing.json\n", "graph file"), ]:
        spec.write_text(text)
        with pytest.raises(ValueError, match=needle):
            load_spec(str(spec))
    with pytest.raises(ValueError, match="does not exist"):
        load_spec(str(tmp_path / "none.yaml"))


SWEEP = {"id": "0123456789abcdef", "name": "digits-lr", "status": "running", "n_runs": 3,
         "counts": {"succeeded": 1, "running": 1, "queued": 1}, "parameters": ["5.lr"],
         "objective": {"metric": "val_accuracy", "direction": "maximize"},
         "table": [
             {"rank": 1, "variant": 1, "parameters": {"5.lr": 0.008}, "seed": None, "status": "succeeded",
              "metric": 0.97356, "worker_id": "alpha", "devices": ["cuda:0"], "queue_key": "any/cuda"},
             {"rank": None, "variant": 0, "parameters": {"5.lr": 0.0005}, "seed": None, "status": "running",
              "metric": None, "worker_id": None, "devices": ["cpu"], "queue_key": "any/cuda"},
             {"rank": None, "variant": 2, "parameters": {"5.lr": 0.03}, "seed": None, "status": "queued",
              "metric": None, "worker_id": None, "devices": [], "queue_key": "any/cuda"}]}


def test_the_sweep_table_shows_each_variants_worker_devices_and_queue():
    lines = sweeps_cli.table_lines(SWEEP, 50)
    assert lines[0] == ("sweep digits-lr (01234567): running; 3 runs: 1 queued, 1 running, 1 succeeded; "
                        "maximize val_accuracy")
    assert lines[1].split() == ["RANK", "#", "5.lr", "SEED", "STATUS", "VAL_ACCURACY", "WORKER", "DEVICES", "QUEUE"]
    assert lines[2].split() == ["1", "1", "0.008", "-", "succeeded", "0.97356", "alpha", "cuda:0", "any/cuda"]
    assert "this server" in lines[3] and lines[4].split()[-3:] == ["-", "-", "any/cuda"]
    short = sweeps_cli.table_lines(SWEEP, 1)
    assert short[-1] == "... 2 more (xpufleet sweeps show 01234567 --csv -)"
    assert sweeps_cli.outcome({"counts": {"succeeded": 4}}) == 0
    assert sweeps_cli.outcome({"counts": {"succeeded": 3, "failed": 1}}) == 1


def test_the_study_table_and_its_best_trial():
    study = {"id": "fedcba9876543210", "name": "s", "status": "finished", "n_trials": 3, "error": None,
             "counts": {"complete": 1, "pruned": 1}, "parameters": ["5.lr"],
             "objective": {"metric": "val_accuracy", "direction": "maximize"},
             "best_trial": {"number": 0, "parameters": {"5.lr": 0.3}, "value": 0.97},
             "trials": [{"number": 0, "state": "complete", "value": 0.97, "parameters": {"5.lr": 0.3},
                         "run_status": "succeeded", "worker_id": "alpha", "devices": ["cuda:0"], "reason": None},
                        {"number": 1, "state": "pruned", "value": None, "parameters": {"5.lr": 0.0001},
                         "run_status": "cancelled", "worker_id": "beta", "devices": ["cuda:0"],
                         "reason": "pruned at step 23"}]}
    lines = studies_cli.trial_lines(study, 50)
    assert lines[0] == "study s (fedcba98): finished; 2 of 3 trials: 1 complete, 1 pruned; maximize val_accuracy"
    assert lines[3].split()[:6] == ["1", "pruned", "-", "0.0001", "cancelled", "beta"]
    assert lines[-1] == "best so far: trial 0 (5.lr=0.3): val_accuracy 0.97"


def test_the_live_table_redraws_in_place_on_a_terminal_and_prints_changes_elsewhere():
    plain = io.StringIO()
    view = LiveTable(plain)
    view.draw(["a", "b"])
    view.draw(["a", "b"])  # unchanged: nothing printed again
    view.draw(["a", "c"])
    assert plain.getvalue() == "a\nb\n\na\nc\n\n"

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty = Tty()
    view = LiveTable(tty)
    view.draw(["one", "two"])
    view.draw(["three"])
    assert tty.getvalue() == "\x1b[2Kone\n\x1b[2Ktwo\n\x1b[2F\x1b[2Kthree\n\x1b[2K\n"
    assert render(["A", "BB"], [[1.5, None], ["x", [1, 2]]]) == ["A    BB", "1.5  -", "x    1,2"]


def test_without_a_sidecar_the_commands_exit_3_and_a_bad_spec_exits_2(tmp_path):
    env = {"XPUFLEET_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"}
    run = [sys.executable, "-m", "xpufleet.server"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("graph: [1\n")
    out = subprocess.run([*run, "sweep", str(bad)], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "is not valid YAML" in out.stderr
    out = subprocess.run([*run, "sweep", str(REPO / "samples" / "sweep_lr.yaml")], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 3 and "no sidecar is running" in out.stderr
    out = subprocess.run([*run, "studies"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 3
