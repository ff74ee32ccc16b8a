"""ComfyUI's two graph formats for the plugin's nodes: API format (``{"1": {"class_type", "inputs"}}``, what
``POST /prompt``, ``xpufleet run`` and the sidecar take) and workflow format (litegraph's ``nodes``/``links``
/``groups``, what ComfyUI's canvas, File -> Open and the Templates browser load).

:func:`api_to_workflow` lays an API graph out for the canvas: one column per stage, a group per part
(Data, Model, Training, Results). :func:`workflow_to_api` is the front end's ``graphToPrompt`` for these
node types (every widget in INPUT_TYPES order, a seed's control-after-generate entry skipped, a linked
input as ``[node id, output slot]``). See docs/templates.md.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

WIDGET_TYPES = frozenset({"INT", "FLOAT", "STRING", "BOOLEAN", "COMBO"})
CONTROL_AFTER_GENERATE = "fixed"  # the value the templates carry (and the plugin's default: web/xpu_monitor.js)
SEED_NAMES = ("seed", "noise_seed")  # the front end adds a control-after-generate widget after these
WORKFLOW_VERSION = 0.4

# Layout: the stage column and the group each part of a training graph gets.
PARTS = ("Data", "Model", "Training", "Results")
_PART_OF_CLASS = {"XPUOptimizer": "Training", "XPULoss": "Training", "XPULRScheduler": "Training",
                  "XPUTrainingLoop": "Training", "XPUDDPTrainingLoop": "Training", "XPUModelLoader": "Model",
                  "XPUEvaluate": "Results", "XPUModelSaver": "Results", "XPUPredict": "Results"}
_PART_OF_CATEGORY = {"data": "Data", "models": "Model", "training": "Training", "io": "Results"}
GROUP_COLORS = {"Data": "#3f789e", "Model": "#8A8", "Training": "#b58b2a", "Results": "#a1309b"}
NODE_WIDTH, COLUMN_GAP, ROW_GAP, TITLE_H = 300, 60, 50, 30
SLOT_H, WIDGET_H, NODE_PAD = 20, 24, 14  # litegraph's slot row, a widget row (20 + 4 margin), padding
GROUP_PAD, GROUP_TITLE_H = 15, 40
VIEW_SCALE, VIEW_OFFSET = 0.6, (10, 90)  # the opening view: a 5-column graph fits a 1440-px-wide canvas
# A template's note (what to run first, what to expect): the front end's MarkdownNote, a virtual node that
# graphToPrompt leaves out; under the groups, so the thumbnail (cropped to the groups) does not show it.
NOTE_TYPE, VIRTUAL_TYPES = "MarkdownNote", frozenset({"Note", "MarkdownNote"})
NOTE_SIZE = (2 * NODE_WIDTH + COLUMN_GAP, 120)
# Room kept under a node for its results after a Run (web/lib/canvas_nodes.mjs) where they outgrow ROW_GAP:
# Predict's summary is three lines and a wrapped list.
RESULT_ROOM = {"XPUPredict": 80}


@dataclass(frozen=True)
class InputDef:
    """One entry of a node's INPUT_TYPES, in order."""

    name: str
    type: str  # "INT", ..., "COMBO" for a list of choices, or a socket type such as "XPU_MODEL"
    optional: bool
    options: dict[str, Any]

    @property
    def is_widget(self) -> bool:
        return self.type in WIDGET_TYPES and not self.options.get("forceInput")

    @property
    def has_control(self) -> bool:
        """Whether the front end follows this widget with a control-after-generate entry."""
        flag = self.options.get("control_after_generate")
        return self.type == "INT" and (bool(flag) if flag is not None else self.name in SEED_NAMES)

    def default(self) -> Any:
        if "default" in self.options:
            return self.options["default"]
        if self.type == "COMBO":
            return self.options["choices"][0]
        return {"INT": 0, "FLOAT": 0.0, "STRING": "", "BOOLEAN": False}[self.type]


@dataclass(frozen=True)
class NodeDef:
    """What the conversion needs of one node class."""

    class_type: str
    inputs: tuple[InputDef, ...]
    outputs: tuple[tuple[str, str], ...]  # (name, type) per output slot
    category: str

    @property
    def widgets(self) -> tuple[InputDef, ...]:
        return tuple(i for i in self.inputs if i.is_widget)

    @property
    def sockets(self) -> tuple[InputDef, ...]:
        return tuple(i for i in self.inputs if not i.is_widget)


def node_def(class_type: str, cls: Any) -> NodeDef:
    """A :class:`NodeDef` from a ComfyUI node class (INPUT_TYPES, RETURN_TYPES, RETURN_NAMES, CATEGORY)."""
    spec = cls.INPUT_TYPES()
    inputs = []
    for section, optional in (("required", False), ("optional", True)):
        for name, entry in (spec.get(section) or {}).items():
            kind, options = entry[0], dict(entry[1]) if len(entry) > 1 else {}
            if isinstance(kind, (list, tuple)):
                kind, options = "COMBO", {**options, "choices": list(kind)}
            inputs.append(InputDef(name, str(kind), optional, options))
    types = tuple(cls.RETURN_TYPES)
    names = tuple(getattr(cls, "RETURN_NAMES", None) or types)
    return NodeDef(class_type, tuple(inputs), tuple(zip(names, types, strict=True)), getattr(cls, "CATEGORY", ""))


def node_defs(mappings: dict[str, Any]) -> dict[str, NodeDef]:
    """:func:`node_def` for every class of ``NODE_CLASS_MAPPINGS``."""
    return {name: node_def(name, cls) for name, cls in mappings.items()}


def part_of(d: NodeDef) -> str:
    """The group a node goes in: by class where the category says too little, else by category."""
    return _PART_OF_CLASS.get(d.class_type) or _PART_OF_CATEGORY.get(d.category.rsplit("/", 1)[-1], "Results")


def _is_link(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 2 and isinstance(value[1], int)


def with_defaults(graph: dict[str, Any], defs: dict[str, NodeDef]) -> dict[str, Any]:
    """The API graph with every widget input the graph leaves out at its INPUT_TYPES default (what the
    front end sends for a node whose widget was never touched); ``_meta`` kept."""
    out: dict[str, Any] = {}
    for nid, node in graph.items():
        d = defs[node["class_type"]]
        given = node.get("inputs", {})
        inputs = {i.name: given[i.name] if i.name in given else i.default()
                  for i in d.inputs if i.is_widget or i.name in given}
        inputs.update({k: v for k, v in given.items() if k not in inputs})
        out[nid] = {**node, "inputs": inputs}
    return out


def _node_height(d: NodeDef) -> int:
    rows = max(len(d.sockets), len(d.outputs))
    widgets = sum(2 if w.has_control else 1 for w in d.widgets)
    return rows * SLOT_H + widgets * WIDGET_H + NODE_PAD


def _depths(graph: dict[str, Any], parts: dict[str, str]) -> dict[str, int]:
    """Each node's depth among the nodes of its own part (0: fed by no node of the part)."""
    memo: dict[str, int] = {}

    def depth(nid: str) -> int:
        if nid not in memo:
            memo[nid] = 0  # a cycle (invalid anyway) cannot recurse forever
            ups = [v[0] for v in graph[nid].get("inputs", {}).values() if _is_link(v) and v[0] in graph]
            memo[nid] = max((depth(u) + 1 for u in ups if parts[u] == parts[nid]), default=0)
        return memo[nid]

    return {nid: depth(nid) for nid in graph}


def layout(graph: dict[str, Any], defs: dict[str, NodeDef]) -> dict[str, tuple[int, int, int, int]]:
    """``{node id: (x, y, width, height)}``: parts left to right in :data:`PARTS` order, inside a part one
    column per depth, nodes of a column stacked in id order."""
    parts = {nid: part_of(defs[n["class_type"]]) for nid, n in graph.items()}
    depths = _depths(graph, parts)
    columns = sorted({(PARTS.index(parts[n]), depths[n]) for n in graph})
    boxes: dict[str, tuple[int, int, int, int]] = {}
    x = GROUP_PAD * 2
    for index, column in enumerate(columns):
        if index and column[0] != columns[index - 1][0]:
            x += GROUP_PAD * 2  # room between two groups
        y = GROUP_TITLE_H + TITLE_H + GROUP_PAD
        for nid in sorted((n for n in graph if (PARTS.index(parts[n]), depths[n]) == column), key=int):
            h = _node_height(defs[graph[nid]["class_type"]])
            boxes[nid] = (x, y, NODE_WIDTH, h)
            y += h + TITLE_H + ROW_GAP + RESULT_ROOM.get(graph[nid]["class_type"], 0)
        x += NODE_WIDTH + COLUMN_GAP
    return boxes


def _groups(graph: dict[str, Any], defs: dict[str, NodeDef], boxes: dict[str, tuple[int, int, int, int]]
            ) -> list[dict[str, Any]]:
    groups = []
    for part in PARTS:
        members = [boxes[n] for n in graph if part_of(defs[graph[n]["class_type"]]) == part]
        if not members:
            continue
        left = min(b[0] for b in members) - GROUP_PAD
        top = min(b[1] for b in members) - TITLE_H - GROUP_TITLE_H
        right = max(b[0] + b[2] for b in members) + GROUP_PAD
        bottom = max(b[1] + b[3] for b in members) + GROUP_PAD
        groups.append({"id": len(groups) + 1, "title": part, "bounding": [left, top, right - left, bottom - top],
                       "color": GROUP_COLORS[part], "font_size": 24, "flags": {}})
    return groups


def api_to_workflow(graph: dict[str, Any], defs: dict[str, NodeDef], name: str, note: str | None = None
                    ) -> dict[str, Any]:
    """The workflow-format twin of an API graph whose node ids are integers; ``name`` seeds its fixed id;
    ``note`` (Markdown) becomes a note under the groups."""
    full = with_defaults(graph, defs)
    boxes = layout(full, defs)
    links: list[list[Any]] = []
    out_links: dict[tuple[str, int], list[int]] = {}
    nodes = []
    order = _topological(full)

    def link(value: list[Any], target: str, slot: int, kind: str) -> int:
        links.append([len(links) + 1, int(value[0]), value[1], int(target), slot, kind])
        out_links.setdefault((value[0], value[1]), []).append(len(links))
        return len(links)

    for nid in sorted(full, key=int):
        node, d = full[nid], defs[full[nid]["class_type"]]
        inputs, values = [], []
        for i in d.sockets:
            entry: dict[str, Any] = {"name": i.name, "type": i.type, "link": None}
            if i.optional:
                entry["shape"] = 7  # litegraph's hollow dot: an optional input
            value = node["inputs"].get(i.name)
            if _is_link(value):
                entry["link"] = link(value, nid, len(inputs), i.type)
            inputs.append(entry)
        for w in d.widgets:
            entry = {"name": w.name, "type": w.type, "widget": {"name": w.name}, "link": None}
            if w.optional:
                entry["shape"] = 7
            value = node["inputs"][w.name]
            if _is_link(value):  # a widget fed by a node: its socket carries the link, the value is the default
                entry["link"], value = link(value, nid, len(inputs), w.type), w.default()
            inputs.append(entry)
            values.append(value)
            if w.has_control:
                values.append(CONTROL_AFTER_GENERATE)
        x, y, width, height = boxes[nid]
        nodes.append({"id": int(nid), "type": d.class_type, "pos": [x, y], "size": [width, height], "flags": {},
                      "order": order.index(nid), "mode": 0, "inputs": inputs,
                      "outputs": [{"name": n, "type": t, "links": None, "slot_index": s}
                                  for s, (n, t) in enumerate(d.outputs)],
                      "title": node.get("_meta", {}).get("title", d.class_type),
                      "properties": {"Node name for S&R": d.class_type}, "widgets_values": values})
    for n in nodes:
        for slot, output in enumerate(n["outputs"]):
            output["links"] = out_links.get((str(n["id"]), slot)) or None
    groups = _groups(full, defs, boxes)
    if note:
        bottom = max(g["bounding"][1] + g["bounding"][3] for g in groups)
        nodes.append({"id": max(int(n) for n in full) + 1, "type": NOTE_TYPE, "pos": [GROUP_PAD, bottom + ROW_GAP],
                      "size": list(NOTE_SIZE), "flags": {}, "order": len(nodes), "mode": 0, "inputs": [], "outputs": [],
                      "properties": {}, "widgets_values": [note], "color": "#432", "bgcolor": "#653"})
    return {"id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"xpufleet:template:{name}")), "revision": 0,
            "last_node_id": max(n["id"] for n in nodes), "last_link_id": len(links), "nodes": nodes, "links": links,
            "groups": groups, "config": {}, "extra": {"ds": {"scale": VIEW_SCALE, "offset": list(VIEW_OFFSET)}},
            "version": WORKFLOW_VERSION}


def _topological(graph: dict[str, Any]) -> list[str]:
    done: list[str] = []

    def visit(nid: str) -> None:
        if nid in done:
            return
        for v in graph[nid].get("inputs", {}).values():
            if _is_link(v) and v[0] in graph:
                visit(v[0])
        done.append(nid)

    for nid in sorted(graph, key=int):
        visit(nid)
    return done


def workflow_to_api(workflow: dict[str, Any], defs: dict[str, NodeDef]) -> dict[str, Any]:
    """The API prompt ComfyUI's front end makes of a workflow of these node types (graphToPrompt):
    widget values by INPUT_TYPES order, control-after-generate entries dropped, links resolved."""
    links = {link[0]: link for link in workflow.get("links", [])}
    out: dict[str, Any] = {}
    for node in workflow["nodes"]:
        if node.get("mode", 0) != 0 or node["type"] in VIRTUAL_TYPES:
            continue  # muted / bypassed nodes and notes are not sent
        d = defs[node["type"]]
        inputs: dict[str, Any] = {}
        values = list(node.get("widgets_values", []))
        for w in d.widgets:
            if not values:
                raise ValueError(f"node {node['id']} ({node['type']}): no value for widget {w.name!r}")
            inputs[w.name] = values.pop(0)
            if w.has_control:
                values.pop(0)
        if values:
            raise ValueError(f"node {node['id']} ({node['type']}): {len(values)} widget value(s) too many")
        for slot in node.get("inputs", []):
            if slot.get("link") is not None:
                _, origin, origin_slot, *_ = links[slot["link"]]
                inputs[slot["name"]] = [str(origin), origin_slot]
        out[str(node["id"])] = {"inputs": inputs, "class_type": node["type"], "_meta": {"title": node["title"]}}
    return out
