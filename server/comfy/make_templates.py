"""Write the Templates browser's files: ``python -m xpufleet.server.comfy.make_templates``.

For every API-format graph in ``samples/`` it writes the workflow-format twin to ``example_workflows/``
(:func:`~.workflow_format.api_to_workflow`). ``--check`` writes nothing and exits 1 when a twin is missing
or stale. ``--thumbnails URL`` also renders each template's ``.jpg`` thumbnail: the graph loaded in the
ComfyUI at URL (with the plugin installed) and screenshot by Playwright with Debian's Chromium.
See docs/templates.md.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import sys
from pathlib import Path
from typing import Any

from ...constants import SAMPLES_DIR, TEMPLATES_DIR
from .workflow_format import NodeDef, api_to_workflow, node_defs

REPO = Path(__file__).resolve().parents[2]
# What a template says on the canvas beside its graph (a note under the groups; docs/templates.md).
NOTES = {
    "predict_saved": ("**Run the mlp_digits template first.** This graph loads the model its Save model node "
                      "writes (`models/mlp_digits.safetensors` in ComfyUI's `output/xpufleet` folder) and predicts "
                      "the digits' validation split with it. Another model: set the path of *Load the model* to a "
                      "file a ModelSaver wrote, or put it in ComfyUI's `models/xpufleet` folder."),
    "ddp_digits": ("**ddp trains on a worker's cards.** ComfyUI's own Run executes the graph in ComfyUI's process, "
                   "so the loop trains in one process and says why on the node. To train with ddp: **Queue on...** "
                   "-> a worker -> two or more of its cards (the run starts one process per card)."),
}
THUMBNAIL_SIZE = (640, 400)  # the Templates browser shows a 4:3-ish card; small files
CHROMIUM = "/usr/bin/chromium"


def is_api_graph(data: Any) -> bool:
    """An API-format graph: a non-empty object of ``{"class_type": ..., "inputs": {...}}`` nodes."""
    return isinstance(data, dict) and bool(data) and all(
        isinstance(n, dict) and isinstance(n.get("class_type"), str) and isinstance(n.get("inputs"), dict)
        for n in data.values())


def sample_graphs(samples: Path) -> dict[str, dict[str, Any]]:
    """``{stem: graph}`` for every API graph in ``samples`` (service specs and request bodies left out)."""
    found = {}
    for path in sorted(samples.glob("*.json")):
        data = json.loads(path.read_text())
        if is_api_graph(data):
            found[path.stem] = data
    return found


def plugin_defs() -> dict[str, NodeDef]:
    from ...nodes import NODE_CLASS_MAPPINGS

    return node_defs(NODE_CLASS_MAPPINGS)


def render(graph: dict[str, Any], defs: dict[str, NodeDef], name: str) -> str:
    """The file text of one template (stable: sorted keys, a newline at the end)."""
    return json.dumps(api_to_workflow(graph, defs, name, NOTES.get(name)), indent=1) + "\n"


def write_templates(repo: Path, check: bool = False) -> list[str]:
    """Write (or with ``check``, compare) every template; returns the names that were stale."""
    defs = plugin_defs()
    out = repo / TEMPLATES_DIR
    out.mkdir(exist_ok=True)
    stale = []
    for name, graph in sample_graphs(repo / SAMPLES_DIR).items():
        text, path = render(graph, defs, name), out / f"{name}.json"
        if not path.is_file() or path.read_text() != text:
            stale.append(name)
            if not check:
                path.write_text(text)
    return stale


def thumbnails(repo: Path, url: str, names: list[str]) -> None:
    """Screenshot each template loaded in the ComfyUI at ``url`` into ``example_workflows/<name>.jpg``."""
    from playwright.sync_api import sync_playwright  # the browser extra; only this option needs it

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.goto(url)
            page.wait_for_function("() => window.app && window.app.graph && window.app.canvas", timeout=120_000)
            for name in names:
                workflow = json.loads((repo / TEMPLATES_DIR / f"{name}.json").read_text())
                page.evaluate("async ([w, n]) => { await app.loadGraphData(w, true, true, n); }", [workflow, name])
                # fit the groups in view; the answer is their box on the canvas picture
                box = page.evaluate("""() => { const c = app.canvas; const b = c.graph._groups.map((g) => g._bounding ?? g.bounding);
                    const x0 = Math.min(...b.map((r) => r[0])), y0 = Math.min(...b.map((r) => r[1]));
                    const x1 = Math.max(...b.map((r) => r[0] + r[2])), y1 = Math.max(...b.map((r) => r[1] + r[3]));
                    const el = c.canvas, s = Math.min(el.clientWidth / (x1 - x0), el.clientHeight / (y1 - y0)) * 0.95;
                    c.ds.scale = s; c.ds.offset = [-x0 + (el.clientWidth / s - (x1 - x0)) / 2,
                                                   -y0 + (el.clientHeight / s - (y1 - y0)) / 2];
                    c.setDirty(true, true); c.draw(true, true);
                    const k = el.width / el.clientWidth;  // the backing store's pixels per CSS pixel
                    return [x0, y0, x1, y1].map((v, i) => (v + c.ds.offset[i % 2]) * s * k); }""")
                # the canvas's own pixels: ComfyUI's overlays (minimap, zoom buttons) are other elements
                data = page.evaluate("""() => { app.canvas.show_info = false; app.canvas.draw(true, true);
                    return app.canvas.canvas.toDataURL('image/png'); }""")
                _to_jpeg(base64.b64decode(data.split(",", 1)[1]), box, repo / TEMPLATES_DIR / f"{name}.jpg")
        finally:
            browser.close()


def _to_jpeg(png: bytes, box: list[float], jpg: Path) -> None:
    """The graph's bounding box of the canvas picture (``box``: left, top, right, bottom), as a small JPEG."""
    from PIL import Image

    with Image.open(io.BytesIO(png)) as whole:
        margin = 12
        im = whole.crop((max(0, int(box[0]) - margin), max(0, int(box[1]) - margin),
                         min(whole.width, int(box[2]) + margin), min(whole.height, int(box[3]) + margin)))
        im.convert("RGB").resize(_fit(im.size), Image.LANCZOS).save(jpg, "JPEG", quality=82, optimize=True)


def _fit(size: tuple[int, int]) -> tuple[int, int]:
    scale = min(THUMBNAIL_SIZE[0] / size[0], THUMBNAIL_SIZE[1] / size[1])
    return max(1, round(size[0] * scale)), max(1, round(size[1] * scale))


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m xpufleet.server.comfy.make_templates", description=__doc__)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when a template is stale")
    parser.add_argument("--thumbnails", metavar="URL", help="a running ComfyUI with the plugin: render the .jpg files")
    args = parser.parse_args(argv)
    if args.check and args.thumbnails:
        parser.error("--check and --thumbnails exclude each other")
    stale = write_templates(REPO, check=args.check)
    if args.check:
        for name in stale:
            print(f"{TEMPLATES_DIR}/{name}.json is stale: run python -m xpufleet.server.comfy.make_templates",
                  file=sys.stderr)
        return 1 if stale else 0
    print(f"wrote {len(stale)} template(s): {', '.join(stale) or 'none changed'}")
    if args.thumbnails:
        thumbnails(REPO, args.thumbnails, sorted(sample_graphs(REPO / SAMPLES_DIR)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
