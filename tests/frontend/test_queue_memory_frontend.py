"""Queue on... remembers the last target per workflow (web/lib/queue_dialog.mjs), in the real ComfyUI with
a sidecar and the agent gpu-box (two simulated CUDA cards): queued to gpu-box cuda:1 from one workflow,
the dialog opens there again for that workflow, and on this server for another one.

Screenshot: queue-on-remembered.png (conftest.py prints where)."""

from __future__ import annotations

import browser_harness as bh  # registered by tests/frontend/conftest.py
import pytest

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]

WAIT_MS = int(bh.WAIT_S * 1000)
SETTINGS = {"Comfy.TutorialCompleted": True, "XPUFleet.Language": "en", "XPUFleet.Predict.Device": "gpu-box/cuda:0"}


def open_queue_on(page):
    page.click("[data-xpufleet=queue-on]")
    dialog = page.locator("[data-xpufleet=queue-dialog]")
    dialog.locator("[data-target='worker:gpu-box']").wait_for(timeout=WAIT_MS)
    return dialog


def close(dialog) -> None:
    dialog.get_by_role("button", name="Cancel").click()
    dialog.wait_for(state="detached", timeout=WAIT_MS)


def switch_to(page, name: str) -> None:
    page.locator(".workflow-tabs .p-togglebutton:visible", has_text=name).first.click()
    page.wait_for_function(f"() => app.extensionManager.workflow.activeWorkflow.filename === {name!r}",
                           timeout=WAIT_MS)


def test_queue_on_opens_on_the_last_target_of_the_same_workflow_only(playwright_browser, comfy_host, comfy_fleet,
                                                                     screenshots):
    with bh.comfy_page(playwright_browser, comfy_host, SETTINGS) as (page, log):
        bh.load_api_graph(page, bh.sidecar_harness.iris_graph(epochs=1), "iris-a")
        dialog = open_queue_on(page)
        assert dialog.locator("[data-target=local]").is_checked()  # never queued from: this server
        dialog.locator("[data-target='worker:gpu-box']").check()
        dialog.locator("[data-device='cuda:1']").check()
        dialog.locator("[data-xpufleet=queue-submit]").click()
        page.locator("[data-xpufleet=runs-panel]").wait_for(timeout=WAIT_MS)

        dialog = open_queue_on(page)  # the same workflow: gpu-box, cuda:1 again
        assert dialog.locator("[data-target='worker:gpu-box']").is_checked()
        assert dialog.locator("[data-device='cuda:1']").is_checked()
        assert not dialog.locator("[data-device='cuda:0']").is_checked()
        page.screenshot(path=str(screenshots / "queue-on-remembered.png"))
        close(dialog)

        bh.load_api_graph(page, bh.sidecar_harness.iris_graph(epochs=1), "iris-b")
        dialog = open_queue_on(page)  # another workflow: the default
        assert dialog.locator("[data-target=local]").is_checked()
        close(dialog)

        # back on the first workflow's tab (ComfyUI's workflow tabs, clicked)
        switch_to(page, "iris-a")
        dialog = open_queue_on(page)
        assert dialog.locator("[data-target='worker:gpu-box']").is_checked()
        close(dialog)
        remembered = page.evaluate("() => Object.keys(localStorage).filter((k) => k.startsWith('XPUFleet.QueueOn.'))")
        assert len(remembered) == 1 and "iris-a" in remembered[0]
        assert [f for f in log.failed if "xpufleet" in f] == []
