"""Queue on... with several workers (ddp across workers) on the standalone page: the choice lists every
worker's CUDA cards, numbers the ranks in order, sends ``options.target.spread`` and no budget, and the
run trains over both workers. A real sidecar, two agents with one simulated card each; Chromium."""

from __future__ import annotations

import browser_harness as bh  # registered by tests/frontend/conftest.py
import pytest

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]

WAIT_MS = int(bh.WAIT_S * 1000)
SETTINGS = {"XPUFleet.Language": "en"}


def ddp_graph() -> dict:
    return bh.sidecar_harness.iris_graph(epochs=2, strategy="ddp")


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory):
    fleet = bh.Fleet(tmp_path_factory.mktemp("spread-ui") / "home").start()
    try:
        fleet.add_agent("left-box", "cuda:0=24")
        fleet.add_agent("right-box", "cuda:0=24")
        yield fleet
    finally:
        fleet.stop()


def test_queue_on_several_workers_sends_a_spread_target_and_the_run_trains_over_both(
        playwright_browser, two_workers, screenshots):
    context = bh.standalone_context(playwright_browser, SETTINGS)
    try:
        page = context.new_page()
        page.goto(two_workers.login_url())
        page.locator("[data-xpufleet=drop-zone]").wait_for(timeout=WAIT_MS)
        graph = ddp_graph()
        bh.drop_graph(page, "iris-ddp.json", graph)
        page.click("[data-xpufleet=queue-on]")
        dialog = page.locator("[data-xpufleet=queue-dialog]")
        dialog.locator("[data-target=spread]").check(timeout=WAIT_MS)
        assert "strategy ddp" in dialog.locator("[data-xpufleet=targets]").inner_text()
        dialog.locator("[data-device='right-box:cuda:0']").check()
        dialog.locator("[data-device='left-box:cuda:0']").check()
        # ranks follow the listed order of workers (left-box first), not the order of the clicks
        assert dialog.locator("[data-alias='left-box:cuda:0']").inner_text() == "rank 0"
        assert dialog.locator("[data-alias='right-box:cuda:0']").inner_text() == "rank 1"
        assert "no budget" in dialog.locator("[data-xpufleet=budget]").inner_text()
        page.screenshot(path=str(screenshots / "standalone-queue-on-spread.png"))
        dialog.locator("[data-xpufleet=queue-submit]").click()
        try:
            dialog.wait_for(state="detached", timeout=WAIT_MS)  # accepted: the dialog closes (else it shows why)
        except Exception:
            raise AssertionError(f"the dialog stayed open: {dialog.inner_text()}") from None
        runs = page.locator("[data-xpufleet=runs-panel]")
        runs.locator("[data-xpufleet=detail-status]", has_text="succeeded").wait_for(timeout=WAIT_MS * 4)
        run_id = runs.locator(".xf-run-row.xf-selected").get_attribute("data-run-id")
        run = two_workers.call("GET", f"/api/runs/{run_id}")
        assert run["options"]["target"] == {"spread": [{"worker": "left-box", "devices": ["cuda:0"]},
                                                       {"worker": "right-box", "devices": ["cuda:0"]}]}
        assert run["worker_id"] == "left-box" and run["execution_facts"]["world_size"] == 2
        assert [p["worker"] for p in run["execution_facts"]["spread_parts"]] == ["left-box", "right-box"]
    finally:
        context.close()
