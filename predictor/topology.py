"""P3 option ``topology``: the peak over models that must be resident together.

Seed 001 assumes a serial workflow, so its M_peak is the single largest file (known limitation 2).
Here model references flow along the graph's links, and a node needs every model that reaches it at
once: a sampler whose MODEL comes through two LoRA loaders and whose conditioning carries a ControlNet
holds the diffusion model, both LoRAs and the ControlNet together; separate branches that meet
nowhere stay separate. The peak is the largest such set (each file counted once).

What a link carries, by its type: data (LATENT, IMAGE, numbers, ...) carries nothing; CONDITIONING
carries only models applied at sampling time (ControlNet, GLIGEN); a model-typed output carries what
came in through inputs of the same type plus the node's own file; a bypassed node passes its inputs
through by type; a muted node passes nothing. API-format links have no types: there, outputs of
known encoders/samplers/decoders carry nothing and the rest carry everything (an upper bound).
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Mapping
from typing import Any

from .scan import BYPASSED, MUTED, ScanResult

DATA_TYPES = frozenset({
    "LATENT", "IMAGE", "MASK", "INT", "FLOAT", "STRING", "BOOLEAN", "COMBO", "AUDIO", "VIDEO", "SIGMAS",
    "NOISE", "SAMPLER", "CLIP_VISION_OUTPUT", "UPSCALE_MODEL_OUTPUT", "MESH", "VOXEL", "LOAD3D_CAMERA",
    "POINT", "BBOX", "TRACKS", "WEBCAM",
})
# Folders of models that stay attached to CONDITIONING until sampling
CONDITIONING_CARRIED = frozenset({"controlnet", "gligen"})
# API format: class types whose outputs are plain data
API_DATA_PRODUCERS = frozenset({
    "CLIPTextEncode", "CLIPTextEncodeSDXL", "CLIPTextEncodeFlux", "CLIPTextEncodeSD3", "TextEncodeQwenImageEdit",
    "KSampler", "KSamplerAdvanced", "SamplerCustom", "SamplerCustomAdvanced", "VAEDecode", "VAEDecodeTiled",
    "VAEEncode", "VAEEncodeTiled", "VAEEncodeForInpaint", "EmptyLatentImage", "EmptySD3LatentImage",
    "LoadImage", "CLIPVisionEncode", "ImageUpscaleWithModel", "SaveImage", "PreviewImage",
})
_MAX_PASSES = 4


def topology_peak(scan: ScanResult, sizes: Mapping[str, int]) -> dict[str, Any]:
    """The largest set of model files needed at once, from the scan's flattened graph.

    ``sizes`` maps a file key (``ModelRef.key``) to the bytes that count for it. Returns
    ``{"bytes", "node", "files"}``; never below the single largest file.
    """
    folder_of = {m.key: (m.folder or "") for m in scan.models}
    incoming: dict[str, list[tuple[str, str | None]]] = defaultdict(list)
    outgoing: dict[str, list[str]] = defaultdict(list)
    for src, dst, ltype in scan.edges:
        if src in scan.nodes and dst in scan.nodes:
            incoming[dst].append((src, ltype))
            outgoing[src].append(dst)
    # Kahn's order; whatever a cycle leaves behind is appended and refined by a few extra passes
    indeg = {n: 0 for n in scan.nodes}
    for dst, ins in incoming.items():
        indeg[dst] = len(ins)
    queue = deque(n for n, d in indeg.items() if d == 0)
    order: list[str] = []
    while queue:
        n = queue.popleft()
        order.append(n)
        for m in outgoing[n]:
            indeg[m] -= 1
            if indeg[m] == 0:
                queue.append(m)
    cyclic = len(order) < len(scan.nodes)
    if cyclic:
        seen = set(order)
        order += [n for n in scan.nodes if n not in seen]

    resident: dict[str, frozenset[str]] = {}
    edge_val: dict[tuple[str, str | None, str], frozenset[str]] = {}
    empty: frozenset[str] = frozenset()

    def inputs_of(n: str, t: str | None = None) -> list[frozenset[str]]:
        return [edge_val.get((s, lt, n), empty) for s, lt in incoming.get(n, [])
                if t is None or (lt or "").upper() == t]

    def carried(src: str, ltype: str | None) -> frozenset[str]:
        node = scan.nodes[src]
        t = (ltype or "").upper() or None
        if node.mode == MUTED or t in DATA_TYPES:
            return empty
        if t is None and node.class_type in API_DATA_PRODUCERS:
            return empty
        res = resident.get(src, empty)
        if t == "CONDITIONING":
            return frozenset(k for k in res if folder_of.get(k) in CONDITIONING_CARRIED)
        if node.io:
            return res
        same = inputs_of(src, t) if t is not None else []
        if node.mode == BYPASSED:
            pool = same or inputs_of(src)
            return empty.union(*pool)
        if same:
            return frozenset(node.refs).union(*same)
        return res

    for _ in range(_MAX_PASSES if cyclic else 1):
        for n in order:
            node = scan.nodes[n]
            own = empty if node.mode in (MUTED, BYPASSED) else frozenset(node.refs)
            resident[n] = own.union(*inputs_of(n))
            for dst in outgoing[n]:
                for s, lt in incoming[dst]:
                    if s == n:
                        edge_val[(n, lt, dst)] = carried(n, lt)
    best_bytes, best_node, best_files = 0, None, frozenset()
    for n, files in resident.items():
        if scan.nodes[n].mode in (MUTED, BYPASSED) or scan.nodes[n].io:
            continue  # a skipped node holds nothing itself; a subgraph slot only passes things on
        total = sum(sizes.get(k, 0) for k in files)
        if total > best_bytes:
            best_bytes, best_node, best_files = total, n, files
    single = max(sizes.values(), default=0)
    if single > best_bytes:  # a file loaded by a node the graph did not place (never below the seed's M_peak)
        key = max(sizes, key=lambda k: sizes[k])
        best_bytes, best_node, best_files = single, None, frozenset({key})
    return {"bytes": best_bytes, "node": best_node, "files": sorted(best_files)}
