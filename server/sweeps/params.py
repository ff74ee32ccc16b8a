"""Node parameters a sweep or study varies (pure): where they are in the graph and which values they take.

A parameter is named ``"<node id>.<input>"`` (``"5.lr"``: input ``lr`` of node ``5``) and takes either a
list of values (``[0.001, 0.01]`` or ``{"values": [...]}``) or a range ``{"low", "high"}`` with ``log``
(geometric), ``type`` (``int`` or ``float``: by default the type of the value the graph holds now),
and for a grid ``steps`` (that many points, both ends included) or ``step`` (``low, low+step, ...``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MAX_VALUES = 10_000  # values of one parameter (a list, or a grid range's points)
MAX_PARAMETERS = 64


class SpecError(ValueError):
    """A sweep or study spec the server rejects with 400; the message names the field and what to fix."""


@dataclass(frozen=True)
class Choice:
    """An explicit list of values (any JSON scalars), in the order given."""

    values: tuple[Any, ...]


@dataclass(frozen=True)
class Range:
    """``low..high`` (both included); ``log``: geometric; ``steps``/``step``: a grid's points."""

    low: float
    high: float
    kind: str  # "int" | "float"
    log: bool = False
    steps: int | None = None
    step: float | None = None


Domain = Choice | Range


@dataclass(frozen=True)
class Param:
    """One varied input: ``path`` is ``"<node>.<input>"``."""

    path: str
    node: str
    input: str
    domain: Domain


KnownInputs = Callable[[str], "set[str] | None"]
"""class_type -> the inputs that node class declares (None: the class is not known on this server)."""


def _no_inputs(_: str) -> set[str] | None:
    return None


def clean_number(value: float) -> float:
    """12 significant digits: grid points read as written (0.001, not 0.0009999999999999998)."""
    return float(f"{value:.12g}")


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _is_link(v: Any) -> bool:
    return isinstance(v, list) and len(v) == 2 and isinstance(v[1], int) and not isinstance(v[1], bool)


def resolve_path(path: Any, graph: Mapping[str, Any], field: str, known_inputs: KnownInputs = _no_inputs,
                 ) -> tuple[str, str]:
    """``"5.lr"`` -> ("5", "lr") after checking the graph has that node and input, and that the input
    holds a value rather than a link. An input the graph leaves out is accepted when the node's class
    declares it (``known_inputs``)."""
    if not isinstance(path, str) or "." not in path:
        raise SpecError(f"{field}: {path!r} is not a parameter; write \"<node id>.<input>\", e.g. \"5.lr\"")
    node_id, _, name = path.rpartition(".")  # node ids may hold dots or colons; input names do not
    if node_id not in graph:
        ids = ", ".join(f"{k} ({_class(graph[k])})" for k in list(graph)[:30])
        raise SpecError(f"{field}: the graph has no node {node_id!r} (its nodes: {ids})")
    node = graph[node_id]
    inputs = node.get("inputs") or {}
    if not name:
        raise SpecError(f"{field}: {path!r} names no input after the dot")
    if name in inputs:
        if _is_link(inputs[name]):
            raise SpecError(f"{field}: input {name} of node {node_id} ({_class(node)}) is a link from node "
                            f"{inputs[name][0]}, not a value; vary a value input")
        return node_id, name
    declared = known_inputs(_class(node))
    if declared is not None and name in declared:
        return node_id, name
    listed = sorted(k for k, v in inputs.items() if not _is_link(v))
    raise SpecError(f"{field}: node {node_id} ({_class(node)}) has no input {name!r} "
                    f"(its value inputs: {', '.join(listed) or 'none'})")


def _class(node: Any) -> str:
    return str(node.get("class_type")) if isinstance(node, Mapping) else "?"


def parse_domain(raw: Any, field: str, current: Any, mode: str) -> Domain:
    """A parameter's values: a list, ``{"values"}``, or a range. ``mode``: ``grid`` (a range needs
    ``steps`` or ``step``), ``random`` or ``study``. ``current`` is the value the graph holds (its type
    is a range's default type)."""
    if isinstance(raw, list):
        raw = {"values": raw}
    if not isinstance(raw, Mapping):
        raise SpecError(f"{field}: give a list of values or a range {{\"low\", \"high\"}}")
    if "values" in raw:
        extra = sorted(set(raw) - {"values"})
        if extra:
            raise SpecError(f"{field}: a list of values takes no {', '.join(extra)}")
        values = raw["values"]
        if not isinstance(values, list) or not values:
            raise SpecError(f"{field}.values: must be a non-empty list")
        if len(values) > MAX_VALUES:
            raise SpecError(f"{field}.values: {len(values)} values; at most {MAX_VALUES}")
        for v in values:
            if not (isinstance(v, str | bool) or _is_number(v)):
                raise SpecError(f"{field}.values: {v!r} is not a number, string or boolean")
        seen: list[Any] = []
        for v in values:
            if any(v == s and type(v) is type(s) for s in seen):
                raise SpecError(f"{field}.values: {v!r} is listed twice")
            seen.append(v)
        return Choice(tuple(values))
    known = {"low", "high", "log", "type", "steps", "step"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise SpecError(f"{field}: unknown field(s) {', '.join(unknown)}; a range has {', '.join(sorted(known))}, "
                        f"or give \"values\"")
    if "low" not in raw or "high" not in raw:
        raise SpecError(f"{field}: a range needs low and high (or give \"values\")")
    low, high = raw["low"], raw["high"]
    for end, v in (("low", low), ("high", high)):
        if not _is_number(v):
            hint = ""
            if isinstance(v, str):
                try:
                    float(v)
                    hint = " (a string here: YAML 1.1 reads 1e-4 as text; write 1.0e-4 or 0.0001)"
                except ValueError:
                    pass
            raise SpecError(f"{field}.{end}: must be a finite number, got {v!r}{hint}")
    if not low < high:
        raise SpecError(f"{field}: low ({low}) must be below high ({high}); for one value write values: [{low}]")
    log = raw.get("log", False)
    if not isinstance(log, bool):
        raise SpecError(f"{field}.log: must be true or false")
    if log and low <= 0:
        raise SpecError(f"{field}: a log range needs low > 0 (got {low})")
    kind = raw.get("type")
    if kind is None:  # the type of the value the graph holds; else what low and high are written as
        if _is_number(current):
            kind = "int" if isinstance(current, int) else "float"
        else:
            kind = "int" if isinstance(low, int) and isinstance(high, int) else "float"
    if kind not in ("int", "float"):
        raise SpecError(f"{field}.type: must be int or float")
    if kind == "int" and not all(float(v).is_integer() for v in (low, high)):
        raise SpecError(f"{field}: an int range needs whole low and high (got {low}, {high})")
    steps, step = raw.get("steps"), raw.get("step")
    if steps is not None and step is not None:
        raise SpecError(f"{field}: give steps or step, not both")
    if steps is not None:
        if mode != "grid":
            raise SpecError(f"{field}.steps: only a grid has steps; a {mode} samples the range "
                            f"(use step for a discrete range)")
        if isinstance(steps, bool) or not isinstance(steps, int) or not 2 <= steps <= MAX_VALUES:
            raise SpecError(f"{field}.steps: must be an integer between 2 and {MAX_VALUES}")
    if step is not None:
        if not _is_number(step) or step <= 0:
            raise SpecError(f"{field}.step: must be a positive number")
        if log:
            raise SpecError(f"{field}: a log range takes steps, not step")
        if kind == "int" and not float(step).is_integer():
            raise SpecError(f"{field}.step: an int range needs a whole step")
        if (high - low) / step + 1 > MAX_VALUES:
            raise SpecError(f"{field}: step {step} gives more than {MAX_VALUES} values")
    if mode == "grid" and steps is None and step is None:
        raise SpecError(f"{field}: a grid range needs steps (points, both ends included) or step")
    if kind == "int":
        low, high = int(low), int(high)
        step = int(step) if step is not None else None
    return Range(low=low, high=high, kind=kind, log=log, steps=steps, step=step)


def parse_params(raw: Any, graph: Mapping[str, Any], mode: str, field: str = "parameters",
                 known_inputs: KnownInputs = _no_inputs, allow_empty: bool = False) -> tuple[Param, ...]:
    """``{"5.lr": ..., "4.hidden": ...}`` -> the parameters, in the order given."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise SpecError(f"{field}: must be an object {{\"<node id>.<input>\": values or range}}")
    if not raw and not allow_empty:
        raise SpecError(f"{field}: name at least one parameter, e.g. {{\"5.lr\": [0.001, 0.01]}}")
    if len(raw) > MAX_PARAMETERS:
        raise SpecError(f"{field}: {len(raw)} parameters; at most {MAX_PARAMETERS}")
    out: list[Param] = []
    for path, spec in raw.items():
        sub = f"{field}[{path!r}]"
        node, name = resolve_path(path, graph, sub, known_inputs)
        current = (graph[node].get("inputs") or {}).get(name)
        out.append(Param(f"{node}.{name}", node, name, parse_domain(spec, sub, current, mode)))
    return tuple(out)


# --- values ---------------------------------------------------------------------------------------------


def grid_values(domain: Domain) -> tuple[Any, ...]:
    """Every value a grid takes for one parameter; SpecError when ints repeat after rounding."""
    if isinstance(domain, Choice):
        return domain.values
    r = domain
    if r.step is not None:
        n = int(math.floor((r.high - r.low) / r.step + 1e-9)) + 1
        values = [r.low + i * r.step for i in range(n)]
    else:
        n = int(r.steps or 2)
        if r.log:
            lo, hi = math.log(r.low), math.log(r.high)
            values = [math.exp(lo + (hi - lo) * i / (n - 1)) for i in range(n)]
            values[0], values[-1] = r.low, r.high
        else:
            values = [r.low + (r.high - r.low) * i / (n - 1) for i in range(n)]
    if r.kind == "int":
        ints = [int(round(v)) for v in values]
        if len(set(ints)) != len(ints):
            raise SpecError(f"an int range {r.low}..{r.high} in {n} steps repeats values after rounding "
                            f"({', '.join(map(str, ints))}); use fewer steps")
        return tuple(ints)
    return tuple(clean_number(v) for v in values)


def grid_size(domain: Domain) -> int:
    """How many values :func:`grid_values` gives, without making them."""
    if isinstance(domain, Choice):
        return len(domain.values)
    if domain.step is not None:
        return int(math.floor((domain.high - domain.low) / domain.step + 1e-9)) + 1
    return int(domain.steps or 2)


def sample(domain: Domain, rng: random.Random) -> Any:
    """One random value: uniform over a list or a range (log-uniform for a log range)."""
    if isinstance(domain, Choice):
        return domain.values[rng.randrange(len(domain.values))]
    r = domain
    if r.step is not None:
        n = int(math.floor((r.high - r.low) / r.step + 1e-9)) + 1
        v = r.low + rng.randrange(n) * r.step
        return int(v) if r.kind == "int" else clean_number(v)
    if r.log:
        v = math.exp(rng.uniform(math.log(r.low), math.log(r.high)))
    else:
        v = rng.uniform(r.low, r.high)
    if r.kind == "int":
        return min(int(r.high), max(int(r.low), int(round(v))))
    return clean_number(min(r.high, max(r.low, v)))


def probe_values(domain: Domain) -> tuple[Any, ...]:
    """The values a whole-batch check tries for a parameter whose values are chosen later (a study):
    every listed value, or a range's two ends."""
    if isinstance(domain, Choice):
        return domain.values
    return (domain.low, domain.high)


# --- the graph ---------------------------------------------------------------------------------------------


def apply_values(graph: Mapping[str, Any], values: Mapping[str, Any], params: Sequence[Param] | None = None,
                 ) -> dict[str, Any]:
    """A copy of ``graph`` with ``values`` (path -> value) set. Only the nodes it changes are copied:
    the result shares the other nodes with ``graph``, which neither side changes afterwards."""
    where = {p.path: (p.node, p.input) for p in params} if params is not None else {}
    out = dict(graph)
    copied: set[str] = set()
    for path, value in values.items():
        node_id, name = where.get(path) or tuple(path.rsplit(".", 1))
        if node_id not in copied:
            node = dict(out[node_id])
            node["inputs"] = dict(node.get("inputs") or {})
            out[node_id] = node
            copied.add(node_id)
        out[node_id]["inputs"][name] = value
    return out
