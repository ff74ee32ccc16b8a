"""check.py: a workflow against a provider's ComfyUI: every refusal's wording."""

from __future__ import annotations

import copy

from xpufleet.server.comfyflow.check import NO, OK, WAIT, Where, problems, types_match, verdict
from xpufleet.server.comfyflow.reading import reading_of

from .readings import CLASSES, core_workflow, message, upscale_workflow

W = Where("gpu-box")
READY = reading_of(message())


def test_a_workflow_the_reading_can_run_has_no_problem() -> None:
    assert problems(core_workflow(), READY, W) == []
    assert problems(upscale_workflow(), READY, W) == []
    assert verdict(W, "ready", READY, core_workflow()) == (OK, "")


def test_an_unknown_node_class_names_the_worker_node_and_what_to_do() -> None:
    g = core_workflow()
    g["7"] = {"class_type": "FooNode", "inputs": {}}
    assert problems(g, READY, W) == [
        "worker gpu-box has no node class 'FooNode' (node 7): install the custom node that provides it in that "
        "worker's ComfyUI (custom_nodes/) and restart its agent, or choose another target"]
    local = problems(g, READY, Where("local", is_local=True))[0]
    assert local.startswith("this server has no node class 'FooNode'") and "restart the sidecar" in local


def test_a_missing_model_file_names_the_file_folder_node_and_input_once() -> None:
    assert problems(upscale_workflow("x4.safetensors"), READY, W) == [
        "worker gpu-box has no model file 'x4.safetensors' in models/upscale_models (node 2, "
        "UpscaleModelLoader.model_name): put it there, or choose another target"]


def test_a_file_of_a_loader_outside_the_table_is_found_by_its_combo() -> None:
    classes = dict(CLASSES, FancyLoader={"inputs": {"weights": {"type": "COMBO", "required": True,
                                                                "options": ["a.gguf"]}}, "outputs": ["MODEL"]})
    r = reading_of(message(classes=classes, models={"unet_gguf": ["a.gguf"]}))
    g = {"1": {"class_type": "FancyLoader", "inputs": {"weights": "b.gguf"}}}
    assert problems(g, r, W) == ["worker gpu-box has no model file 'b.gguf' in models/unet_gguf (node 1, "
                                 "FancyLoader.weights): put it there, or choose another target"]


def test_a_bad_combo_value_lists_what_is_offered() -> None:
    g = core_workflow()
    g["2"]["inputs"]["upscale_method"] = "lanczos9"
    assert problems(g, READY, W) == [
        "worker gpu-box: node 2 (ImageScale) input 'upscale_method' is 'lanczos9', which that worker's ComfyUI "
        "does not offer (it offers 'nearest-exact', 'bilinear'): choose one of those, or another target"]


def test_a_missing_required_input() -> None:
    g = core_workflow()
    del g["1"]["inputs"]["width"]
    assert problems(g, READY, W) == ["worker gpu-box: node 1 (EmptyImage) lacks the required input 'width' "
                                     "(INT): set or connect it in the workflow"]


def test_links_to_a_missing_node_a_missing_output_and_a_wrong_type() -> None:
    g = core_workflow()
    g["3"]["inputs"]["images"] = ["9", 0]
    assert problems(g, READY, W) == ["worker gpu-box: node 3 (SaveImage) input 'images' links to node 9, which "
                                     "is not in the workflow: connect it to a node that is"]
    g = core_workflow()
    g["3"]["inputs"]["images"] = ["2", 1]
    assert "which has 1 outputs" in problems(g, READY, W)[0]
    g = upscale_workflow()
    g["3"]["inputs"]["image"] = ["2", 0]
    assert problems(g, READY, W) == [
        "worker gpu-box: node 3 (ImageUpscaleWithModel) input 'image' takes IMAGE, but output 0 of node 2 "
        "(UpscaleModelLoader) is UPSCALE_MODEL: connect an output of type IMAGE"]


def test_types_match_like_comfyui() -> None:
    assert types_match("IMAGE", "IMAGE") and types_match("*", "MODEL") and types_match("IMAGE,MASK", "MASK")
    assert not types_match("LATENT", "IMAGE")


def test_verdicts_by_state() -> None:
    g = core_workflow()
    assert verdict(W, "probing", None, g) == (WAIT, "worker gpu-box is still reading its ComfyUI; the run "
                                                    "waits until it has")
    assert verdict(W, "none", None, g) == (NO, "worker gpu-box has no ComfyUI to run workflows: start its agent "
                                               "with --comfyui PATH (the ComfyUI folder)")
    assert verdict(Where("local", True), "none", None, g) == (
        NO, "this server has no ComfyUI to run workflows: start the sidecar with --comfyui PATH, or queue to a "
            "worker started with --comfyui")
    failed = reading_of(message(ok=False, error="no main.py in /opt/ComfyUI"))
    assert verdict(W, "failed", failed, g) == (
        NO, "worker gpu-box could not read its ComfyUI (no main.py in /opt/ComfyUI): fix it and restart its "
            "agent, or choose another target")
    two = copy.deepcopy(g)
    two["8"] = {"class_type": "A", "inputs": {}}
    two["9"] = {"class_type": "B", "inputs": {}}
    status, text = verdict(W, "ready", READY, two)
    assert status == NO and text.count("; ") == 1


def test_a_loader_folder_the_reading_does_not_list_falls_back_to_the_combo_options() -> None:
    r = reading_of(message(models={}))  # the agent listed no folder: the input's options decide
    assert problems(upscale_workflow(), r, W) == []
    assert problems(upscale_workflow("x4.safetensors"), r, W) == [
        "worker gpu-box has no model file 'x4.safetensors' (node 2, UpscaleModelLoader.model_name): put it there, "
        "or choose another target"]
