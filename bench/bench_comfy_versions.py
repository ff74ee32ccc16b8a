"""Training time of the same canvas prompt in two ComfyUI builds (issue 31, item 5), with a profile of each.

    COMFYUI_DIR=... COMFYUI_PYTHON=... COMFYUI2_DIR=... COMFYUI2_PYTHON=... \\
        python bench/bench_comfy_versions.py [--pairs 5] [--py-spy PATH] [--json OUT]

Both ComfyUIs (the pair of `make test`, docs/testing.md) are started with the plugin, as
tests/comfy_host does, and stay up; then ``--pairs`` times, alternating which goes first, each runs
samples/mlp_digits.json (its TrainingLoop seeded, so the same batches) after ``POST /free`` so nothing is
cached. Figures: the TrainingLoop's own ``duration_s`` (the training loop, not ComfyUI's queue) and the
prompt's wall time; medians per side and the median of the per-pair ratios (B/A), with the load average.

``--py-spy PATH``: one more run per side under ``py-spy record`` (the ComfyUI process, 100 Hz, idle
threads left out); prints each side's top functions by own samples and by samples inside them, and the
difference between the sides.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GRAPH = json.loads((ROOT / "samples" / "mlp_digits.json").read_text())
LOOP = "8"  # the TrainingLoop of samples/mlp_digits.json


def _harness() -> Any:
    spec = importlib.util.spec_from_file_location("comfy_harness", ROOT / "tests" / "comfy_host" / "comfy_harness.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["comfy_harness"] = module
    spec.loader.exec_module(module)
    return module


def _version(comfy_dir: Path) -> str:
    text = (comfy_dir / "comfyui_version.py").read_text()
    return text.split("=", 1)[1].strip().strip("\"'") if "=" in text else "?"


def _free(host: Any) -> None:
    """ComfyUI's own "free memory": the executor is reset, so the next prompt runs every node."""
    req = urllib.request.Request(host.url + "/free", data=b'{"free_memory": true, "unload_models": true}',
                                 headers={"Content-Type": "application/json"}, method="POST")
    urllib.request.urlopen(req, timeout=30).read()


def _graph() -> dict[str, Any]:
    graph = json.loads(json.dumps(GRAPH))
    graph[LOOP]["inputs"].update(checkpoint_every=0, tensorboard=False)  # the loop itself, no file writes
    return graph


def one_run(host: Any) -> dict[str, float]:
    _free(host)
    time.sleep(1.0)  # let the prompt worker pick up the flags before the next prompt (it reads them between prompts)
    t0 = time.perf_counter()
    run = host.run_prompt(_graph())
    wall = time.perf_counter() - t0
    assert run.succeeded, json.dumps(run.history.get("status"))[:2000]
    metrics = run.metrics(LOOP)
    return {"duration_s": float(metrics["duration_s"]), "wall_s": wall, "load1": os.getloadavg()[0],
            "steps": metrics["steps"]}


def profile(host: Any, py_spy: str, out: Path) -> Path:
    """One run under py-spy; the collapsed stacks (``raw``) in ``out``."""
    _free(host)
    time.sleep(1.0)
    rec = subprocess.Popen([py_spy, "record", "--pid", str(host.proc.pid), "--rate", "100", "--format", "raw",
                            "--output", str(out), "--nonblocking"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True)
    time.sleep(2.0)  # py-spy attaches
    try:
        run = host.run_prompt(_graph())
        assert run.succeeded
    finally:
        rec.send_signal(2)  # SIGINT: py-spy writes what it has and exits
        _, err = rec.communicate(timeout=60)
    if not out.is_file():
        raise RuntimeError(f"py-spy wrote nothing: {err[-2000:]}")
    return out


def summarize(raw: Path, top: int = 25) -> dict[str, Any]:
    """Own and inclusive samples per function (``name (file:line)`` without the line) from collapsed stacks."""
    own: collections.Counter[str] = collections.Counter()
    inside: collections.Counter[str] = collections.Counter()
    elsewhere: collections.Counter[str] = collections.Counter()  # busy samples of the process's other threads
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [_frame(f) for f in stack.split(";")]
        if not any("nodes/trainer.py" in f for f in frames):
            elsewhere[frames[-1]] += n  # ComfyUI's server loop, its other threads: not the training loop
            continue
        total += n
        own[frames[-1]] += n
        for f in set(frames):
            inside[f] += n
    return {"samples": total, "own": own.most_common(top), "inside": inside.most_common(top),
            "other_threads_samples": sum(elsewhere.values()), "other_threads": elsewhere.most_common(10)}


def _frame(text: str) -> str:
    # py-spy raw frames: "function (path/to/file.py:123)"
    name, _, where = text.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    for cut in ("site-packages/", "ComfyUI/", "/xpufleet/", "h8/"):
        if cut in path:
            path = path.split(cut, 1)[1]
            break
    return f"{name} ({path})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--py-spy", default=None, help="the py-spy executable: profile one more run per side")
    ap.add_argument("--json", default=None, help="write the figures here")
    args = ap.parse_args()
    harness = _harness()
    sides = []
    for dir_var, py_var in (("COMFYUI_DIR", "COMFYUI_PYTHON"), ("COMFYUI2_DIR", "COMFYUI2_PYTHON")):
        if not os.environ.get(dir_var) or not os.environ.get(py_var):
            print(f"no ComfyUI pair to compare: set {dir_var} and {py_var} (docs/testing.md); nothing measured")
            return 0  # `make bench` on a machine without the two builds
        sides.append((Path(os.environ[dir_var]), Path(os.environ[py_var])))
    work = Path(tempfile.mkdtemp(prefix="xpufleet-bench-comfy-"))
    hosts = []
    try:
        for i, (comfy_dir, python) in enumerate(sides):
            harness.install_plugin_deps(python, work)
            host = harness.ComfyUI(comfy_dir, python, work / f"base{i}", work / f"home{i}").start()
            host.version = _version(comfy_dir)
            hosts.append(host)
            print(f"ComfyUI {host.version} up in {host.startup_s:.1f} s (pid {host.proc.pid})", flush=True)
        for host in hosts:  # a first run each: imports, dataset download/cache, allocator warm-up
            one_run(host)
        results: dict[str, list[dict[str, float]]] = {h.version: [] for h in hosts}
        ratios = []
        for p in range(args.pairs):
            order = hosts if p % 2 == 0 else hosts[::-1]
            pair = {}
            for host in order:
                pair[host.version] = one_run(host)
                results[host.version].append(pair[host.version])
            a, b = (pair[h.version]["duration_s"] for h in hosts)
            ratios.append(b / a)
            print(f"pair {p + 1}: " + ", ".join(f"{v} {r['duration_s']:.2f} s (wall {r['wall_s']:.2f} s, load "
                                                 f"{r['load1']:.2f})" for v, r in pair.items()), flush=True)
        summary: dict[str, Any] = {"pairs": args.pairs, "ratio_median": statistics.median(ratios),
                                   "ratios": ratios, "sides": {}}
        for version, runs in results.items():
            summary["sides"][version] = {
                "duration_s_median": statistics.median(r["duration_s"] for r in runs),
                "wall_s_median": statistics.median(r["wall_s"] for r in runs),
                "load1_median": statistics.median(r["load1"] for r in runs), "runs": runs}
            print(f"{version}: TrainingLoop duration_s median {summary['sides'][version]['duration_s_median']:.2f} s, "
                  f"wall {summary['sides'][version]['wall_s_median']:.2f} s, "
                  f"load {summary['sides'][version]['load1_median']:.2f}")
        print(f"ratio {hosts[1].version}/{hosts[0].version}: median {summary['ratio_median']:.2f} "
              f"({', '.join(f'{r:.2f}' for r in ratios)})")
        if args.py_spy:
            summary["profiles"] = {}
            for host in hosts:
                raw = profile(host, args.py_spy, work / f"profile-{host.version}.txt")
                summary["profiles"][host.version] = prof = summarize(raw)
                print(f"\n== {host.version}: {prof['samples']} samples in the training thread; top by own samples")
                for name, n in prof["own"][:15]:
                    print(f"  {100 * n / max(prof['samples'], 1):5.1f}%  {name}")
                print("   top by samples inside")
                for name, n in prof["inside"][:20]:
                    print(f"  {100 * n / max(prof['samples'], 1):5.1f}%  {name}")
                print(f"   other threads, busy: {prof['other_threads_samples']} samples")
                for name, n in prof["other_threads"][:8]:
                    print(f"  {n:6d}  {name}")
        if args.json:
            Path(args.json).write_text(json.dumps(summary, indent=2))
    finally:
        for host in hosts:
            host.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
