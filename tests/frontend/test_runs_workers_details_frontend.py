"""The Runs and Workers panels' details on the standalone page (issue 13, docs/comfyui.md): a ddp run on
this server warns ``ddp_not_available`` with the server's reason; a run on a simulated card shows its
per-card peak, labelled simulated, when its peak cell is hovered or focused; a card shared by memory
draws its bar with the reserved and free-for-new-budgets segments the server's ledger reports. A real
sidecar and an agent simulating CUDA cards (tests/frontend/conftest.py); Debian's Chromium."""

from __future__ import annotations

import time
from decimal import ROUND_HALF_UP, Decimal

import browser_harness as bh  # registered by tests/frontend/conftest.py
import pytest

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]

WAIT_MS = int(bh.WAIT_S * 1000)
SETTINGS = {"XPUFleet.Predict.Device": "gpu-box/cuda:0", "XPUFleet.Capsule.RefreshSeconds": 2,
            "XPUFleet.Language": "en"}
# the page's texts (web/lib/i18n.mjs, en) that these tests compare with the server's figures
BAR_RESERVED = "reserved and running budgets"
BAR_FREE = "free for new budgets (after the CUDA context)"
BAR_IN_USE = "in use"


def fixed(value: float, digits: int) -> str:
    """JavaScript's ``toFixed``: the exact binary value rounded, a tie to the larger."""
    return str(Decimal(value).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP))


def gib(value: float, digits: int = 1) -> str:
    """The page's GiB formatting (web/lib/format.mjs ``gib``)."""
    return f"{fixed(value, digits)} GiB"


def mem_gib(value: float) -> str:
    """web/lib/format.mjs ``memGib``: below 0.01 GiB in KiB/MiB (``bytes``), else GiB with 2 digits."""
    if not 0 < value < 0.01:
        return gib(value, 2)
    v, units = value * 1024**3, ["B", "KiB", "MiB"]
    i = 0
    while v >= 1024 and i < len(units) - 1:
        v, i = v / 1024, i + 1
    return f"{v:g} B" if i == 0 else f"{fixed(v, 1)} {units[i]}"


@pytest.fixture(scope="module")
def page(playwright_browser, standalone_fleet):
    with bh.standalone_page(playwright_browser, standalone_fleet, SETTINGS) as (page, log):
        yield page
    assert log.errors == [], log.errors  # no console error on the page through these tests


def open_run(page, run_id: str):
    page.click("[data-xpufleet=tab-runs]")
    runs = page.locator("[data-xpufleet=runs-panel]")
    runs.locator(f"[data-run-id='{run_id}'] .xf-run-pick").click(timeout=WAIT_MS)
    return runs


def test_a_ddp_run_on_this_server_shows_the_servers_ddp_not_available_reason(page, standalone_fleet, screenshots):
    graph = bh.sidecar_harness.iris_graph(1, strategy="ddp")
    rid = standalone_fleet.sidecar.submit(graph, name="ddp here", target={"worker": "local"})
    run = standalone_fleet.sidecar.finish(rid, timeout=bh.WAIT_S)
    assert run["status"] == "succeeded", run
    warnings = [w for w in run["warnings"] if w["kind"] == "ddp_not_available"]
    assert len(warnings) == 1, run["warnings"]
    reason = warnings[0]["message"]
    assert "runs on this server (target local) train in one process" in reason  # the server says why
    runs = open_run(page, rid)
    runs.locator("[data-xpufleet=detail-status]", has_text="succeeded").wait_for(timeout=WAIT_MS)
    row_warning = runs.locator(f"[data-run-id='{rid}'] [data-kind=ddp_not_available]")
    assert row_warning.inner_text(timeout=WAIT_MS) == f"ddp_not_available: {reason}"
    detail_warning = runs.locator("[data-xpufleet=run-detail] [data-kind=ddp_not_available]")
    assert detail_warning.inner_text(timeout=WAIT_MS) == f"ddp_not_available: {reason}"
    page.screenshot(path=str(screenshots / "details-ddp-not-available.png"))


def test_a_simulated_cards_peak_shows_per_card_with_its_label_on_hover_and_focus(page, standalone_fleet, screenshots):
    rid = standalone_fleet.sidecar.submit(bh.sidecar_harness.iris_graph(2), name="peak on a sim card",
                                          target={"worker": "gpu-box", "devices": ["cuda:1"]})
    run = standalone_fleet.sidecar.finish(rid, timeout=bh.WAIT_S)
    assert run["status"] == "succeeded", run
    peak = run["peak_memory"]
    assert peak["measured"] is False and peak["simulated"] is True, peak  # simulated, never a measured figure
    assert "simulated card" in peak["label"] and "not a CUDA figure" in peak["label"]
    assert len(peak["devices"]) == 1 and all(v > 0 for v in peak["devices"].values()), peak
    runs = open_run(page, rid)
    runs.locator("[data-xpufleet=detail-status]", has_text="succeeded").wait_for(timeout=WAIT_MS)
    cell = runs.locator("[data-xpufleet=peak]")
    assert cell.inner_text(timeout=WAIT_MS) == "Peak memory: not measured (hover for why)"
    tip = cell.locator("[data-xpufleet=peak-detail]")
    assert not tip.is_visible()  # shown on hover or focus only
    # the server's figure as the page formats it: the in-run name (= the worker's card) and GiB
    aliases = run["execution_facts"].get("device_aliases") or {}
    [(name, value)] = peak["devices"].items()
    same = f" (= {aliases[name]})" if aliases.get(name, name) != name else ""
    per_card = f"{name}{same}: {mem_gib(value)}"
    assert not per_card.endswith(" 0.00 GiB")  # a real, non-zero figure never reads as zero
    cell.hover()
    tip.wait_for(state="visible", timeout=WAIT_MS)
    assert tip.inner_text().splitlines() == [peak["label"], per_card]
    assert cell.get_attribute("title") == f"{peak['label']}\n{per_card}"
    page.screenshot(path=str(screenshots / "details-simulated-peak-hover.png"))
    page.mouse.move(5, 5)
    tip.wait_for(state="hidden", timeout=WAIT_MS)
    cell.focus()  # the keyboard reaches the same figure
    tip.wait_for(state="visible", timeout=WAIT_MS)
    assert tip.inner_text().splitlines() == [peak["label"], per_card]
    assert per_card in cell.get_attribute("aria-label")
    page.locator("[data-xpufleet=tab-runs]").focus()


def server_card(fleet, worker: str, device: str) -> dict:
    workers = {w["name"]: w for w in fleet.call("GET", "/api/workers")["workers"]}
    return next(d for d in workers[worker]["devices"] if d["name"] == device)


def bar_titles(card) -> dict[str, str]:
    return card.evaluate("""(el) => Object.fromEntries([...el.querySelectorAll('[data-xpufleet=membar] .xf-seg')]
        .map((s) => [[...s.classList].find((c) => c.startsWith('xf-seg-')).slice(7), s.title]))""")


def expected_titles(memory: dict) -> dict[str, str]:
    return {"used": f"{BAR_IN_USE}: {gib(memory['in_use_gib'])}",
            "reserved": f"{BAR_RESERVED}: {gib(memory['reserved_gib'] + memory['running_gib'])}",
            "free": f"{BAR_FREE}: {gib(memory['free_for_budgets_gib'])}"}


def test_a_shared_cards_bar_shows_reserved_and_free_for_new_budgets_as_the_server_reports(page, standalone_fleet,
                                                                                          screenshots):
    standalone_fleet.call("PUT", "/api/workers/gpu-box/devices/cuda:1/mode", {"mode": "shared"})
    rid = None
    try:
        assert server_card(standalone_fleet, "gpu-box", "cuda:1")["mode"] == "shared"
        rid = standalone_fleet.sidecar.submit(bh.sidecar_harness.iris_graph(100000), name="budgeted",
                                              target={"worker": "gpu-box", "devices": ["cuda:1"], "memory_gib": 1})
        standalone_fleet.sidecar.wait_for(rid, "run_started", timeout=bh.WAIT_S)
        page.click("[data-xpufleet=tab-workers]")
        card = page.locator("[data-xpufleet=workers-panel] [data-worker=gpu-box]")
        bar = card.locator("[data-xpufleet=membar]")
        bar.wait_for(timeout=WAIT_MS)
        # the panel refreshes every 5 s: until it shows the budget the run holds on the card
        page.wait_for_function("""() => [...document.querySelectorAll('[data-worker=gpu-box] [data-xpufleet=membar] .xf-seg-reserved')]
            .some((s) => !s.title.endsWith(': 0.0 GiB'))""", timeout=WAIT_MS)
        deadline = time.monotonic() + bh.WAIT_S
        while True:  # the page and GET /api/workers each read the ledger: compare one refresh with one answer
            memory = server_card(standalone_fleet, "gpu-box", "cuda:1")["memory"]
            shown = bar_titles(card)
            if shown == expected_titles(memory) or time.monotonic() > deadline:
                break
            page.wait_for_function(f"() => document.querySelector('[data-xpufleet=workers-panel]').dataset.refreshes"
                                   f" !== '{page.locator('[data-xpufleet=workers-panel]').get_attribute('data-refreshes')}'",
                                   timeout=WAIT_MS)
        assert memory["admits_by_memory"] is True and memory["shared"] is True, memory
        assert memory["running_gib"] + memory["reserved_gib"] >= 1.0, memory  # the 1 GiB budget (+ its context)
        assert memory["free_for_budgets_gib"] is not None and memory["free_for_budgets_gib"] < memory["total_gib"] - 1
        assert shown == expected_titles(memory), (shown, memory)
        assert [r["id"] for r in memory["runs"]] == [rid]
        legend = bar.locator(".xf-legends").inner_text()
        assert f"{BAR_RESERVED} {gib(memory['reserved_gib'] + memory['running_gib'])}" in legend
        assert f"{BAR_FREE} {gib(memory['free_for_budgets_gib'])}" in legend
        assert f"{rid[:8]} running: " in bar.inner_text()  # the run on the card, under the bar
        page.screenshot(path=str(screenshots / "details-shared-card-membar.png"))
    finally:
        if rid is not None:
            standalone_fleet.call("POST", f"/api/runs/{rid}/cancel", {})
            assert standalone_fleet.sidecar.finish(rid, timeout=bh.WAIT_S)["status"] == "cancelled"
        standalone_fleet.call("PUT", "/api/workers/gpu-box/devices/cuda:1/mode", {"mode": "exclusive"})
