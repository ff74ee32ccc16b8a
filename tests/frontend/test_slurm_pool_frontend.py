"""In Chromium: a Slurm pool's jobs (docs/slurm-and-k8s.md) in the Workers panel and beside the pool in
Queue on..., with the Slurm state and reason the real test Slurm gives (PENDING (Resources) while a job of
the test holds every card). Skipped (saying why) without the test cluster, like tests/server/slurm."""

from __future__ import annotations

import subprocess

import browser_harness as bh  # registered by tests/frontend/conftest.py
import pytest

sh = bh.load("slurm_harness", bh.TESTS / "server" / "slurm" / "slurm_harness.py")

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600)]
WAIT_MS = int(bh.WAIT_S * 1000)


def test_slurm_jobs_show_in_the_workers_panel_and_in_queue_on(playwright_browser, tmp_path, screenshots):
    sh.require_slurm()
    fleet = bh.Fleet(tmp_path / "home").start()
    blocker = None
    context = bh.standalone_context(playwright_browser, {"XPUFleet.Language": "en"})
    try:
        pool = fleet.call("POST", "/api/pools", sh.pool_body("hpc"))
        assert pool["name"] == "hpc"
        job_name = fleet.call("GET", "/api/pools/hpc")["slurm"]["job_name"]
        blocker = sh.Blocker()
        graph = bh.sidecar_harness.iris_graph(1)
        run_id = fleet.call("POST", "/api/runs", {"graph": graph, "options": {"target": {"pool": "hpc"}}})["run_id"]
        job = sh.wait_for(lambda: next((j for j in fleet.call("GET", "/api/pools/hpc")["jobs"]
                                        if j["status"] == "PENDING (Resources)"), None), "a pending job")
        page = context.new_page()
        page.goto(fleet.login_url())
        page.locator("[data-xpufleet=drop-zone]").wait_for(timeout=WAIT_MS)
        page.click("[data-xpufleet=tab-workers]")
        section = page.locator("[data-xpufleet=slurm-jobs][data-pool=hpc]")
        item = section.locator(f"li[data-job='{job['id']}']")
        item.wait_for(timeout=WAIT_MS)
        assert "Slurm jobs of pool hpc" in section.inner_text()
        assert item.inner_text().startswith(f"{job['id']}: PENDING (Resources)"), item.inner_text()
        # the pool's card (Workers panel, "Pools"): a Slurm pool, its waiting run with the server's reason
        card = page.locator("[data-xpufleet=pools] article[data-pool=hpc]")
        assert card.get_attribute("data-kind") == "slurm" and card.locator(".xf-tag").inner_text() == "Slurm pool"
        waiting = card.locator(f"[data-xpufleet=pool-waiting] li[data-run='{run_id}'] [data-xpufleet=waiting-reason]")
        waiting.wait_for(timeout=WAIT_MS)
        reason = fleet.call("GET", "/api/pools/hpc")["waiting"][0]["waiting_reason"]
        assert "PENDING (Resources)" in reason, reason
        page.wait_for_function("([sel, text]) => document.querySelector(sel)?.innerText === text",
                               arg=[f"article[data-pool=hpc] li[data-run='{run_id}'] [data-xpufleet=waiting-reason]", reason],
                               timeout=WAIT_MS)  # the panel's next refresh shows the same words
        page.screenshot(path=str(screenshots / "slurm-workers-panel.png"))
        bh.drop_graph(page, "iris.json", graph)
        page.click("[data-xpufleet=queue-on]")
        label = page.locator("[data-xpufleet=queue-dialog] [data-xpufleet=targets] [data-status=pool]")
        label.first.wait_for(timeout=WAIT_MS)
        assert f"Slurm pool: a job is submitted for the run ({job['id']}: PENDING (Resources))" in label.inner_text()
        page.screenshot(path=str(screenshots / "slurm-queue-on.png"))
        page.keyboard.press("Escape")
        fleet.call("POST", f"/api/runs/{run_id}/cancel")
    finally:
        context.close()
        if blocker is not None:
            blocker.release()
        if "job_name" in locals():
            subprocess.run(["scancel", f"--name={job_name}"], capture_output=True, timeout=30)
        fleet.stop()
