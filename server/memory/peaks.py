"""What a finished run's ``peak_memory`` (written by :func:`xpufleet.server.run.memory.peak_memory`) says
about the memory it used per card, pure.

* ``kind: "cuda_max_memory_allocated"``: the CUDA allocator's high-water mark per card, measured;
* ``kind: "mps_driver_allocated"``: what the MPS driver still holds at the end (caches included): not a
  peak, labelled as such, never a default budget;
* ``kind: "simulated_tensor_bytes"``: a run on simulated cards: the most tensor storage the run process
  held on the CPU, labelled simulated: never shown as a CUDA figure, a default only for simulated cards.

The run's figure is the largest per-card figure (a ddp run reports one per rank's card).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

CUDA_KIND = "cuda_max_memory_allocated"
MPS_KIND = "mps_driver_allocated"
SIMULATED_KIND = "simulated_tensor_bytes"
SOURCE_OF_KIND = {CUDA_KIND: "cuda", MPS_KIND: "mps", SIMULATED_KIND: "simulated"}
LABELS = {
    "cuda": "CUDA peak (the allocator's high-water mark)",
    "mps": "memory the MPS driver held at the end of the run (caches included; MPS has no peak counter)",
    "simulated": "simulated card: the most tensor storage the run held on the CPU (not a CUDA figure)",
}


@dataclass(frozen=True)
class CardPeak:
    """One run's largest per-card figure and what measured it."""

    gib: float
    source: str  # "cuda" | "mps" | "simulated"
    devices: Mapping[str, float]

    @property
    def label(self) -> str:
        return LABELS[self.source]


def card_peak(peak_memory: Any) -> CardPeak | None:
    """The run's per-card figure from its ``peak_memory`` (None: nothing was measured on a card)."""
    if not isinstance(peak_memory, Mapping):
        return None
    source = SOURCE_OF_KIND.get(str(peak_memory.get("kind")))
    devices = peak_memory.get("devices")
    if source is None or not isinstance(devices, Mapping):
        return None
    figures = {str(d): float(v) for d, v in devices.items()
               if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0}
    if not figures:
        return None
    return CardPeak(max(figures.values()), source, figures)
