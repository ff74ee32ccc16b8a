"""A workflow whose model file is missing gets no success rate (docs/predictor.md, "Missing model files"):
the answer names each file (node, class, input, folder, name) and where it is looked for, and keeps the
files found only as a lower bound. A workflow whose files are all found keeps seed 001's figures; one
that loads no model file is rated by the formula and says it loads none."""

from __future__ import annotations

import dataclasses

from xpufleet.predictor.predict import level_for, predict
from xpufleet.predictor.resolve import DirsResolver
from xpufleet.predictor.service import MISSING_COLOR, predict_workflow
from xpufleet.predictor.snapshot import Snapshot
from xpufleet.server.cli.predict import format_answer

GiB = 1024**3
CARD = Snapshot(vram_free_gb=23.5, vram_total_gb=24.0, ram_free_gb=30.0, commit_used_gb=10.0, commit_limit_gb=60.0,
                device="cuda:0", kind="cuda", platform="nvidia", worker="gpu-box", simulated=True)
LEVEL_COLORS = {"#52c41a", "#afff00", "#faad14", "#ff4d4f"}  # seed 001's table


def api_graph(ckpt: str, vae: str | None = None) -> dict:
    g = {
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": ckpt}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"width": 512, "height": 512, "batch_size": 1}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["5", 0], "vae": ["4", 2]}},
        "9": {"class_type": "SaveImage", "inputs": {"images": ["8", 0], "filename_prefix": "x"}},
    }
    if vae is not None:
        g["10"] = {"class_type": "VAELoader", "inputs": {"vae_name": vae}}
        g["8"]["inputs"]["vae"] = ["10", 0]
    return g


def assert_no_rate(a: dict) -> None:
    assert a["p_success"] is None and a["level"] == "missing" and a["complete"] is False
    assert a["color"] == MISSING_COLOR and a["color"] not in LEVEL_COLORS  # no level's colour, green least of all
    assert a["label"] == {"en": "Missing model", "zh": "缺少模型"}
    assert a["summary"]["verdict"] == "missing" and a["summary"]["lower_bound"] is True
    assert a["explanation"]["models"]["lower_bound"] is True


def test_ui_workflow_with_a_missing_checkpoint_names_it_and_gives_no_rate(template, models_root):
    wf = template("flux_schnell.json")  # a real ComfyUI template: CheckpointLoaderSimple node 30
    a = predict_workflow(wf, CARD, resolver=DirsResolver([models_root]), gamma_overrides={})
    assert_no_rate(a)
    [m] = a["missing"]
    assert {k: m[k] for k in ("node", "class_type", "input", "folder", "name", "status")} == {
        "node": "30", "class_type": "CheckpointLoaderSimple", "input": "ckpt_name", "folder": "checkpoints",
        "name": "flux1-schnell-fp8.safetensors", "status": "missing"}
    assert m["folders"] == ["checkpoints"] and m["places"] == [str(models_root / "checkpoints")]
    assert m["places_more"] == 0
    # nothing found: the lower bound is 0, said as one, never "needs 0.00 GiB" with a rate
    assert a["explanation"]["inputs"]["m_peak_gb"] == 0 and a["summary"]["need_gb"] == 0
    assert any("no success rate until they are found" in w for w in a["warnings"])


def test_api_workflow_with_a_missing_checkpoint_keeps_the_files_found_as_a_lower_bound(sparse, models_root):
    sparse(models_root / "vae" / "ae.safetensors", GiB // 4)
    a = predict_workflow(api_graph("sd_xl_base_1.0.safetensors", vae="ae.safetensors"), CARD,
                         resolver=DirsResolver([models_root]), gamma_overrides={})
    assert_no_rate(a)
    assert [(m["node"], m["class_type"], m["input"], m["folder"], m["name"]) for m in a["missing"]] == [
        ("4", "CheckpointLoaderSimple", "ckpt_name", "checkpoints", "sd_xl_base_1.0.safetensors")]
    assert a["missing"][0]["places"] == [str(models_root / "checkpoints")]
    # the VAE found is counted: the need is at least its size
    assert a["explanation"]["inputs"]["m_peak_gb"] == 0.25 == a["summary"]["need_gb"]
    assert [m["status"] for m in a["models"]] == ["missing", "found"]
    # the CLI says the same: no rate, the file and its node, the bound marked
    text = format_answer(a)
    assert text.splitlines()[0] == ("Success rate: none (Missing model / 缺少模型): sd_xl_base_1.0.safetensors "
                                    "(node 4)")
    assert "M_peak >= 0.25 GB" in text and "%" not in text.splitlines()[0]


def test_no_file_chosen_and_a_link_leading_out_also_withhold_the_rate(sparse, models_root, tmp_path):
    a = predict_workflow(api_graph(""), CARD, resolver=DirsResolver([models_root]), gamma_overrides={})
    assert_no_rate(a)
    assert (a["missing"][0]["name"], a["missing"][0]["status"]) == ("", "unresolved")
    outside = sparse(tmp_path / "outside" / "x.safetensors", GiB)
    (models_root / "checkpoints").mkdir()
    (models_root / "checkpoints" / "link.safetensors").symlink_to(outside)
    a = predict_workflow(api_graph("link.safetensors"), CARD, resolver=DirsResolver([models_root]), gamma_overrides={})
    assert_no_rate(a)
    assert a["missing"][0]["status"] == "refused" and "not read" in a["missing"][0]["reason"]


def test_every_file_found_keeps_seed_001s_figures(sparse, models_root):
    sparse(models_root / "checkpoints" / "sd_xl_base_1.0.safetensors", 7 * GiB)
    sparse(models_root / "vae" / "ae.safetensors", GiB // 4)
    a = predict_workflow(api_graph("sd_xl_base_1.0.safetensors", vae="ae.safetensors"), CARD,
                         resolver=DirsResolver([models_root]), gamma_overrides={})
    assert a["missing"] == [] and a["complete"] is True
    # M_peak: the largest file; M_total: the sum; the rate is seed 001's for them, unchanged
    assert a["explanation"]["inputs"]["m_peak_gb"] == 7 and a["explanation"]["inputs"]["m_total_gb"] == 7.25
    direct = predict(m_total=7.25, m_peak=7, vram_free_gb=23.5, vram_allocated_gb=0, vram_reserved_gb=0,
                     ram_free_gb=30, commit_used_gb=10, commit_limit_gb=60, platform="nvidia", gamma_overrides={})
    assert (a["p_success"], a["level"], a["color"], a["label"]) == (
        direct.p_success, direct.level, direct.color, direct.label)
    assert a["explanation"]["intermediates"] == direct.explanation["intermediates"]
    assert "lower_bound" not in a["explanation"]["models"] and "lower_bound" not in a["summary"]
    assert a["summary"]["peak_source"] == "model_files" and a["summary"]["verdict"] == "fits"
    # a card too small for the checkpoint: the formula's level, not "missing"
    small = dataclasses.replace(CARD, vram_free_gb=2.0)
    b = predict_workflow(api_graph("sd_xl_base_1.0.safetensors"), small, resolver=DirsResolver([models_root]),
                         gamma_overrides={})
    assert b["level"] == level_for(b["p_success"]).key and b["p_success"] < 100


def test_a_workflow_that_loads_no_model_file_is_rated_and_says_it_loads_none(models_root):
    graph = {  # the core-node workflow of issue 30's tests: no weights at all
        "1": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 64, "batch_size": 1, "color": 0}},
        "2": {"class_type": "ImageScale", "inputs": {"image": ["1", 0], "upscale_method": "nearest-exact",
                                                     "width": 128, "height": 128, "crop": "disabled"}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "x"}},
    }
    a = predict_workflow(graph, CARD, resolver=DirsResolver([models_root]), gamma_overrides={})
    # nothing is missing: the formula applies (M_peak = M_total = 0 fits any card) ...
    assert a["missing"] == [] and a["complete"] is True and a["models"] == []
    assert (a["p_success"], a["level"]) == (100, "smooth")
    # ... and the answer says its peak is no file size nor a measurement: the tooltip words it so
    assert a["summary"]["peak_source"] == "none"
    assert "m_peak_model" not in a["explanation"]["models"]
