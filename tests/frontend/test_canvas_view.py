"""web/lib/canvas_view.mjs's pure rules, run in Node (no browser): the view a loaded graph of ours is framed
at (docs/comfyui.md, "Templates open readable"). The page itself: test_frontend_versions.py (marker browser)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

MODULE = Path(__file__).resolve().parents[2] / "web" / "lib" / "canvas_view.mjs"
NODE = shutil.which("node")


def run(expr: str) -> object:
    if NODE is None:
        pytest.skip("no Node.js here (apt-get install nodejs): the browser tests cover the module on the page")
    script = f"import * as v from {json.dumps(MODULE.as_uri())}; console.log(JSON.stringify({expr}));"
    proc = subprocess.run([NODE, "--input-type=module", "-e", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def screen(view: dict, point: list[float]) -> list[float]:
    """Where LiteGraph draws a canvas point: (p + offset) * scale."""
    return [(point[i] + view["offset"][i]) * view["scale"] for i in (0, 1)]


def test_a_graph_too_wide_for_the_readable_zoom_lands_at_it_with_its_top_left_in_the_free_area():
    view = run("v.readableView([100, 50, 2400, 800], [56, 40, 1444, 910], 0.63, 1)")
    assert view["scale"] == pytest.approx(0.63)  # not the 0.5 a whole-graph fit would give
    x, y = screen(view, [100, 50])
    assert x == pytest.approx(56 + 40)  # left edge: past the side bar, a margin in
    assert 40 + 40 < y < 910  # fits vertically at 0.63: centred in the free area
    x1, y1 = screen(view, [2500, 850])
    assert x1 > 1500 and y1 - 40 == pytest.approx(910 - (y - 40))


def test_a_small_graph_is_centred_at_no_more_than_full_size():
    view = run("v.readableView([100, 100, 400, 300], [0, 0, 1500, 950], 0.63, 1)")
    assert view["scale"] == 1
    assert screen(view, [100, 100]) == [550, 325] and screen(view, [500, 400]) == [950, 625]


def test_bounds_cover_nodes_with_their_title_bars_and_groups():
    bounds = run("v.graphBounds({nodes: [{pos: [10, 40], size: [100, 50]}, {boundingRect: [500, -20, 50, 60]}], "
                 "_groups: [{_bounding: [0, 0, 300, 200]}]})")
    assert bounds == [0, -20, 550, 220]
    assert run("v.graphBounds({nodes: []})") is None
