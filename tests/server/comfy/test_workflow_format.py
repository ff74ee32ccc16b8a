"""The Templates browser's files: each workflow-format template in example_workflows/ holds the same graph as
its API-format twin in samples/ (converted back the way the front end's graphToPrompt does), is what the
generator writes today, is laid out in stage columns with a group per part, and has a JPEG thumbnail."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from xpufleet.constants import SAMPLES_DIR, TEMPLATES_DIR
from xpufleet.server.comfy import make_templates as mt
from xpufleet.server.comfy.workflow_format import (
    PARTS,
    VIRTUAL_TYPES,
    api_to_workflow,
    part_of,
    with_defaults,
    workflow_to_api,
)

REPO = Path(__file__).resolve().parents[3]
GRAPHS = mt.sample_graphs(REPO / SAMPLES_DIR)
# ComfyUI 0.3.64 app/custom_node_manager.py: the folders whose *.json its Templates browser lists
COMFY_TEMPLATE_FOLDERS = ["example_workflows", "example", "examples", "workflow", "workflows"]


@pytest.fixture(scope="module")
def defs():
    return mt.plugin_defs()


def test_the_four_example_graphs_are_templates_and_the_non_graphs_are_not():
    assert set(GRAPHS) == {"mlp_digits", "cnn_digits", "ddp_digits", "predict_saved"}
    listed = {p.name for f in COMFY_TEMPLATE_FOLDERS for p in (REPO / f).glob("*.json")}
    assert listed == {f"{name}.json" for name in GRAPHS}  # no service spec, request body or API graph listed
    for name in listed:
        data = json.loads((REPO / TEMPLATES_DIR / name).read_text())
        assert isinstance(data["nodes"], list) and data["version"] == 0.4, name


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_each_template_holds_the_same_graph_as_its_api_twin(name, defs):
    workflow = json.loads((REPO / TEMPLATES_DIR / f"{name}.json").read_text())
    assert workflow_to_api(workflow, defs) == with_defaults(GRAPHS[name], defs)


def test_the_templates_are_what_the_generator_writes_today():
    assert mt.write_templates(REPO, check=True) == []


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_each_template_has_a_small_jpeg_thumbnail(name):
    thumb = REPO / TEMPLATES_DIR / f"{name}.jpg"  # the front end asks for <name>.jpg
    data = thumb.read_bytes()
    assert data[:3] == b"\xff\xd8\xff" and 5_000 < len(data) < 100_000


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_the_layout_is_stage_columns_with_a_group_per_part(name, defs):
    workflow = json.loads((REPO / TEMPLATES_DIR / f"{name}.json").read_text())
    groups = {g["title"]: g["bounding"] for g in workflow["groups"]}
    left_of = {}
    boxes = []
    for node in workflow["nodes"]:
        x, y = node["pos"]
        w, h = node["size"]
        if node["type"] in VIRTUAL_TYPES:  # a note: under every group
            assert y >= max(g[1] + g[3] for g in groups.values()), (name, node)
            boxes.append((x, y - 30, x + w, y + h))
            continue
        part = part_of(defs[node["type"]])
        gx, gy, gw, gh = groups[part]
        assert gx <= x and x + w <= gx + gw and gy <= y - 30 and y + h <= gy + gh, (name, node["title"], part)
        left_of.setdefault(part, []).append(x)
        boxes.append((x, y - 30, x + w, y + h))
    order = [p for p in PARTS if p in left_of]
    assert [max(left_of[a]) < min(left_of[b]) for a, b in zip(order, order[1:], strict=False)] == [True] * (len(order) - 1)
    for i, a in enumerate(boxes):  # no two nodes overlap
        for b in boxes[i + 1:]:
            assert a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1], (name, a, b)


def test_a_template_that_needs_another_first_says_so_in_a_note(defs):
    notes = {}
    for name in GRAPHS:
        workflow = json.loads((REPO / TEMPLATES_DIR / f"{name}.json").read_text())
        notes[name] = [n["widgets_values"][0] for n in workflow["nodes"] if n["type"] == "MarkdownNote"]
    assert notes["mlp_digits"] == [] and notes["cnn_digits"] == []
    assert notes["predict_saved"] == [mt.NOTES["predict_saved"]] and "Run the mlp_digits template first" in notes["predict_saved"][0]
    assert "Queue on..." in notes["ddp_digits"][0]
    # the model predict_saved loads is the one mlp_digits saves
    saved = next(n["inputs"]["filename"] for n in GRAPHS["mlp_digits"].values() if n["class_type"] == "XPUModelSaver")
    loaded = next(n["inputs"]["path"] for n in GRAPHS["predict_saved"].values() if n["class_type"] == "XPUModelLoader")
    assert saved == loaded and f"`{saved}`" in notes["predict_saved"][0]


def test_seed_widgets_carry_a_fixed_control_entry(defs):
    workflow = api_to_workflow(GRAPHS["mlp_digits"], defs, "mlp_digits")
    dataset = next(n for n in workflow["nodes"] if n["type"] == "XPUDataset")
    assert dataset["widgets_values"][:5] == ["digits", 0.2, 0, "fixed", "standard"]


def test_a_linked_widget_input_round_trips(defs):
    graph = copy.deepcopy(GRAPHS["mlp_digits"])
    graph["8"]["inputs"]["epochs"] = ["1", 0]  # not meaningful, but a link into a widget input is legal
    workflow = api_to_workflow(graph, defs, "linked")
    assert workflow_to_api(workflow, defs)["8"]["inputs"]["epochs"] == ["1", 0]


def test_a_wrong_widget_count_is_refused_with_the_node_named(defs):
    workflow = api_to_workflow(GRAPHS["mlp_digits"], defs, "mlp_digits")
    workflow["nodes"][5]["widgets_values"].append(1)
    with pytest.raises(ValueError, match=r"node 6 \(XPULoss\): 1 widget value\(s\) too many"):
        workflow_to_api(workflow, defs)
    workflow["nodes"][5]["widgets_values"] = []
    with pytest.raises(ValueError, match="no value for widget 'name'"):
        workflow_to_api(workflow, defs)


def test_the_template_ids_are_stable_and_distinct(defs):
    ids = {api_to_workflow(g, defs, n)["id"] for n, g in GRAPHS.items()}
    assert len(ids) == len(GRAPHS)
    assert api_to_workflow(GRAPHS["mlp_digits"], defs, "mlp_digits")["id"] == json.loads(
        (REPO / TEMPLATES_DIR / "mlp_digits.json").read_text())["id"]


def test_check_mode_reports_a_stale_template(tmp_path, capsys, monkeypatch):
    (tmp_path / SAMPLES_DIR).mkdir()
    (tmp_path / SAMPLES_DIR / "mlp_digits.json").write_text(json.dumps(GRAPHS["mlp_digits"]))
    (tmp_path / SAMPLES_DIR / "spec.json").write_text(json.dumps({"name": "not a graph"}))
    monkeypatch.setattr(mt, "REPO", tmp_path)
    assert mt.main(["--check"]) == 1
    assert "example_workflows/mlp_digits.json is stale" in capsys.readouterr().err
    assert mt.main([]) == 0
    assert sorted(p.name for p in (tmp_path / TEMPLATES_DIR).iterdir()) == ["mlp_digits.json"]
    assert mt.main(["--check"]) == 0
