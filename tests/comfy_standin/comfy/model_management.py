"""Stand-in for comfy.model_management's interrupt flag and the exception ComfyUI stops a prompt with."""

from __future__ import annotations

interrupt_processing = False


class InterruptProcessingException(Exception):
    """ComfyUI's executor reports a prompt that raised this as interrupted, not failed."""


def throw_exception_if_processing_interrupted() -> None:
    global interrupt_processing
    if interrupt_processing:
        interrupt_processing = False
        raise InterruptProcessingException()


def processing_interrupted() -> bool:
    return interrupt_processing


def interrupt_current_processing(value: bool = True) -> None:
    global interrupt_processing
    interrupt_processing = value
