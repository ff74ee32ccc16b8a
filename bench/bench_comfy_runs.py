"""ComfyUI workflows on fleet cards (issue 30): what the queue costs, what a warm instance saves, and how 8
runs spread over two cards compare with one ComfyUI running them in turn.

    COMFYUI_DIR=... COMFYUI_PYTHON=... python bench/bench_comfy_runs.py [--reps 10] [--cold-reps 3] [--json OUT]

One sidecar and one agent with two simulated cards and ``--comfyui`` (the test suite's harness,
tests/server/fleet_harness.py), on loopback. Every figure alternates its two sides within one run, and
each prompt differs (the EmptyImage colour) so ComfyUI's cache never answers for it:

1. **Queue overhead**: from just before ``POST /api/runs`` to the run's first ``node_started`` event on a
   warm instance, against the same prompt posted straight to that instance's ``/prompt`` and its first
   ``executing`` message over the instance's own websocket. Goal: the fleet's p50 at most 50 ms more.
2. **Warm vs cold**: submit -> first node for the second run of a workflow on a warm instance, against
   the same after the instance was killed (the run starts a fresh one). Goal: the warm one skips the start.
3. **Throughput**: 8 runs of a CPU-heavy core-node workflow (a chain of lanczos rescales) queued to
   ``any`` over the two cards, against the same 8 prompts queued to one instance's ``/prompt`` in turn.
   On 2 cores the goal is >= 1.6x; the figure shows how it scales with cards on this machine. A third side
   feeds both instances straight (half the prompts each, no queue): the machine's own ceiling.

Simulated cards run on the CPU: every figure here is a CPU figure, none is a GPU measurement.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
from benchlib import tests_module, verdict

ROOT = Path(__file__).resolve().parents[1]
WORKER = "bench-box"
TERMINAL = {"succeeded", "failed", "cancelled", "interrupted"}


def image_graph(color: int) -> dict[str, Any]:
    """EmptyImage -> ImageScale -> SaveImage: core nodes, no weights, a few ms of work."""
    return {
        "1": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 64, "batch_size": 1, "color": color}},
        "2": {"class_type": "ImageScale", "inputs": {"image": ["1", 0], "upscale_method": "bilinear",
                                                     "width": 96, "height": 96, "crop": "disabled"}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "bench"}},
    }


def heavy_graph(color: int, steps: int) -> dict[str, Any]:
    """A chain of big lanczos rescales (PIL, one core each): seconds of CPU work per run."""
    graph: dict[str, Any] = {"1": {"class_type": "EmptyImage",
                                   "inputs": {"width": 64, "height": 64, "batch_size": 1, "color": color}}}
    prev = "1"
    for i in range(steps):
        node = str(10 + i)
        side = 2048 + (i % 2) * 64
        graph[node] = {"class_type": "ImageScale", "inputs": {"image": [prev, 0], "upscale_method": "lanczos",
                                                             "width": side, "height": side, "crop": "disabled"}}
        prev = node
    graph["99"] = {"class_type": "ImageScale", "inputs": {"image": [prev, 0], "upscale_method": "bilinear",
                                                         "width": 32, "height": 32, "crop": "disabled"}}
    graph["100"] = {"class_type": "SaveImage", "inputs": {"images": ["99", 0], "filename_prefix": "heavy"}}
    return graph


class Colours:
    """A new EmptyImage colour for every prompt (ComfyUI caches a prompt it has seen)."""

    def __init__(self) -> None:
        self.n = 1000

    def next(self) -> int:
        self.n += 1
        return self.n


def first_node_ts(sc: Any, run_id: str, timeout: float = 300.0) -> float:
    """The ``ts`` of the run's first ``node_started`` event (long-polled), then the run's end awaited."""
    deadline = time.monotonic() + timeout
    cursor, ts = 0, None
    while time.monotonic() < deadline:
        body = sc.ok("GET", f"/api/runs/{run_id}/events?cursor={cursor}&wait=2")
        cursor = body["cursor"]
        for e in body["events"]:
            if e["type"] == "node_started" and ts is None:
                ts = float(e["ts"])  # written by the run process as the instance said the node began
        if ts is not None and body["status"] in TERMINAL:
            if body["status"] != "succeeded":
                raise SystemExit(f"run {run_id} ended {body['status']}: {sc.run(run_id).get('error')}")
            return ts
        if body["status"] in TERMINAL and ts is None:
            raise SystemExit(f"run {run_id} ended {body['status']} before a node started: {sc.run(run_id).get('error')}")
    raise SystemExit(f"run {run_id}: no end within {timeout} s")


def spec_of(home: Path, run_id: str) -> dict[str, Any]:
    return json.loads((home / "agents" / WORKER / "runs" / run_id / "spec.json").read_text())


async def direct_first_node(url: str, graph: dict[str, Any], timeout: float = 120.0) -> float:
    """Seconds from POST /prompt to the first ``executing`` message naming a node, then to the prompt's end."""
    client_id = uuid.uuid4().hex
    async with aiohttp.ClientSession() as session:
        ws_url = url.replace("http://", "ws://") + f"/ws?clientId={client_id}"
        async with session.ws_connect(ws_url, max_msg_size=0) as ws:
            began = time.time()
            async with session.post(url + "/prompt", json={"prompt": graph, "client_id": client_id}) as resp:
                answer = await resp.json()
                if resp.status != 200:
                    raise SystemExit(f"the instance refused the prompt: {answer}")
            prompt_id = answer["prompt_id"]
            first: float | None = None
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                msg = await ws.receive(timeout=timeout)
                if msg.type != aiohttp.WSMsgType.TEXT:
                    continue
                data = json.loads(msg.data)
                d = data.get("data") or {}
                if d.get("prompt_id") != prompt_id:
                    continue
                if data.get("type") == "executing" and d.get("node") is not None and first is None:
                    first = time.time() - began
                if data.get("type") == "execution_success" or (data.get("type") == "executing" and d.get("node") is None):
                    assert first is not None
                    return first
                if data.get("type") in ("execution_error", "execution_interrupted"):
                    raise SystemExit(f"the direct prompt failed: {d}")
    raise SystemExit("the direct prompt did not end in time")


async def direct_in_turn(url: str, graphs: list[dict[str, Any]], timeout: float = 1800.0) -> float:
    """Seconds for one instance to run ``graphs``, queued at once to its own ``/prompt`` (it runs them in turn)."""
    client_id = uuid.uuid4().hex
    async with aiohttp.ClientSession() as session:
        ws_url = url.replace("http://", "ws://") + f"/ws?clientId={client_id}"
        async with session.ws_connect(ws_url, max_msg_size=0) as ws:
            began = time.monotonic()
            pending = set()
            for g in graphs:
                async with session.post(url + "/prompt", json={"prompt": g, "client_id": client_id}) as resp:
                    pending.add((await resp.json())["prompt_id"])
            while pending and time.monotonic() - began < timeout:
                msg = await ws.receive(timeout=timeout)
                if msg.type != aiohttp.WSMsgType.TEXT:
                    continue
                data = json.loads(msg.data)
                d = data.get("data") or {}
                if data.get("type") == "execution_success" or (data.get("type") == "executing" and d.get("node") is None):
                    pending.discard(d.get("prompt_id"))
                elif data.get("type") in ("execution_error", "execution_interrupted"):
                    raise SystemExit(f"a direct prompt failed: {d}")
            return time.monotonic() - began


def fleet_many(sc: Any, graphs: list[dict[str, Any]], timeout: float = 1800.0) -> tuple[float, dict[str, int]]:
    """Seconds for the fleet to run ``graphs`` queued at once to ``any``; how many ran on each card."""
    began = time.monotonic()
    ids = [sc.submit(g, target="any") for g in graphs]
    cards: dict[str, int] = {}
    for rid in ids:
        run = sc.wait_run(rid, TERMINAL, timeout=timeout)
        if run["status"] != "succeeded":
            raise SystemExit(f"run {rid} ended {run['status']}: {run.get('error')}")
        card = ((run.get("execution_facts") or {}).get("comfyui") or {}).get("instance", "?")
        cards[card] = cards.get(card, 0) + 1
    return time.monotonic() - began, cards


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=10, help="queue-overhead pairs")
    ap.add_argument("--cold-reps", type=int, default=3, help="warm/cold pairs (each cold side starts a ComfyUI)")
    ap.add_argument("--runs", type=int, default=8, help="runs of the throughput workflow")
    ap.add_argument("--steps", type=int, default=6, help="lanczos rescales in the throughput workflow")
    ap.add_argument("--pairs", type=int, default=1, help="throughput rounds (its three sides, their order reversed each round)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    harness = tests_module("comfy_host/comfy_harness.py")
    found = harness.configured()
    if found is None:
        print(f"bench_comfy_runs: skipped: {harness.SKIP_REASON}")
        return 0  # `make bench` on a machine without a ComfyUI
    comfy_dir, python = found
    fh = tests_module("server/fleet_harness.py")
    print(f"load average before: {os.getloadavg()}")
    colours = Colours()
    with tempfile.TemporaryDirectory(prefix="bench-comfy-") as tmp:
        fleet = fh.Fleet(Path(tmp))
        try:
            sc = fleet.sidecar()
            agent = fleet.agent("--name", WORKER, "--simulate", "cuda:0=24,cuda:1=24", "--comfyui", str(comfy_dir),
                                "--comfyui-python", str(python))
            agent.wait_connected()
            fh_home = fleet.home
            # both instances warm, and the URL of cuda:0's
            urls = {}
            for card in ("cuda:0", "cuda:1"):
                rid = sc.submit(image_graph(colours.next()), target={"worker": WORKER, "devices": [card]})
                deadline = time.monotonic() + 300
                while sc.run(rid)["status"] not in TERMINAL and time.monotonic() < deadline:
                    time.sleep(0.2)
                if sc.run(rid)["status"] != "succeeded":
                    raise SystemExit(f"warm-up on {card} failed: {sc.run(rid).get('error')}")
                urls[card] = spec_of(fh_home, rid)["comfyui"]["url"]
            target = {"worker": WORKER, "devices": ["cuda:0"]}

            def fleet_first() -> float:
                began = time.time()
                rid = sc.submit(image_graph(colours.next()), target=target)
                return first_node_ts(sc, rid) - began

            def direct_first() -> float:
                return asyncio.run(direct_first_node(urls["cuda:0"], image_graph(colours.next())))

            fleet_s, direct_s = [], []
            for i in range(args.reps):  # sides alternated
                for side in ((fleet_first, fleet_s), (direct_first, direct_s))[:: 1 if i % 2 == 0 else -1]:
                    side[1].append(side[0]())
            over = (statistics.median(fleet_s) - statistics.median(direct_s)) * 1e3
            print(f"\n1. queue overhead, submit -> first node on a warm instance ({args.reps} pairs):")
            print(f"   fleet p50 {statistics.median(fleet_s) * 1e3:.1f} ms, direct /prompt p50 "
                  f"{statistics.median(direct_s) * 1e3:.1f} ms: {over:+.1f} ms (goal <= +50 ms: {verdict(over <= 50)})")

            warm_s, cold_s = [], []
            rid = sc.submit(image_graph(colours.next()), target=target)
            first_node_ts(sc, rid)
            for i in range(args.cold_reps):
                for side in ("warm", "cold")[:: 1 if i % 2 == 0 else -1]:
                    if side == "cold":  # the instance killed by PID: the next run starts a fresh one
                        os.kill(spec_of(fh_home, rid)["comfyui"]["pid"], signal.SIGKILL)
                        time.sleep(1.0)
                    began = time.time()
                    rid = sc.submit(image_graph(colours.next()), target=target)
                    took = first_node_ts(sc, rid) - began
                    cold = ((sc.run(rid).get("execution_facts") or {}).get("comfyui") or {}).get("cold_start")
                    (cold_s if side == "cold" else warm_s).append(took)
                    if (side == "cold") != bool(cold):
                        print(f"   note: a {side} run reported cold_start={cold}")
            urls["cuda:0"] = spec_of(fh_home, rid)["comfyui"]["url"]  # the fresh instance of the last cold side
            print(f"\n2. warm vs cold, submit -> first node ({args.cold_reps} pairs):")
            print(f"   warm p50 {statistics.median(warm_s):.3f} s, cold p50 {statistics.median(cold_s):.2f} s "
                  f"(goal: warm skips the start: {verdict(statistics.median(warm_s) * 5 < statistics.median(cold_s))})")

            ratios, ceilings, spreads = [], [], []
            sides = ("fleet", "single", "split")
            for i in range(args.pairs):
                order = sides if i % 2 == 0 else sides[::-1]
                took = {}
                for side in order:
                    graphs = [heavy_graph(colours.next(), args.steps) for _ in range(args.runs)]
                    if side == "fleet":
                        took["fleet"], cards = fleet_many(sc, graphs)
                        spreads.append(cards)
                    elif side == "single":
                        took["single"] = asyncio.run(direct_in_turn(urls["cuda:0"], graphs))
                    else:  # this machine's ceiling: both instances fed straight, half the prompts each
                        half = len(graphs) // 2

                        async def split(gs: list[dict[str, Any]] = graphs, h: int = half) -> float:
                            done = await asyncio.gather(direct_in_turn(urls["cuda:0"], gs[:h]),
                                                        direct_in_turn(urls["cuda:1"], gs[h:]))
                            return max(done)

                        took["split"] = asyncio.run(split())
                ratios.append(took["single"] / took["fleet"])
                ceilings.append(took["single"] / took["split"])
                print(f"   round {i + 1}: fleet over 2 cards {took['fleet']:.1f} s {cards}, one ComfyUI in turn "
                      f"{took['single']:.1f} s: {ratios[-1]:.2f}x; both instances fed straight {took['split']:.1f} s: "
                      f"{ceilings[-1]:.2f}x")
            ratio = statistics.median(ratios)
            print(f"\n3. throughput, {args.runs} runs of {args.steps} lanczos rescales: median {ratio:.2f}x over 2 "
                  f"cards vs one ComfyUI (goal >= 1.6x on 2 cores: {verdict(ratio >= 1.6)}); this machine's "
                  f"ceiling (the two instances fed straight, no queue): {statistics.median(ceilings):.2f}x")
            print(f"load average after: {os.getloadavg()}")
            if args.json:
                args.json.write_text(json.dumps({
                    "queue_overhead": {"fleet_s": fleet_s, "direct_s": direct_s, "p50_over_ms": over},
                    "warm_cold": {"warm_s": warm_s, "cold_s": cold_s},
                    "throughput": {"ratios": ratios, "ceilings": ceilings, "cards": spreads, "runs": args.runs,
                                   "steps": args.steps},
                }, indent=1))
        finally:
            fleet.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
