"""Front-end benchmark (docs/comfyui.md): in the real ComfyUI, driven by Debian's Chromium.

1. Widget change -> the capsule's new value: 20 edits of a checkpoint widget (the LiteGraph path a
   canvas edit takes, ``widget.setValue``), each timed in the page from the edit to the moment the
   capsule shows the new prediction; p50 and p90, for a worker's simulated card (ComfyUI asks the
   sidecar for its figures) and for this machine. Goal: p50 <= 300 ms (the 120 ms debounce included).
2. Page load of ComfyUI with the plugin and without it (the same ComfyUI started without the plugin in
   custom_nodes/), 15 loads each (5 left the ratio within +-12% run to run), alternating, each in a fresh browser context: time from navigation to
   ComfyUI's app ready (graph set up, Run button drawn); medians and their ratio. Goal: <= +5%.

Figures are printed, not asserted. Needs COMFYUI_DIR and COMFYUI_PYTHON (as the comfy tests) and
/usr/bin/chromium; without them it says so and exits 0.

    python bench/bench_frontend.py [--changes 20] [--loads 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from benchlib import tests_module  # bench/ (this script's folder) is on sys.path

CHANGE_JS = """async ([value, target, timeoutMs]) => {
    const n = app.graph.nodes.find((x) => x.type === 'CheckpointLoaderSimple');
    const w = n.widgets.find((x) => x.name === 'ckpt_name');
    const cap = document.querySelector('[data-xpufleet=capsule]');
    const done = () => cap.dataset.mPeak === target;
    const t0 = performance.now();
    w.setValue(value, { e: null, node: n, canvas: app.canvas });
    await new Promise((resolve, reject) => {
        if (done()) return resolve();
        const timer = setTimeout(() => { ob.disconnect(); reject(new Error('no new capsule value')); }, timeoutMs);
        const ob = new MutationObserver(() => { if (done()) { clearTimeout(timer); ob.disconnect(); resolve(); } });
        ob.observe(cap, { attributes: true });
    });
    return performance.now() - t0;
}"""
READY_JS = "() => (window.app && window.app.graph && document.querySelector('.comfyui-queue-button')) ? performance.now() : false"


def load_harness():
    return tests_module("frontend/browser_harness.py")


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def widget_changes(bh, browser, host, device: str, n: int) -> list[float]:
    bh.comfy_settings(host, {"Comfy.TutorialCompleted": True, "XPUFleet.Predict.Device": device,
                             "XPUFleet.Capsule.RefreshSeconds": 600})  # no periodic refresh in between
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    try:
        page = bh.open_comfy(context, host.url)
        bh.load_api_graph(page, {"1": {"class_type": "CheckpointLoaderSimple",
                                       "inputs": {"ckpt_name": "small.safetensors"}}}, "bench")
        try:
            page.wait_for_function("() => document.querySelector('[data-xpufleet=capsule]').dataset.mPeak === '2'",
                                   timeout=bh.WAIT_S * 1000)
        except Exception:
            raise RuntimeError(f"the capsule did not show the graph's prediction: {bh.capsule(page)}, "
                               f"{page.locator('[data-xpufleet=capsule-tooltip]').inner_text()}") from None
        times = []
        for i in range(n):
            value, target = ("big.safetensors", "60") if i % 2 == 0 else ("small.safetensors", "2")
            times.append(page.evaluate(CHANGE_JS, [value, target, bh.WAIT_S * 1000]))
        return times
    finally:
        context.close()


def page_load(bh, browser, url: str) -> float:
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    try:
        page = context.new_page()
        page.goto(url, wait_until="commit")
        return page.wait_for_function(READY_JS, polling="raf", timeout=bh.WAIT_S * 1000).json_value()
    finally:
        context.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--changes", type=int, default=20)
    ap.add_argument("--loads", type=int, default=15)
    args = ap.parse_args()
    bh = load_harness()
    problem = bh.browser_problem()
    found = bh.comfy_harness.configured()
    if problem or found is None:
        print(f"bench_frontend: skipped: {problem or bh.comfy_harness.SKIP_REASON}")
        return 0
    comfy_dir, python = found
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="xpufleet-bench-frontend-") as tmp:
        work = Path(tmp)
        bh.comfy_harness.install_plugin_deps(python, work)
        host = bh.comfy_harness.ComfyUI(comfy_dir, python, work / "base", work / "home")
        checkpoints = work / "base" / "models" / "checkpoints"
        checkpoints.mkdir(parents=True)
        for name, size in (("small.safetensors", 2 * 1024**3), ("big.safetensors", 60 * 1024**3)):
            with open(checkpoints / name, "wb") as f:
                f.truncate(size)

        class Bare(bh.comfy_harness.ComfyUI):
            def prepare(self) -> None:  # no plugin in custom_nodes/
                (self.base / "custom_nodes").mkdir(parents=True, exist_ok=True)
                self.home.mkdir(parents=True, exist_ok=True)

        bare = Bare(comfy_dir, python, work / "bare", work / "bare-home")
        fleet = None
        try:
            host.start()
            bare.start()
            bh.comfy_settings(bare, {"Comfy.TutorialCompleted": True})
            fleet = bh.Fleet(host.home).start()
            fleet.add_agent("gpu-box", "cuda:0=24,cuda:1=24")
            with sync_playwright() as p:
                browser = bh.launch(p)
                try:
                    print(f"== widget change -> capsule's new value, {args.changes} changes each")
                    for label, device in (("worker card gpu-box/cuda:0 (simulated)", "gpu-box/cuda:0"),
                                          ("this machine (no GPU here)", "")):
                        t = widget_changes(bh, browser, host, device, args.changes)
                        print(f"  {label:<40} p50 {statistics.median(t):6.0f} ms   p90 {pct(t, 0.9):6.0f} ms   "
                              f"min {min(t):5.0f}   max {max(t):5.0f}   (goal p50 <= 300 ms)")
                    bh.comfy_settings(host, {"XPUFleet.Capsule.RefreshSeconds": 5})
                    print(f"== page load to ComfyUI's app ready, {args.loads} loads each (alternating)")
                    with_plugin, without = [], []
                    page_load(bh, browser, host.url)  # warm both servers once (first requests compile caches)
                    page_load(bh, browser, bare.url)
                    for i in range(args.loads):
                        order = [(with_plugin, host.url), (without, bare.url)]
                        for bucket, url in (order if i % 2 == 0 else order[::-1]):
                            bucket.append(page_load(bh, browser, url))
                    m_with, m_without = statistics.median(with_plugin), statistics.median(without)
                    print(f"  with the plugin     median {m_with:7.0f} ms   {[round(x) for x in with_plugin]}")
                    print(f"  without the plugin  median {m_without:7.0f} ms   {[round(x) for x in without]}")
                    print(f"  ratio {m_with / m_without:.3f} (the plugin adds {100 * (m_with / m_without - 1):+.1f}%; goal <= +5%)")
                finally:
                    browser.close()
        finally:
            if fleet is not None:
                fleet.stop()
            bare.stop()
            host.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
