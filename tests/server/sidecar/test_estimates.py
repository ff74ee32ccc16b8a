"""``POST /api/estimates``: the dialog's suggestion (measured default or static estimate, every item, the
total), never applied, built off the event loop; and ``xpufleet estimate``'s rendering of it."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import scripted_agent as sa  # registered by tests/server/conftest.py

from xpufleet.server.cli import estimate as estimate_cli
from xpufleet.server.cli.main import main as cli_main
from xpufleet.server.ledger.graph_key import KEY_VERSION

EXAMPLE = Path(__file__).resolve().parents[3] / "samples" / "mlp_digits.json"


async def test_estimate_lists_every_item_and_then_the_measured_default_once_a_run_has_a_peak(xpufleet_home):
    graph = json.loads(EXAMPLE.read_text())

    async with sa.Sidecar(xpufleet_home) as sc:
        status, est = await sc.call("POST", "/api/estimates", {"graph": graph})
        assert status == 200, est
        assert est["source"] == "estimate" and est["applied"] is False and est["n_cards"] == 1
        names = [i["name"] for i in est["items"]]
        assert names[0] == "weights" and names[-2:] == ["allocator", "cuda_libraries"]
        assert abs(sum(i["bytes"] for i in est["items"]) / 1024**3 - est["total_gib"]) < 0.01
        assert est["budget_gib"] == est["total_gib"] and est["graph_key"].startswith(f"{KEY_VERSION}-")
        # nothing was applied: a run without a budget on an exclusive card still has none
        agent = sa.ScriptedAgent(sc, "gpu-box", sa.cards(2, simulated=False))
        await agent.connect()
        await sc.share("gpu-box", "cuda:1")
        status, s2 = await sc.call("POST", "/api/estimates", {"graph": graph, "options": {
            "target": {"worker": "gpu-box", "devices": ["cuda:1"]}}})
        assert status == 200 and s2["shared_cards"] is True and s2["source"] == "estimate"
        status, body = await sc.submit(graph, worker="gpu-box", devices=["cuda:1"], memory_gib=2)
        run_id = body["run_id"]
        await agent.recv_type("start_run")
        await agent.started(run_id)
        await agent.finish(run_id, "succeeded", sa.cuda_peak(1.5, "cuda:0"))
        await sc.status(run_id, {"succeeded"})
        status, s3 = await sc.call("POST", "/api/estimates", {"graph": graph, "options": {
            "target": {"worker": "gpu-box", "devices": ["cuda:1"]}}})
        assert status == 200 and s3["source"] == "measured" and s3["from_run"] == run_id
        assert s3["budget_gib"] == 1.8 and [i["name"] for i in s3["items"]] == ["measured_peak", "headroom"]
        assert "elapsed_s" not in s3  # never built when a measured peak exists
        # bad input: 400 naming what to fix
        status, bad = await sc.call("POST", "/api/estimates", {"options": {}})
        assert status == 400 and bad["error"].startswith("graph: missing")
        status, bad = await sc.call("POST", "/api/estimates", {"graph": graph, "options": {"target": "nobody"}})
        assert status == 400 and "unknown worker 'nobody'" in bad["error"]
        await agent.close()


async def test_the_estimate_runs_off_the_event_loop(xpufleet_home, monkeypatch):
    """While an estimate is being built, the sidecar keeps answering (the build runs in a worker thread)."""
    from xpufleet.server.ledger import budget
    from xpufleet.server.sidecar.routes import estimates

    release = threading.Event()
    real = budget.suggest

    def slow(*args, **kw):
        assert release.wait(30), "the health check never came through while the estimate ran"
        return real(*args, **kw)

    monkeypatch.setattr(estimates, "suggest", slow)
    graph = json.loads(EXAMPLE.read_text())

    async with sa.Sidecar(xpufleet_home) as sc:
        pending = asyncio.create_task(sc.call("POST", "/api/estimates", {"graph": graph}))
        await asyncio.sleep(0.05)
        status, _ = await asyncio.wait_for(sc.call("GET", "/api/health"), 10)
        assert status == 200 and not pending.done()
        release.set()
        status, est = await asyncio.wait_for(pending, 60)
        assert status == 200 and est["source"] == "estimate"


def test_cli_estimate_local_prints_every_item_and_the_total(capsys):
    assert cli_main(["estimate", str(EXAMPLE), "--local"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("static estimate, per card:") and "  total " in out and "cuda_libraries" in out
    assert "--memory-source estimate (not applied unless you send it)" in out
    assert cli_main(["estimate", str(EXAMPLE), "--local", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["source"] == "estimate" and answer["applied"] is False


def test_rendering_a_measured_and_a_rough_suggestion():
    measured = {"source": "measured", "from_run": "a1b2c3d4e5", "n_cards": 2, "budget_gib": 7.2, "total_gib": 7.2,
                "items": [{"name": "measured_peak", "gib": 6.0, "label": "peak of run a1b2c3d4 on 2 cards"},
                          {"name": "headroom", "gib": 1.2, "label": "+20%"}], "reasons": [], "notes": []}
    lines = estimate_cli.render(measured)
    assert lines[0] == "measured: the peak of run a1b2c3d4 of the same graph on 2 cards + 20%, per card (2 cards):"
    assert lines[-1] == "queue it without --memory-gib: the server applies this default itself"
    rough = {"source": "estimate", "rough": True, "budget_gib": None, "total_gib": 0.5, "n_cards": 1,
             "items": [{"name": "weights", "gib": 0.5, "label": "x"}], "reasons": ["no batch size"], "notes": []}
    lines = estimate_cli.render(rough)
    assert "  rough: no batch size" in lines and lines[-1].startswith("rough: the budget field stays empty")
