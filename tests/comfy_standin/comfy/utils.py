"""Stand-in for comfy.utils.ProgressBar and its global hook; records every update for tests.

As in ComfyUI, a bar captures the global hook when it is made and calls it on every update; the
stand-in executor (execution.py) installs a hook that, like ComfyUI's (main.py ``hijack_progress``),
raises the interrupt exception when Cancel was pressed.
"""

from __future__ import annotations

UPDATES: list[tuple[int, int]] = []
PROGRESS_BAR_HOOK = None


def set_progress_bar_global_hook(function) -> None:
    global PROGRESS_BAR_HOOK
    PROGRESS_BAR_HOOK = function


class ProgressBar:
    def __init__(self, total: int, node_id=None) -> None:
        self.total = total
        self.current = 0
        self.hook = PROGRESS_BAR_HOOK
        self.node_id = node_id

    def update_absolute(self, value: int, total: int | None = None, preview=None) -> None:
        if total is not None:
            self.total = total
        if value > self.total:
            value = self.total
        self.current = value
        UPDATES.append((value, self.total))
        if self.hook is not None:
            self.hook(self.current, self.total, preview, node_id=self.node_id)

    def update(self, value: int) -> None:
        self.update_absolute(self.current + value)
