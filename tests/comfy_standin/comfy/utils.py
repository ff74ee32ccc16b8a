"""Stand-in for comfy.utils.ProgressBar; records every update for tests."""

from __future__ import annotations

UPDATES: list[tuple[int, int]] = []


class ProgressBar:
    def __init__(self, total: int) -> None:
        self.total = total
        self.current = 0

    def update_absolute(self, value: int, total: int | None = None, preview=None) -> None:
        if total is not None:
            self.total = total
        self.current = value
        UPDATES.append((value, self.total))

    def update(self, value: int) -> None:
        self.update_absolute(self.current + value)
