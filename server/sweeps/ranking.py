"""The ranked table of a sweep and the best trial of a study (pure).

Only succeeded runs with a finite value of the objective's metric are ranked (a failed or stopped run's
last reported value would be compared with finished ones); the others follow in variant order with
their status. Ties keep variant order. With seed variants, :func:`point_summary` also ranks each
parameter point by the mean over its succeeded seeds.
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .expand import Variant, format_value

ACTIVE = ("queued", "assigned", "running")


@dataclass(frozen=True)
class Row(Variant):
    """One variant (sweep) or trial (study) with what its run reports now (the variant's own fields
    first, so a row is built as ``Row(index, point, values, seed, run_id, status, ...)``)."""

    run_id: str | None
    status: str  # the run's status; "deleted" when its record was deleted; "not queued" for no run
    metric: float | None = None
    name: str | None = None
    worker_id: str | None = None
    devices: list[str] = field(default_factory=list)
    queue_key: str | None = None
    created_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    error: str | None = None

    def to_json(self, rank: int | None) -> dict[str, Any]:
        return {"rank": rank, "variant": self.index, "point": self.point, "parameters": self.values,
                "seed": self.seed, "run_id": self.run_id, "name": self.name, "status": self.status,
                "metric": self.metric, "worker_id": self.worker_id, "devices": self.devices,
                "queue_key": self.queue_key, "created_at": self.created_at, "started_at": self.started_at,
                "finished_at": self.finished_at, "error": self.error}


def metric_of(final_metrics: Mapping[str, Any] | None, name: str) -> float | None:
    """The run's last value of ``name`` when it is a finite number (NaN is stored as null)."""
    value = (final_metrics or {}).get(name)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def better(a: float, b: float, direction: str) -> bool:
    """True when ``a`` is strictly better than ``b``."""
    return a > b if direction == "maximize" else a < b


def _key(direction: str):  # noqa: ANN202 - a sort key
    sign = -1.0 if direction == "maximize" else 1.0
    return lambda r: (sign * r.metric, r.index)


def ranked(rows: Iterable[Row], direction: str) -> list[tuple[int | None, Row]]:
    """(rank, row): ranked rows first, best first; then the others in variant order with rank None."""
    rows = list(rows)
    good = sorted((r for r in rows if r.status == "succeeded" and r.metric is not None), key=_key(direction))
    ids = {id(r) for r in good}
    rest = sorted((r for r in rows if id(r) not in ids), key=lambda r: r.index)
    return [(i + 1, r) for i, r in enumerate(good)] + [(None, r) for r in rest]


def best(rows: Iterable[Row], direction: str) -> Row | None:
    table = ranked(rows, direction)
    return table[0][1] if table and table[0][0] is not None else None


def point_summary(rows: Iterable[Row], direction: str) -> list[dict[str, Any]]:
    """Per parameter point: its values, seeds run, succeeded, mean/std/best of the metric, ranked by mean."""
    groups: dict[int, list[Row]] = {}
    for r in rows:
        groups.setdefault(r.point, []).append(r)
    out = []
    for point, members in groups.items():
        vals = [r.metric for r in members if r.status == "succeeded" and r.metric is not None]
        best_value = None
        for v in vals:
            if best_value is None or better(v, best_value, direction):
                best_value = v
        out.append({"point": point, "parameters": members[0].values, "runs": len(members), "succeeded": len(vals),
                    "mean": statistics.fmean(vals) if vals else None,
                    "std": statistics.stdev(vals) if len(vals) > 1 else (0.0 if vals else None),
                    "best": best_value})
    sign = -1.0 if direction == "maximize" else 1.0
    scored = sorted((p for p in out if p["mean"] is not None), key=lambda p: (sign * p["mean"], p["point"]))
    rest = sorted((p for p in out if p["mean"] is None), key=lambda p: p["point"])
    for i, p in enumerate(scored):
        p["rank"] = i + 1
    for p in rest:
        p["rank"] = None
    return scored + rest


def counts(rows: Iterable[Row]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in rows:
        out[r.status] = out.get(r.status, 0) + 1
    return out


def sweep_status(statuses: Sequence[str], cancel_requested: bool) -> str:
    """``queued`` (nothing started yet), ``running``, ``cancelling``, then ``finished`` or ``cancelled``."""
    active = [s for s in statuses if s in ACTIVE]
    if active:
        if cancel_requested:
            return "cancelling"
        return "queued" if len(active) == len(statuses) and all(s == "queued" for s in active) else "running"
    return "cancelled" if cancel_requested else "finished"


def table_csv(table: Sequence[tuple[int | None, Row]], paths: Sequence[str], metric: str) -> str:
    """The ranked table as CSV: one line per variant, one column per parameter."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["rank", "variant", "point", "run_id", "name", "status", metric, *paths, "seed", "worker_id",
                "devices", "queue_key", "started_at", "finished_at", "error"])
    for rank, r in table:
        w.writerow([_cell(rank), r.index, r.point, _cell(r.run_id), _cell(r.name), r.status, _cell(r.metric),
                    *[_cell(r.values.get(p)) for p in paths], _cell(r.seed), _cell(r.worker_id),
                    ",".join(r.devices), _cell(r.queue_key), _cell(r.started_at), _cell(r.finished_at),
                    _cell(r.error)])
    return buf.getvalue()


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    return format_value(value)
