"""The plugin loaded by a real ComfyUI (0.3.64 or 0.33.0): a clean import, every node in /object_info with its
inputs, the front-end extension served once, our routes, and ComfyUI's own validation of our nodes."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import comfy_harness  # registered by tests/comfy_host/conftest.py
import pytest

from xpufleet import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS

pytestmark = pytest.mark.comfy

EXAMPLES = Path(__file__).resolve().parents[2] / "samples"
# The line of the plugin in ComfyUI's import-times list: "   0.1 seconds: .../custom_nodes/xpufleet" up to
# 0.3.6x, "[INFO]    0.1 seconds: ..." since (its log lines carry their level)
IMPORT_TIME_LINE = re.compile(r"^(?:\[[A-Z]+\])?\s*[\d.]+ seconds: \S*custom_nodes/xpufleet\s*$", re.M)


def test_plugin_imports_with_no_error_line(comfyui):
    log = comfyui.log()
    startup, _, _ = log.partition("Starting server")
    assert "Starting server" in log, comfyui.log_tail()
    # ComfyUI's import-times list names the plugin, without "(IMPORT FAILED)"; 0.33 prefixes the level
    assert IMPORT_TIME_LINE.search(startup), startup
    assert "Traceback" not in startup and "IMPORT FAILED" not in startup and "Cannot import" not in startup
    ours = [line for line in startup.splitlines() if "xpufleet" in line.lower()]
    assert not [line for line in ours if re.search(r"error|disabled|exception|warning", line, re.I)], ours
    # and nothing of ours was disabled later either (the plugin logs "xpufleet: ... disabled: ...")
    assert not re.search(r"^(?:\[[A-Z]+\]\s*)?xpufleet: .* disabled", log, re.M)


def test_object_info_lists_every_node_with_its_inputs(comfyui):
    info = comfyui.get("/object_info")
    for name, cls in NODE_CLASS_MAPPINGS.items():
        assert name in info, f"{name} missing from /object_info"
        entry = info[name]
        spec = cls.INPUT_TYPES()
        assert set(entry["input"]["required"]) == set(spec["required"]), name
        assert set(entry["input"].get("optional", {})) == set(spec.get("optional", {})), name
        assert entry["output"] == list(cls.RETURN_TYPES) and entry["output_name"] == list(cls.RETURN_NAMES)
        assert entry["display_name"] == NODE_DISPLAY_NAME_MAPPINGS[name]
        assert entry["output_node"] is bool(cls.OUTPUT_NODE) and entry["category"] == cls.CATEGORY
        assert entry["python_module"].startswith("custom_nodes.xpufleet")
    # combos and widget bounds come through as declared
    loop = info["XPUTrainingLoop"]["input"]
    assert loop["required"]["epochs"][1]["min"] == 1 and "ddp" in loop["optional"]["strategy"][0]


def test_the_web_extension_is_served_exactly_once(comfyui):
    extensions = comfyui.get("/extensions")
    ours = [e for e in extensions if e.endswith("/xpu_monitor.js")]
    assert len(ours) == 1, extensions
    status, body = comfyui.request("GET", ours[0])
    assert status == 200 and "registerExtension" in body


def test_our_routes_answer_on_comfyuis_server(comfyui):
    assert comfyui.get("/xpufleet/version")["name"] == "xpufleet"
    snap = comfyui.get("/xpufleet/snapshot")
    assert "ram_free_gb" in json.dumps(snap)


def test_a_bad_value_is_refused_by_comfyuis_validation_naming_node_and_input(comfyui):
    graph = json.loads((EXAMPLES / "mlp_digits.json").read_text())
    bad = copy.deepcopy(graph)
    bad["8"]["inputs"]["epochs"] = 0
    bad["5"]["inputs"]["name"] = "adamx"
    with pytest.raises(comfy_harness.PromptRefused) as refused:
        comfyui.run_prompt(bad)
    assert refused.value.status == 400
    errors = refused.value.body["node_errors"]
    assert set(errors) == {"8", "5"}
    assert errors["8"]["class_type"] == "XPUTrainingLoop" and errors["5"]["class_type"] == "XPUOptimizer"
    (epochs,) = errors["8"]["errors"]
    assert epochs["type"] == "value_smaller_than_min" and epochs["extra_info"]["input_name"] == "epochs"
    assert "min of 1" in epochs["message"]
    (name,) = errors["5"]["errors"]
    assert name["type"] == "value_not_in_list" and name["extra_info"]["input_name"] == "name"
    assert "adamx" in name["details"]
