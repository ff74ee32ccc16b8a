"""Sweep and study children save their files in their own run folders (issue 20, point 6).

Unit tests of the rule in ``expand.py`` and of what a dry run says about it; one end-to-end test runs a
two-variant sweep of a small iris graph on a real sidecar and checks the two saved models are two files
that both exist afterwards.
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import pytest

from xpufleet.server.sweeps.driver import SweepService
from xpufleet.server.sweeps.expand import own_outputs, shared_outputs, study_child, sweep_child, variants
from xpufleet.server.sweeps.spec import parse_study, parse_sweep

REPO = Path(__file__).resolve().parents[3]
GRAPH = json.loads((REPO / "samples" / "mlp_digits.json").read_text())
OBJ = {"metric": "val_accuracy"}


def saver(graph: dict) -> dict:
    return next(n for n in graph.values() if n["class_type"] == "XPUModelSaver")["inputs"]


def test_every_variant_saves_in_its_own_run_folder_and_the_base_graph_is_untouched():
    spec = parse_sweep({"graph": GRAPH, "objective": OBJ, "parameters": {"5.lr": [0.001, 0.01]}})
    children = [sweep_child(spec, v) for v in variants(spec)]
    assert [saver(c["graph"])["location"] for c in children] == ["run_dir", "run_dir"]
    assert [saver(c["graph"])["filename"] for c in children] == ["models/mlp_digits.safetensors"] * 2
    assert saver(GRAPH)["location"] == "outputs"  # only the child's copy moved
    assert children[0]["graph"]["1"] is GRAPH["1"]  # the other nodes are shared, not copied


def test_a_study_trial_also_saves_in_its_own_run_folder():
    spec = parse_study({"graph": GRAPH, "objective": OBJ, "n_trials": 2,
                        "parameters": {"5.lr": {"low": 1e-4, "high": 0.1, "log": True}}})
    assert saver(study_child(spec, 0, {"5.lr": 0.01})["graph"])["location"] == "run_dir"


@pytest.mark.parametrize("where", ["set", "parameters"])
def test_a_sweep_that_chooses_the_location_itself_keeps_its_choice(where):
    body = {"graph": GRAPH, "objective": OBJ, "parameters": {"5.lr": [0.001, 0.01]}}
    if where == "set":
        body["set"] = {"10.location": "outputs"}
    else:
        body["parameters"]["10.location"] = ["outputs"]
    spec = parse_sweep(body)
    assert {saver(sweep_child(spec, v)["graph"])["location"] for v in variants(spec)} == {"outputs"}


def test_shared_outputs_names_the_savers_it_moves():
    assert shared_outputs(GRAPH) == [{"node": "10", "class_type": "XPUModelSaver", "title": "Save model",
                                      "filename": "models/mlp_digits.safetensors"}]
    assert shared_outputs(GRAPH, ["10.location"]) == []
    g = copy.deepcopy(GRAPH)
    g["10"]["inputs"]["location"] = "run_dir"
    assert shared_outputs(g) == [] and own_outputs(g) is g
    g["10"]["inputs"] = {"model": ["8", 0], "filename": ["11", 0]}  # a linked filename, default location
    assert shared_outputs(g) == [{"node": "10", "class_type": "XPUModelSaver", "title": "Save model",
                                  "filename": None}]


def test_the_dry_run_says_which_files_move(dispatcher):
    from sweep_helpers import Box  # registered by conftest.py

    dispatcher.register_provider(Box("local", ["cpu"], is_local=True))
    svc = SweepService(dispatcher.store, dispatcher)
    answer = svc.create({"graph": GRAPH, "objective": OBJ, "parameters": {"5.lr": [0.001, 0.01]}}, dry_run=True)
    assert answer["own_outputs"] == [{"node": "10", "class_type": "XPUModelSaver", "title": "Save model",
                                      "filename": "models/mlp_digits.safetensors"}]
    answer = svc.create({"graph": GRAPH, "objective": OBJ, "parameters": {"5.lr": [0.001, 0.01]},
                         "set": {"10.location": "run_dir"}}, dry_run=True)
    assert answer["own_outputs"] == []


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_two_variants_write_two_model_files_that_both_exist_after_the_sweep(tmp_path):
    import sidecar_harness as harness  # registered by tests/server/conftest.py

    graph = copy.deepcopy(harness.IRIS_GRAPH)
    graph["9"] = {"class_type": "XPUModelSaver", "_meta": {"title": "Save model"},
                  "inputs": {"model": ["7", 0], "filename": "models/iris.safetensors", "format": "safetensors"}}
    sc = harness.Sidecar(tmp_path / "home", {"OMP_NUM_THREADS": "1"}).start()
    try:
        api = harness.Api(sc)
        status, created, _ = api.post("/api/sweeps", {"graph": graph, "objective": {"metric": "val_accuracy"},
                                                      "name": "iris-lr", "parameters": {"5.lr": [0.01, 0.05]}})
        assert status == 201, created
        deadline = time.monotonic() + 240
        sweep = None
        while time.monotonic() < deadline:  # the long poll answers at each child's move; bounded
            status, sweep, _ = api.call("GET", f"/api/sweeps/{created['sweep_id']}?version="
                                                f"{sweep['version'] if sweep else 0}&wait=10")
            assert status == 200
            if sweep["status"] in ("finished", "cancelled"):
                break
        assert sweep["status"] == "finished" and sweep["counts"] == {"succeeded": 2}, sweep
        files = []
        for row in sweep["table"]:
            status, arts, _ = api.call("GET", f"/api/runs/{row['run_id']}/artifacts")
            assert status == 200
            models = [a for a in arts["artifacts"] if a["path"].endswith("iris.safetensors")]
            assert len(models) == 1, arts
            run = sc.client.run(row["run_id"])
            files.append(Path(run["run_dir"]) / models[0]["path"])
        assert files[0] != files[1]
        assert all(f.is_file() and f.stat().st_size > 0 for f in files), files
        assert not (tmp_path / "home" / "outputs" / "models" / "iris.safetensors").exists()
    finally:
        sc.stop()


def test_a_running_variant_shows_its_latest_progress(dispatcher):
    from sweep_helpers import Box  # registered by conftest.py

    from xpufleet.server.run.events import NewEvent

    dispatcher.register_provider(Box("local", ["cpu"], is_local=True))
    svc = SweepService(dispatcher.store, dispatcher)
    created = svc.create({"graph": GRAPH, "objective": OBJ, "parameters": {"5.lr": [0.001, 0.01]}})
    first, second = created["run_ids"]
    store = dispatcher.store
    assert store.assign(first, provider="local", placement="local", devices=["cpu"], run_dir=None)
    assert store.mark_running(first)
    store.append_events(first, [NewEvent("progress", {"node": "8", "value": 3, "max": 20, "text": "epoch 1/4",
                                                      "epoch": 1, "loss": 0.5}, time.time()),
                                NewEvent("progress", {"node": "8", "value": 7, "max": 20, "text": "epoch 2/4",
                                                      "epoch": 2, "loss": 0.25, "lr": 0.01}, time.time())])
    rows = {r["run_id"]: r for r in svc.get(created["sweep_id"])["table"]}
    assert rows[first]["progress"] == {"value": 7, "max": 20, "text": "epoch 2/4", "epoch": 2, "loss": 0.25}
    assert rows[second]["progress"] is None  # still queued


def test_parameters_are_named_by_node_title_as_the_picker_names_them(dispatcher):
    from sweep_helpers import Box  # registered by conftest.py

    from xpufleet.server.sweeps.expand import param_labels

    g = copy.deepcopy(GRAPH)
    del g["4"]["_meta"]  # no title: the class without the plugin's prefix
    assert param_labels(g, ["5.lr", "4.hidden", "99.x"]) == {"5.lr": "Optimizer lr", "4.hidden": "MLP hidden",
                                                             "99.x": "99.x"}
    dispatcher.register_provider(Box("local", ["cpu"], is_local=True))
    svc = SweepService(dispatcher.store, dispatcher)
    created = svc.create({"graph": GRAPH, "objective": OBJ, "parameters": {"5.lr": [0.001, 0.01]}})
    assert svc.get(created["sweep_id"])["labels"] == {"5.lr": "Optimizer lr"}
