"""Stand-in for comfy.model_management's interrupt flag."""

from __future__ import annotations

interrupt_processing = False


def processing_interrupted() -> bool:
    return interrupt_processing


def interrupt_current_processing(value: bool = True) -> None:
    global interrupt_processing
    interrupt_processing = value
