"""A run's headline figure for the Runs panel's rows (docs/runs-panel.md): the objective its metrics end
with. The first of OBJECTIVE_ORDER the run reported wins (validation accuracy before any loss, a held-out
figure before a training one); a run that reported none of them shows its first accuracy, then its first
loss, by name. Pure: the last value of each metric (``final_metrics``) in, ``{metric, value, direction}``
or None out."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..sweeps.spec import METRIC_DIRECTIONS

OBJECTIVE_ORDER = ("val_accuracy", "eval_accuracy", "predict_accuracy", "val_loss", "eval_loss", "train_loss")


def run_objective(final_metrics: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The metric a run's row shows, its final value and whether larger is better."""
    numbers = {str(k): float(v) for k, v in (final_metrics or {}).items()
               if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
    name = next((n for n in OBJECTIVE_ORDER if n in numbers), None)
    if name is None:
        name = next((n for n in sorted(numbers) if "acc" in n.lower()), None) or \
            next((n for n in sorted(numbers) if "loss" in n.lower()), None)
    if name is None:
        return None
    direction = METRIC_DIRECTIONS.get(name) or ("maximize" if "acc" in name.lower() else "minimize")
    return {"metric": name, "value": numbers[name], "direction": direction}
