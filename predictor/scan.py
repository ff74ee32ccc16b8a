"""Workflow scan (docs/predictor.md): which model files a ComfyUI workflow loads, and how big they are on disk.

Reads both formats:

- UI format (what the editor saves: ``nodes``, ``links``, ``definitions.subgraphs``). Muted (mode 2)
  and bypassed (mode 4) nodes are skipped, a skipped subgraph instance skips everything inside it;
  subgraph instances are expanded (nested ones too), and a loader widget promoted to the subgraph
  instance takes the instance's value.
- API format (``{"<id>": {"class_type", "inputs"}}``, also inside a ``/prompt`` body's ``prompt``).

Loader nodes are matched through ``LOADERS`` (input name, widget position, model folder); nodes not in
the table are still scanned for model file names (``properties.models`` directory hints, then a
search of the known folders). Files are found through ComfyUI's ``folder_paths`` when hosted, else
through ``XPUFLEET_MODEL_DIRS`` / ``config.yaml``. A name that is absolute or climbs out with ``..``
raises ``UnsafeModelName``; a file that is a link leading outside its model folder is refused and not
read. Nothing outside the model folders is ever opened or stat'ed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from ..constants import BYTES_PER_GB
from ..nodes import types as T
from .resolve import (
    ModelResolver,
    Resolution,
    UnsafeModelName,
    check_model_name,
    default_resolver,
)

# The plugin's own nodes whose file input is no model of ComfyUI's model folders: ModelSaver writes its
# file, ModelLoader reads one a ModelSaver wrote under the plugin's outputs folder (nodes/io.py). Their
# memory is the training graph's static estimate, not a file size; the capsule must not flag them.
OWN_FILE_NODES = frozenset({T.MODEL_SAVER_NODE, T.MODEL_LOADER_NODE})


@dataclass(frozen=True)
class LoaderInput:
    """One model-file input of a loader node: its name, widget position (UI format) and folders."""

    name: str
    index: int
    folders: tuple[str, ...]


def _li(name: str, index: int, *folders: str) -> LoaderInput:
    return LoaderInput(name, index, tuple(folders))


_TE = ("text_encoders",)
# class_type -> model-file inputs. Folder names are ComfyUI's (folder_paths); aliases below.
LOADERS: dict[str, tuple[LoaderInput, ...]] = {
    "CheckpointLoaderSimple": (_li("ckpt_name", 0, "checkpoints"),),
    "CheckpointLoader": (_li("ckpt_name", 1, "checkpoints"),),
    "ImageOnlyCheckpointLoader": (_li("ckpt_name", 0, "checkpoints"),),
    "unCLIPCheckpointLoader": (_li("ckpt_name", 0, "checkpoints"),),
    "UNETLoader": (_li("unet_name", 0, "diffusion_models"),),
    "CLIPLoader": (_li("clip_name", 0, *_TE),),
    "DualCLIPLoader": (_li("clip_name1", 0, *_TE), _li("clip_name2", 1, *_TE)),
    "TripleCLIPLoader": (_li("clip_name1", 0, *_TE), _li("clip_name2", 1, *_TE), _li("clip_name3", 2, *_TE)),
    "QuadrupleCLIPLoader": tuple(_li(f"clip_name{i + 1}", i, *_TE) for i in range(4)),
    "VAELoader": (_li("vae_name", 0, "vae", "vae_approx"),),
    "LoraLoader": (_li("lora_name", 0, "loras"),),
    "LoraLoaderModelOnly": (_li("lora_name", 0, "loras"),),
    "ControlNetLoader": (_li("control_net_name", 0, "controlnet"),),
    "DiffControlNetLoader": (_li("control_net_name", 0, "controlnet"),),
    "CLIPVisionLoader": (_li("clip_name", 0, "clip_vision"),),
    "StyleModelLoader": (_li("style_model_name", 0, "style_models"),),
    "UpscaleModelLoader": (_li("model_name", 0, "upscale_models"),),
    "GLIGENLoader": (_li("gligen_name", 0, "gligen"),),
    "HypernetworkLoader": (_li("hypernetwork_name", 0, "hypernetworks"),),
    "PhotoMakerLoader": (_li("photomaker_model_name", 0, "photomaker"),),
    "ModelPatchLoader": (_li("name", 0, "model_patches"),),
    "AudioEncoderLoader": (_li("audio_encoder_name", 0, "audio_encoders"),),
    "LatentUpscaleModelLoader": (_li("model_name", 0, "latent_upscale_models"),),
    "LTXAVTextEncoderLoader": (_li("text_encoder", 0, *_TE), _li("ckpt_name", 1, "checkpoints")),
    "LTXVAudioVAELoader": (_li("ckpt_name", 0, "checkpoints"),),
    "LoadMoGeModel": (_li("model_name", 0, "geometry_estimation"),),
    "LoadDA3Model": (_li("model_name", 0, "geometry_estimation"),),
    "LoadBackgroundRemovalModel": (_li("bg_removal_name", 0, "background_removal"),),
    "FrameInterpolationModelLoader": (_li("model_name", 0, "frame_interpolation"),),
    "OpticalFlowLoader": (_li("model_name", 0, "optical_flow"),),
    "ConditioningLoader": (_li("conditioning_name", 0, "embeddings"),),
    # ComfyUI-GGUF custom nodes (quantised weights; see the weight_bytes option)
    "UnetLoaderGGUF": (_li("unet_name", 0, "unet_gguf", "diffusion_models"),),
    "UnetLoaderGGUFAdvanced": (_li("unet_name", 0, "unet_gguf", "diffusion_models"),),
    "CLIPLoaderGGUF": (_li("clip_name", 0, "clip_gguf", *_TE),),
    "DualCLIPLoaderGGUF": (_li("clip_name1", 0, "clip_gguf", *_TE), _li("clip_name2", 1, "clip_gguf", *_TE)),
    "TripleCLIPLoaderGGUF": tuple(_li(f"clip_name{i + 1}", i, "clip_gguf", *_TE) for i in range(3)),
    "QuadrupleCLIPLoaderGGUF": tuple(_li(f"clip_name{i + 1}", i, "clip_gguf", *_TE) for i in range(4)),
}

# Loader widgets that change how much memory the weights take (weight_bytes option): name, position
LOADER_OPTIONS: dict[str, tuple[tuple[str, int], ...]] = {
    "UNETLoader": (("weight_dtype", 1),),
}

MODEL_EXTENSIONS = (".safetensors", ".sft", ".ckpt", ".pt", ".pt2", ".pth", ".bin", ".gguf", ".onnx")
MUTED, BYPASSED = 2, 4
_MAX_SUBGRAPH_DEPTH = 16
_MAX_NODES = 100_000


class WorkflowFormatError(ValueError):
    """The document is neither a ComfyUI UI workflow nor an API prompt."""


# --------------------------------------------------------------------------------------------------
# Scan result
# --------------------------------------------------------------------------------------------------


@dataclass
class ModelRef:
    """One model file a node loads."""

    node: str
    class_type: str
    input: str
    name: str
    folder: str | None
    status: str  # found | missing | refused | unresolved
    path: str | None = None
    size_bytes: int = 0
    source: str = "widget"  # widget | promoted | api | linked | properties | guessed
    reason: str | None = None
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """Identity of the file: its real path when found, else folder/name."""
        return self.path or f"{self.folder}/{self.name}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, with ``size_gb``."""
        d = asdict(self)
        d["size_gb"] = self.size_bytes / BYTES_PER_GB
        return d


@dataclass
class GraphNode:
    """A node of the flattened graph (subgraphs expanded) for the topology option."""

    class_type: str
    mode: int = 0
    refs: list[str] = field(default_factory=list)  # keys of the files this node loads
    io: bool = False  # a subgraph boundary slot (passes everything through)


@dataclass
class ScanResult:
    """What the scan found: every reference, the unique files, skipped nodes, warnings."""

    format: str
    models: list[ModelRef]
    skipped: list[dict[str, Any]]
    warnings: list[str]
    resolver: dict[str, Any]
    nodes: dict[str, GraphNode] = field(default_factory=dict)
    edges: list[tuple[str, str, str | None]] = field(default_factory=list)  # (src, dst, type)

    def files(self) -> dict[str, int]:
        """Unique found files -> size in bytes (a file loaded by two nodes counts once)."""
        out: dict[str, int] = {}
        for m in self.models:
            if m.status == "found" and m.path:
                out[m.path] = m.size_bytes
        return out

    @property
    def m_total_gb(self) -> float:
        """Seed 001's M_total: the sum of the active models' file sizes (GiB)."""
        return sum(self.files().values()) / BYTES_PER_GB

    @property
    def m_peak_gb(self) -> float:
        """Seed 001's M_peak: the largest single model file (GiB)."""
        return max(self.files().values(), default=0) / BYTES_PER_GB

    def summary(self) -> dict[str, Any]:
        """JSON-ready summary (without the graph)."""
        missing = [m for m in self.models if m.status != "found"]
        return {
            "format": self.format,
            "m_total_gb": self.m_total_gb,
            "m_peak_gb": self.m_peak_gb,
            "files": len(self.files()),
            "missing": sum(1 for m in missing if m.status == "missing"),
            "refused": sum(1 for m in missing if m.status == "refused"),
            "unresolved": sum(1 for m in missing if m.status == "unresolved"),
            "skipped_nodes": self.skipped,
            "warnings": self.warnings,
            "resolver": self.resolver,
        }


# --------------------------------------------------------------------------------------------------
# The walk
# --------------------------------------------------------------------------------------------------


def detect_format(workflow: Any) -> tuple[str, Any]:
    """``("ui", wf)`` or ``("api", prompt)``; WorkflowFormatError saying what was expected."""
    if isinstance(workflow, dict):
        if isinstance(workflow.get("nodes"), list):
            return "ui", workflow
        if isinstance(workflow.get("prompt"), dict):  # a /prompt request body
            return detect_format(workflow["prompt"])
        if workflow and all(isinstance(v, dict) and "class_type" in v for v in workflow.values()):
            return "api", workflow
    raise WorkflowFormatError(
        "not a ComfyUI workflow: expected the UI format (an object with a 'nodes' list) or the API "
        "format (an object mapping node ids to {'class_type', 'inputs'})"
    )


class _Scanner:
    def __init__(self, resolver: ModelResolver, collect_graph: bool):
        self.resolver = resolver
        self.collect = collect_graph
        self.models: list[ModelRef] = []
        self.skipped: list[dict[str, Any]] = []
        self.warnings: list[str] = []
        self.nodes: dict[str, GraphNode] = {}
        self.edges: list[tuple[str, str, str | None]] = []
        self._resolved: dict[tuple[tuple[str, ...], str], Resolution] = {}
        self._sg_info: dict[str, dict[str, Any]] = {}
        self._known_folders: list[str] | None = None
        self._count = 0
        self._deferred: list[tuple[str, str, list, dict[str, str]]] = []

    # -- references ---------------------------------------------------------------------------
    def add_ref(self, node: str, ctype: str, inp: str, value: Any, folders: tuple[str, ...], source: str) -> ModelRef:
        if not isinstance(value, str) or not value.strip() or value.strip().lower() == "none":
            ref = ModelRef(node, ctype, inp, str(value) if value is not None else "", folders[0] if folders else None,
                           "unresolved", source=source, reason="no model file selected")
            self.models.append(ref)
            return ref
        try:
            name = check_model_name(value.strip())
        except UnsafeModelName as exc:
            raise UnsafeModelName(f"node {node} ({ctype}.{inp}): {exc}") from None
        key = (folders, name)
        res = self._resolved.get(key)
        if res is None:
            res = self._resolved[key] = self.resolver.resolve(folders, name)
        ref = ModelRef(node, ctype, inp, value, res.folder or (folders[0] if folders else None), res.status,
                       res.path, res.size_bytes, source, res.reason)
        self.models.append(ref)
        if res.status == "refused":
            self.warnings.append(f"node {node} ({ctype}): {res.reason}")
        if self.collect and node in self.nodes:
            self.nodes[node].refs.append(ref.key)
        return ref

    def known_folders(self) -> list[str]:
        if self._known_folders is None:
            self._known_folders = self.resolver.known_folders()
        return self._known_folders

    def scan_unknown(self, node: str, ctype: str, values: Iterable[tuple[str, Any]], hints: dict[str, str]) -> None:
        """Queue a node the table does not know; ``finish`` looks at it once the known loaders are in."""
        self._deferred.append((node, ctype, list(values), hints))

    def finish(self) -> None:
        """Model file names in nodes the table does not know: folder from a hint, else searched.
        A name a known loader already loads (a primitive feeding it, say) is not counted again."""
        known = {m.name for m in self.models}
        for node, ctype, values, hints in self._deferred:
            self._scan_unknown(node, ctype, values, hints, known)

    def _scan_unknown(self, node: str, ctype: str, values: list, hints: dict[str, str], known: set[str]) -> None:
        for inp, value in values:
            if not isinstance(value, str) or not value.lower().endswith(MODEL_EXTENSIONS) or value in known:
                continue
            if ctype in OWN_FILE_NODES:
                continue  # the plugin's own file, not a model of ComfyUI's model folders
            try:
                name = check_model_name(value.strip())
            except UnsafeModelName as exc:
                # a custom node may take a path of its own; it is not a model-folder name: not read
                self.models.append(ModelRef(node, ctype, inp, value, None, "refused", source="guessed",
                                            reason=f"{exc}; not read"))
                self.warnings.append(f"node {node} ({ctype}.{inp}): {exc}; not read")
                continue
            if value in hints:
                self.add_ref(node, ctype, inp, value, (hints[value],), "properties")
                continue
            hits = [f for f in self.known_folders() if self.resolver.resolve((f,), name).status == "found"]
            if len(hits) >= 1:
                ref = self.add_ref(node, ctype, inp, value, (hits[0],), "guessed")
                if len(hits) > 1:
                    ref.reason = f"found in several folders ({', '.join(hits)}); took {hits[0]}"
            else:
                self.models.append(ModelRef(node, ctype, inp, value, None, "unresolved", source="guessed",
                                            reason=f"{ctype} is not a known loader and no model folder holds {name!r}"))

    def _tick(self) -> None:
        self._count += 1
        if self._count > _MAX_NODES:
            raise WorkflowFormatError(f"workflow has more than {_MAX_NODES} nodes (subgraphs expanded)")

    # -- API format ----------------------------------------------------------------------------
    def scan_api(self, prompt: dict[str, Any]) -> None:
        for nid, node in prompt.items():
            self._tick()
            nid = str(nid)
            ctype = str(node.get("class_type"))
            inputs = node.get("inputs") or {}
            if not isinstance(inputs, dict):
                raise WorkflowFormatError(f"node {nid}: 'inputs' must be an object")
            if self.collect:
                self.nodes[nid] = GraphNode(ctype)
                for value in inputs.values():
                    if _is_api_link(value):
                        self.edges.append((str(value[0]), nid, None))
            spec = LOADERS.get(ctype)
            if spec is None:
                self.scan_unknown(nid, ctype, inputs.items(), {})
                continue
            for li in spec:
                value = inputs.get(li.name)
                source = "api"
                if _is_api_link(value):
                    value, source = _api_upstream_literal(prompt, value), "linked"
                ref = self.add_ref(nid, ctype, li.name, value, li.folders, source)
                for oname, _pos in LOADER_OPTIONS.get(ctype, ()):
                    if isinstance(inputs.get(oname), str):
                        ref.options[oname] = inputs[oname]

    # -- UI format -----------------------------------------------------------------------------
    def scan_ui(self, wf: dict[str, Any]) -> None:
        defs = {}
        for sg in ((wf.get("definitions") or {}).get("subgraphs") or []):
            if isinstance(sg, dict) and "id" in sg:
                defs[str(sg["id"])] = sg
        self._defs = defs
        self._walk(wf.get("nodes") or [], wf.get("links") or [], prefix="", chain=(), depth=0)

    def _subgraph_info(self, sg: dict[str, Any]) -> dict[str, Any]:
        """Per definition: links by id, input node id, and the widget-promoted inputs in order."""
        sid = str(sg["id"])
        info = self._sg_info.get(sid)
        if info is not None:
            return info
        links = {}
        for link in sg.get("links") or []:
            norm = _norm_link(link)
            if norm:
                links[norm[0]] = norm
        nodes = {str(n.get("id")): n for n in sg.get("nodes") or [] if isinstance(n, dict)}
        in_id = str((sg.get("inputNode") or {}).get("id", -10))
        out_id = str((sg.get("outputNode") or {}).get("id", -20))
        widget_inputs: list[str] = []
        for si in sg.get("inputs") or []:
            for lid in si.get("linkIds") or []:
                link = links.get(lid)
                if not link:
                    continue
                tgt = nodes.get(str(link[3]))
                tins = (tgt or {}).get("inputs") or []
                if isinstance(link[4], int) and 0 <= link[4] < len(tins) and tins[link[4]].get("widget"):
                    widget_inputs.append(si.get("name"))
                    break
        info = {"links": links, "in_id": in_id, "out_id": out_id,
                "input_names": [si.get("name") for si in sg.get("inputs") or []], "widget_inputs": widget_inputs}
        self._sg_info[sid] = info
        return info

    def _promoted_value(self, node: dict[str, Any], wname: str, chain: tuple) -> tuple[Any, bool]:
        """The value of widget ``wname`` of ``node`` (inside ``chain[-1]``'s subgraph) when it is fed
        from the subgraph's input node: taken from the instance, or further up for nested
        promotion. Returns (value, found); not found means the node's own value stands (newer front
        ends keep promoted values on the inner node and leave the instance's list empty)."""
        inst, sg = chain[-1]
        info = self._subgraph_info(sg)
        link_id = next((i.get("link") for i in node.get("inputs") or []
                        if isinstance(i, dict) and (i.get("name") == wname or (i.get("widget") or {}).get("name") == wname)),
                       None)
        link = info["links"].get(link_id) if link_id is not None else None
        if not link or str(link[1]) != info["in_id"]:
            return None, False
        slot, names = link[2], info["input_names"]
        if not isinstance(slot, int) or not 0 <= slot < len(names):
            return None, False
        sg_input = names[slot]
        if len(chain) > 1:
            value, ok = self._promoted_value(inst, sg_input, chain[:-1])
            if ok:
                return value, True
        wv = inst.get("widgets_values")
        # older front ends store promoted values on the instance, one per widget input, in order
        if isinstance(wv, list) and wv and len(wv) == len(info["widget_inputs"]) and sg_input in info["widget_inputs"]:
            return wv[info["widget_inputs"].index(sg_input)], True
        return None, False

    def _walk(self, nodes: list, links: list, prefix: str, chain: tuple, depth: int) -> None:
        if depth > _MAX_SUBGRAPH_DEPTH:
            raise WorkflowFormatError(f"subgraphs nested deeper than {_MAX_SUBGRAPH_DEPTH} (a subgraph containing itself?)")
        by_id: dict[str, dict[str, Any]] = {}
        expanded: dict[str, dict[str, Any]] = {}
        for node in nodes:
            if not isinstance(node, dict):
                raise WorkflowFormatError(f"a node in {'subgraph ' + prefix if prefix else 'the workflow'} is not an object")
            self._tick()
            nid = str(node.get("id"))
            ctype = str(node.get("type"))
            fid = prefix + nid
            by_id[nid] = node
            mode = node.get("mode", 0) or 0
            if mode in (MUTED, BYPASSED):
                self.skipped.append({"node": fid, "class_type": ctype, "mode": "muted" if mode == MUTED else "bypassed"})
                if self.collect:
                    self.nodes[fid] = GraphNode(ctype, mode)
                continue
            sg = self._defs.get(ctype)
            if sg is not None:
                if any(c[1] is sg for c in chain):
                    raise WorkflowFormatError(f"subgraph {ctype} contains itself (node {fid})")
                expanded[nid] = sg
                self._walk(sg.get("nodes") or [], sg.get("links") or [], fid + ":", chain + ((node, sg),), depth + 1)
                continue
            if self.collect:
                self.nodes[fid] = GraphNode(ctype, mode)
            spec = LOADERS.get(ctype)
            wv = node.get("widgets_values")
            if spec is None:
                hints = {}
                for m in (node.get("properties") or {}).get("models") or []:
                    if isinstance(m, dict) and isinstance(m.get("name"), str) and isinstance(m.get("directory"), str):
                        hints[m["name"]] = m["directory"]
                if isinstance(wv, list):
                    values = [(f"widget[{i}]", v) for i, v in enumerate(wv)]
                elif isinstance(wv, dict):
                    values = list(wv.items())
                else:
                    values = []
                self.scan_unknown(fid, ctype, values, hints)
                continue
            for li in spec:
                value, source = None, "widget"
                if chain:
                    value, ok = self._promoted_value(node, li.name, chain)
                    if ok:
                        source = "promoted"
                if source != "promoted":
                    if isinstance(wv, list):
                        value = wv[li.index] if li.index < len(wv) else None
                    elif isinstance(wv, dict):
                        value = wv.get(li.name)
                ref = self.add_ref(fid, ctype, li.name, value, li.folders, source)
                for oname, pos in LOADER_OPTIONS.get(ctype, ()):
                    ov = wv[pos] if isinstance(wv, list) and pos < len(wv) else wv.get(oname) if isinstance(wv, dict) else None
                    if isinstance(ov, str):
                        ref.options[oname] = ov
        if self.collect:
            self._collect_edges(links, by_id, expanded, prefix, chain)

    def _collect_edges(self, links: list, by_id: dict, expanded: dict, prefix: str, chain: tuple) -> None:
        info = self._subgraph_info(chain[-1][1]) if chain else None
        parent = prefix[:-1] if prefix else ""
        for link in links:
            norm = _norm_link(link)
            if not norm:
                continue
            _lid, origin, oslot, target, tslot, ltype = norm
            origin, target = str(origin), str(target)
            if info is not None and origin == info["in_id"]:
                src = f"{parent}:in{oslot}"
            elif origin in expanded:
                src = f"{prefix}{origin}:out{oslot}"
            else:
                src = prefix + origin
            if info is not None and target == info["out_id"]:
                dst = f"{parent}:out{tslot}"
            elif target in expanded:
                tnode = by_id[target]
                tins = tnode.get("inputs") or []
                tname = tins[tslot].get("name") if isinstance(tslot, int) and 0 <= tslot < len(tins) else None
                names = self._subgraph_info(expanded[target])["input_names"]
                k = names.index(tname) if tname in names else tslot
                dst = f"{prefix}{target}:in{k}"
            else:
                dst = prefix + target
            for io in (src, dst):
                if io not in self.nodes and (":in" in io or ":out" in io):
                    self.nodes[io] = GraphNode("__subgraph_io__", io=True)
            self.edges.append((src, dst, ltype if isinstance(ltype, str) else None))


def _norm_link(link: Any) -> tuple | None:
    """A link as (id, origin, origin_slot, target, target_slot, type), from the array or object form."""
    if isinstance(link, list) and len(link) >= 6:
        return tuple(link[:6])
    if isinstance(link, dict) and "origin_id" in link:
        return (link.get("id"), link.get("origin_id"), link.get("origin_slot"), link.get("target_id"),
                link.get("target_slot"), link.get("type"))
    return None


def _is_api_link(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 2 and isinstance(value[1], int) and isinstance(value[0], (str, int))


def _api_upstream_literal(prompt: dict[str, Any], link: list) -> Any:
    """A linked loader input in the API format: the upstream node's single string literal, if any."""
    up = prompt.get(str(link[0]))
    if not isinstance(up, dict):
        return None
    strings = [v for v in (up.get("inputs") or {}).values() if isinstance(v, str)]
    return strings[0] if len(strings) == 1 else None


def scan_workflow(workflow: Any, resolver: ModelResolver | None = None, *, collect_graph: bool = False) -> ScanResult:
    """Scan a UI or API workflow for the model files it loads (docs/predictor.md).

    ``resolver`` defaults to ComfyUI's folders when hosted, else the configured folders.
    ``collect_graph`` also builds the flattened graph the topology option needs.
    Raises WorkflowFormatError / UnsafeModelName (both ValueError) with a message saying what to fix.
    """
    fmt, doc = detect_format(workflow)
    resolver = resolver or default_resolver()
    s = _Scanner(resolver, collect_graph)
    try:
        if fmt == "ui":
            s.scan_ui(doc)
        else:
            s.scan_api(doc)
        s.finish()
    except (AttributeError, TypeError, KeyError, IndexError) as exc:
        # a field of the wrong shape somewhere in a hand-edited or truncated document
        raise WorkflowFormatError(f"malformed {fmt.upper()}-format workflow ({type(exc).__name__}: {exc}); "
                                  "save it again from ComfyUI") from None
    missing = [m for m in s.models if m.status == "missing"]
    if missing:
        s.warnings.append(
            f"{len(missing)} model file(s) not found ({', '.join(sorted({m.name for m in missing})[:5])}"
            f"{', ...' if len(missing) > 5 else ''}); no success rate until they are found (the files found "
            "only bound the need from below)"
        )
    return ScanResult(fmt, s.models, s.skipped, s.warnings, resolver.describe(), s.nodes, s.edges)
