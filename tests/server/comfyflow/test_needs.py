"""needs.py: the classes and model files a workflow needs."""

from __future__ import annotations

from xpufleet.server.comfyflow.needs import ModelNeed, graph_needs, is_link

from .readings import core_workflow, upscale_workflow


def test_a_core_workflow_needs_its_classes_and_no_file() -> None:
    n = graph_needs(core_workflow())
    assert n.classes == ("EmptyImage", "ImageScale", "SaveImage") and n.models == ()


def test_a_loader_needs_its_file_in_its_folders() -> None:
    n = graph_needs(upscale_workflow())
    assert n.models == (ModelNeed("2", "UpscaleModelLoader", "model_name", "x2.safetensors", ("upscale_models",)),)


def test_an_unknown_loader_s_model_file_is_a_need_without_a_folder_and_a_link_is_none() -> None:
    g = {"5": {"class_type": "FancyLoader", "inputs": {"weights": "big.gguf", "text": "a cat"}},
         "6": {"class_type": "UpscaleModelLoader", "inputs": {"model_name": ["5", 0]}}}
    n = graph_needs(g)
    assert n.models == (ModelNeed("5", "FancyLoader", "weights", "big.gguf", ()),)


def test_is_link() -> None:
    assert is_link(["3", 0]) and is_link([3, 1])
    assert not is_link(["a", "b"]) and not is_link([True, 0]) and not is_link("x") and not is_link([1, 2, 3])
