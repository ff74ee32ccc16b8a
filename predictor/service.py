"""Scan + predict in one call: what the routes, the CLI and the benchmark share.

The request shape (``/xpufleet/predict``, ``POST /api/predict``)::

    {"workflow": <UI or API workflow>, "platform"?: "nvidia"|"intel"|NAME,
     "options"?: {"weight_bytes": bool, "topology": bool,
                  "activation_overhead": bool | fraction | {"fraction", "gb"},
                  "calibration": bool | {"factor"} | {"samples": [{"m_peak_gb", "measured_peak_gb"}]}},
     "snapshot"?: {<Snapshot fields to override>},
     "prompt"?: <the same graph in API format, for a training graph's static estimate>}

The answer: ``p_success``, ``level``, ``color``, ``label`` {zh, en}, ``explanation`` (every input and
intermediate, the model-size stages and the options), ``models`` (each scanned reference),
``snapshot`` (the figures used), ``scan`` (summary), ``warnings``, ``simulated``, ``complete`` (every
referenced model file was found), ``missing`` (each model file the workflow names that was not found:
node, class, input, folder, name, and where it was looked for), ``summary`` (the tooltip's first
sentence as fields: verdict, need, of, device; predictor/training_peak.py).

A workflow with a missing model file gets **no success rate** (docs/predictor.md, "Missing model
files"): ``p_success`` is null, ``level`` ``"missing"`` with a neutral colour and the label "Missing
model", and the summary's verdict ``"missing"`` with ``need_gb`` marked ``lower_bound`` (the files
found; the missing ones would add to it). The formula's inputs and intermediates over the files found
stay in ``explanation`` for the record. When every file is found the answer is seed 001's, unchanged.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from ..constants import BYTES_PER_GB, PREDICTOR_ACTIVATION_FRACTION
from .predict import predict
from .resolve import ModelResolver, default_resolver
from .scan import LOADERS, ModelRef, ScanResult, scan_workflow
from .snapshot import SNAPSHOT_FIELDS, Snapshot
from .training_peak import api_graph, is_training_graph, summary, training_estimate

OPTION_NAMES = ("weight_bytes", "topology", "activation_overhead", "calibration")
_PLATFORM_RE = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
_OVERRIDE_TEXT = ("device", "name", "kind", "uuid", "platform", "worker")
# The answer for a workflow whose model file is missing: no level of seed 001's table, a neutral colour.
MISSING_LEVEL = "missing"
MISSING_COLOR = "#8c8c8c"
MISSING_LABEL = {"zh": "缺少模型", "en": "Missing model"}
_MAX_PLACES = 12  # folders listed per missing file (ComfyUI's extra_model_paths.yaml can add many)


@dataclass(frozen=True)
class Options:
    """P3 options, each off by default (the default model is docs/predictor.md unchanged)."""

    weight_bytes: bool = False
    topology: bool = False
    activation_fraction: float = 0.0
    activation_gb: float = 0.0
    calibration: bool = False
    calibration_factor: float | None = None
    calibration_samples: tuple[dict[str, Any], ...] | None = None


def _finite(name: str, v: Any, lo: float, hi: float) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi:
        raise ValueError(f"{name} must be a number from {lo} to {hi}, got {v!r}")
    return float(v)


def parse_options(raw: Any) -> Options:
    """Validate the request's ``options``; ValueError naming the option and what it accepts."""
    if raw is None:
        return Options()
    if not isinstance(raw, dict):
        raise ValueError("options must be an object, e.g. {\"weight_bytes\": true}")
    unknown = sorted(set(raw) - set(OPTION_NAMES))
    if unknown:
        raise ValueError(f"unknown option(s) {', '.join(unknown)}; valid options: {', '.join(OPTION_NAMES)}")
    kw: dict[str, Any] = {}
    for name in ("weight_bytes", "topology"):
        if name in raw:
            if not isinstance(raw[name], bool):
                raise ValueError(f"options.{name} must be true or false")
            kw[name] = raw[name]
    act = raw.get("activation_overhead", False)
    if act is True:
        kw["activation_fraction"] = PREDICTOR_ACTIVATION_FRACTION
    elif isinstance(act, dict):
        bad = set(act) - {"fraction", "gb"}
        if bad:
            raise ValueError(f"options.activation_overhead takes 'fraction' and 'gb', not {', '.join(sorted(bad))}")
        kw["activation_fraction"] = _finite("options.activation_overhead.fraction", act.get("fraction", 0.0), 0, 4)
        kw["activation_gb"] = _finite("options.activation_overhead.gb", act.get("gb", 0.0), 0, 4096)
    elif act is not False:
        kw["activation_fraction"] = _finite("options.activation_overhead", act, 0, 4)
    cal = raw.get("calibration", False)
    if cal is True:
        kw["calibration"] = True
    elif isinstance(cal, dict):
        kw["calibration"] = True
        if "factor" in cal:
            kw["calibration_factor"] = _finite("options.calibration.factor", cal["factor"], 0.01, 100)
        elif isinstance(cal.get("samples"), list):
            if not all(isinstance(s, dict) for s in cal["samples"]):
                raise ValueError("options.calibration.samples must be objects {m_peak_gb, measured_peak_gb}")
            kw["calibration_samples"] = tuple(cal["samples"])
        else:
            raise ValueError("options.calibration takes true, {\"factor\": F} or {\"samples\": [...]}")
    elif cal is not False:
        raise ValueError("options.calibration takes true, {\"factor\": F} or {\"samples\": [...]}")
    return Options(**kw)


def apply_override(snapshot: Snapshot, override: Any) -> Snapshot:
    """The snapshot with the request's figures in place (source ``override``); ValueError on bad ones."""
    if override is None:
        return snapshot
    if not isinstance(override, dict):
        raise ValueError("snapshot must be an object of figures, e.g. {\"vram_free_gb\": 8}")
    unknown = sorted(set(override) - set(SNAPSHOT_FIELDS) - set(_OVERRIDE_TEXT) - {"simulated"})
    if unknown:
        raise ValueError(f"snapshot: unknown field(s) {', '.join(unknown)}; figures: {', '.join(SNAPSHOT_FIELDS)}")
    d = asdict(snapshot)
    for k, v in override.items():
        if k in SNAPSHOT_FIELDS:
            d[k] = _finite(f"snapshot.{k}", v, 0, 1e7)
        elif k == "simulated":
            if not isinstance(v, bool):
                raise ValueError("snapshot.simulated must be true or false")
            d[k] = v
        else:
            if v is not None and not isinstance(v, str):
                raise ValueError(f"snapshot.{k} must be a string")
            d[k] = v
    d["source"] = "override"
    d["notes"] = list(d["notes"]) + [f"figures from the request: {', '.join(sorted(override))}"]
    return Snapshot(**d)


def check_platform(platform: Any) -> str | None:
    """Normalised platform name or None; ValueError when it is not a plain name."""
    if platform is None:
        return None
    if not isinstance(platform, str) or not _PLATFORM_RE.match(platform.strip().lower()):
        raise ValueError("platform must be a name such as nvidia, intel, amd (letters, digits, - and _)")
    return platform.strip().lower()


def predict_workflow(
    workflow: Any,
    snapshot: Snapshot,
    *,
    platform: str | None = None,
    options: Any = None,
    resolver: ModelResolver | None = None,
    gamma_overrides: Mapping[str, float] | None = None,
    prompt: Any = None,
) -> dict[str, Any]:
    """Scan ``workflow`` and predict its success on ``snapshot``'s device; the JSON-ready answer.

    ``prompt``: the same graph in API format (the capsule sends ComfyUI's graph-to-prompt beside the UI
    workflow); a training graph's peak is its static estimate (predictor/training_peak.py).
    Raises ValueError (bad workflow, unsafe model name, bad options/platform) with what to fix.
    """
    opts = parse_options(options)
    platform = check_platform(platform) or snapshot.platform or "cpu"
    if gamma_overrides is None:
        from .config import gamma_overrides as load_gamma

        gamma_overrides = load_gamma()
    resolver = resolver or default_resolver()
    scan = scan_workflow(workflow, resolver, collect_graph=opts.topology)
    warnings = list(scan.warnings)
    sizes: dict[str, int] = {}
    refs = []
    for m in scan.models:
        d = m.to_dict()
        if m.status == "found" and m.path:
            counted = m.size_bytes
            if opts.weight_bytes:
                from .weights import weight_bytes

                info = weight_bytes(m.path, m.size_bytes, m.options)
                counted = info.bytes
                d.update(weight_bytes=info.bytes, weight_method=info.method, weight_note=info.note)
            sizes[m.path] = max(sizes.get(m.path, 0), counted)
            d["counted_gb"] = counted / BYTES_PER_GB
        refs.append(d)
    stages: dict[str, Any] = {
        "m_total_file_gb": scan.m_total_gb,
        "m_peak_file_gb": scan.m_peak_gb,
    }
    m_total = sum(sizes.values()) / BYTES_PER_GB
    m_peak = max(sizes.values(), default=0) / BYTES_PER_GB
    if sizes:
        stages["m_peak_model"] = max(sizes, key=lambda k: sizes[k])
    # "none": the workflow loads no model file, so M_peak = 0 is no size of anything (not measured either)
    peak_source = "model_files" if sizes else "none"
    graph = api_graph(workflow, prompt)
    if is_training_graph(graph):
        try:
            est = training_estimate(graph)
        except ValueError as exc:
            est = {"total_gib": None, "reasons": [str(exc)]}
        stages["training_estimate"] = est
        if est["total_gib"] is not None and est["total_gib"] > m_peak:
            # the models the graph builds and trains, not files: the figure Queue on... suggests
            m_peak = est["total_gib"]
            m_total = max(m_total, m_peak)
            peak_source = "training_estimate"
        elif est["total_gib"] is None:
            warnings.append("no static memory estimate for this training graph: "
                            + "; ".join(est.get("reasons") or ["unknown"]))
    if opts.weight_bytes:
        stages.update(m_total_weights_gb=m_total, m_peak_weights_gb=m_peak)
    if opts.topology:
        from .topology import topology_peak

        tp = topology_peak(scan, sizes)
        m_peak = tp["bytes"] / BYTES_PER_GB
        stages.update(m_peak_topology_gb=m_peak, topology_node=tp["node"], topology_files=tp["files"])
    if opts.activation_fraction or opts.activation_gb:
        extra = m_peak * opts.activation_fraction + opts.activation_gb
        m_peak += extra
        m_total += extra
        stages.update(activation_fraction=opts.activation_fraction, activation_gb=opts.activation_gb,
                      activation_extra_gb=extra)
    if opts.calibration:
        if opts.calibration_factor is not None:
            cal = {"factor": opts.calibration_factor, "samples": None, "source": "request"}
        else:
            from .calibration import calibration_factor, load_samples

            samples = opts.calibration_samples if opts.calibration_samples is not None else load_samples()
            cal = calibration_factor(samples, platform)
            cal["source"] = "request" if opts.calibration_samples is not None else "measured runs"
            if not cal["samples"]:
                warnings.append("calibration: no measured run peaks yet; factor 1.0")
        m_peak *= cal["factor"]
        m_total *= cal["factor"]
        stages["calibration"] = cal
    stages.update(m_total_gb=m_total, m_peak_gb=m_peak)
    if snapshot.simulated:
        warnings.append("the device figures are SIMULATED, not measured")
    if snapshot.reason:
        warnings.append(snapshot.reason)
    pred = predict(
        m_total=m_total,
        m_peak=m_peak,
        vram_free_gb=snapshot.vram_free_gb,
        vram_allocated_gb=snapshot.vram_allocated_gb,
        vram_reserved_gb=snapshot.vram_reserved_gb,
        ram_free_gb=snapshot.ram_free_gb,
        commit_used_gb=snapshot.commit_used_gb,
        commit_limit_gb=snapshot.commit_limit_gb,
        platform=platform,
        gamma_overrides=gamma_overrides,
    )
    if pred.explanation["gamma_source"] == "default" and platform != "cpu":
        warnings.append(f"platform {platform!r} has no configured gamma; using {pred.explanation['gamma']}")
    answer = pred.to_dict()
    answer["explanation"].update(
        models=stages,
        options={k: v for k, v in asdict(opts).items() if v not in (False, None, 0.0)},
        device={"device": snapshot.device, "name": snapshot.name, "kind": snapshot.kind, "uuid": snapshot.uuid,
                "worker": snapshot.worker, "source": snapshot.source, "simulated": snapshot.simulated},
    )
    answer.update(
        models=refs,
        snapshot=snapshot.to_dict(),
        scan=scan.summary(),
        warnings=warnings,
        simulated=snapshot.simulated,
        # False when a referenced model was not found/refused: the figure then counts only part of the load
        complete=all(m.status == "found" for m in scan.models),
    )
    answer["summary"] = summary(answer, snapshot, peak_source)
    missing = missing_files(scan, resolver)
    answer["missing"] = missing
    if missing:
        withhold_rate(answer)
    return answer


def _looked_in(ref: ModelRef, resolver: ModelResolver) -> tuple[list[str], list[str]]:
    """(folder names, their directories) where ComfyUI looks for ``ref``'s file: the loader's folders
    (LOADERS), the one folder a hint named, or, for a node the table does not know, every model folder."""
    spec = next((li for li in LOADERS.get(ref.class_type, ()) if li.name == ref.input), None)
    if spec is not None:
        folders = list(spec.folders)
    elif ref.folder:
        folders = [ref.folder]
    else:
        folders = resolver.known_folders()
    places: list[str] = []
    for folder in folders:
        try:
            bases = resolver.bases(folder)
        except Exception:  # a resolver that cannot name a folder's directories still names the folder
            bases = []
        places += [b for b in bases if b not in places]
    return folders, places


def missing_files(scan: ScanResult, resolver: ModelResolver) -> list[dict[str, Any]]:
    """Each model file the workflow names that was not found (``missing``), not chosen (``unresolved``
    with no name), not in any model folder (``unresolved``, a node the table does not know) or not read
    (``refused``, a link leading out of its folder): node, class, input, folder, name, status, reason,
    and where ComfyUI looks for it (``folders``, ``places``). The same file named by two nodes is listed
    for each node."""
    out = []
    for m in scan.models:
        if m.status == "found":
            continue
        folders, places = _looked_in(m, resolver)
        out.append({"node": m.node, "class_type": m.class_type, "input": m.input, "name": m.name,
                    "folder": m.folder, "status": m.status, "reason": m.reason,
                    "folders": folders, "places": places[:_MAX_PLACES],
                    "places_more": max(0, len(places) - _MAX_PLACES)})
    return out


def withhold_rate(answer: dict[str, Any]) -> None:
    """No success rate for a workflow that names a model file the machine lacks: the run would fail
    at that loader whatever the memory, and the sizes found only bound the need from below."""
    # the formula's inputs and intermediates stay, over the files found: M_peak / M_total bound the need
    # from below; no percentage is given (p_success_raw of the intermediates is no success rate)
    answer["explanation"]["models"]["lower_bound"] = True
    answer.update(p_success=None, level=MISSING_LEVEL, color=MISSING_COLOR, label=dict(MISSING_LABEL))
    s = answer["summary"]
    s.update(verdict=MISSING_LEVEL, lower_bound=True)
