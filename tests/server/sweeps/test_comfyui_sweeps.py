"""Sweeps over any widget of any node (docs/comfyui.md, fan-out): a parameter may name a literal input of a
node class this server does not know (a ComfyUI node); a link is refused; a fan-out of seeds is a sweep over
``<node>.seed`` with target any, each variant a ComfyUI run routed to a worker whose ComfyUI can run it."""

from __future__ import annotations

import pytest
import scripted_agent as sa

from xpufleet.constants import AGENT_CAP_MEMORY
from xpufleet.server.sweeps.expand import variants
from xpufleet.server.sweeps.params import SpecError
from xpufleet.server.sweeps.spec import parse_sweep

from ..comfyflow.readings import core_workflow, message


def seeded() -> dict:
    g = core_workflow()
    g["5"] = {"class_type": "KSampler", "inputs": {"seed": 7, "steps": 20}}
    return g


def test_a_parameter_names_any_literal_widget_of_a_comfyui_node() -> None:
    spec = parse_sweep({"graph": seeded(), "parameters": {"5.seed": [1, 2, 3], "2.upscale_method": ["bilinear"]}})
    assert [p.path for p in spec.params] == ["5.seed", "2.upscale_method"]
    assert len(variants(spec)) == 3


def test_a_link_or_a_missing_widget_of_a_comfyui_node_is_refused() -> None:
    with pytest.raises(SpecError, match="input image of node 2 \\(ImageScale\\) is a link from node 1"):
        parse_sweep({"graph": seeded(), "parameters": {"2.image": [1]}})
    with pytest.raises(SpecError, match="node 5 \\(KSampler\\) has no input 'cfg'"):
        parse_sweep({"graph": seeded(), "parameters": {"5.cfg": [1.0]}})


async def test_a_fan_out_of_seeds_goes_to_the_worker_whose_comfyui_can_run_it(tmp_path) -> None:
    async with sa.Sidecar(tmp_path) as sc:
        await sc.agent("plain", sa.cards(2, prefix="GPU-plain"))
        box = await sc.agent("gpu-box", sa.cards(2, prefix="GPU-box"), caps=False,
                             capabilities=[AGENT_CAP_MEMORY, "comfyui"])
        await box.send("comfyui", **message())
        code, body = await sc.call("POST", "/api/sweeps", {
            "graph": seeded(), "parameters": {"5.seed": [11, 12, 13, 14]},
            "options": {"target": {"worker": "any"}, "device": "cuda"}})
        assert code in (200, 201), body
        seeds = []
        for _ in range(2):  # two cards: two variants start at once
            start = await box.recv_type("start_run")
            seeds.append(start["graph"]["5"]["inputs"]["seed"])
        assert seeds == [11, 12]
        code, listed = await sc.call("GET", "/api/runs")
        kinds = {r["kind"] for r in listed["runs"]}
        assert kinds == {"comfyui"} and all(r["worker_id"] in (None, "gpu-box") for r in listed["runs"])
