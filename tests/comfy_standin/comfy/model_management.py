"""Stand-in for comfy.model_management's interrupt flag and the exception ComfyUI stops a prompt with."""

from __future__ import annotations

import threading

interrupt_processing = False
interrupt_processing_mutex = threading.RLock()


class InterruptProcessingException(Exception):
    """ComfyUI's executor reports a prompt that raised this as interrupted, not failed."""


def throw_exception_if_processing_interrupted() -> None:
    global interrupt_processing
    with interrupt_processing_mutex:
        if interrupt_processing:
            interrupt_processing = False
            raise InterruptProcessingException()


def processing_interrupted() -> bool:
    with interrupt_processing_mutex:
        return interrupt_processing


def interrupt_current_processing(value: bool = True) -> None:
    global interrupt_processing
    with interrupt_processing_mutex:
        interrupt_processing = value
