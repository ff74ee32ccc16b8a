"""A service as a Kubernetes LeaderWorkerSet (``xpufleet services export NAME --format lws``): pure.

LeaderWorkerSet (``leaderworkerset.x-k8s.io/v1``, kubernetes-sigs/lws) is the same idea on a cluster:
a *group* of ``size`` pods (one leader, index 0, and workers) replicated ``replicas`` times, rolled
out group by group, and recreated as one when a pod fails. The mapping (README, "Services (Units)",
documents every field):

* ``spec.replicas`` = ``replicas``; ``leaderWorkerTemplate.size`` = ``unit.size``;
* ``leaderWorkerTemplate.restartPolicy``: ``RecreateGroupOnPodRestart`` for ``guard: true`` (any pod
  failing recreates the whole group), ``None`` for ``guard: false`` (only the failed pod restarts);
* ``rolloutStrategy``: ``RollingUpdate`` with ``maxSurge: 1``, ``maxUnavailable: 0``: one extra group
  is made ready before an old one goes (make-before-break, one at a time);
* ``startupPolicy: LeaderCreated``: workers start with the leader, all in parallel;
* leader and worker templates run the same program with the same environment contract (docs/services.md);
  LWS injects ``LWS_LEADER_ADDRESS``, ``LWS_GROUP_SIZE``, ``LWS_WORKER_INDEX`` itself, the rest is set
  here from the pod's LWS labels;
* a ``Service`` selecting worker index 0 of every group: traffic reaches rank 0 only (docs/services.md).

The spec's own text (argv, env values, the model path) reaches the container unchanged: every ``$``
in it is written ``$$``, since the kubelet expands ``$(NAME)`` in ``command`` and ``env`` values and
reads ``$$`` as one ``$`` (docs/export.md). The objects are written by ``yaml.safe_dump``, so no text
adds a key or a document; the namespace must be a DNS label and the image one word of printable text.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .envcontract import HOST_ENV, PORT_ENV, PROGRAM_ENV, RENDEZVOUS_ENV, SERVICE_ENV
from .spec import CommandProgram, ModelProgram, ServiceSpec, fill_placeholders

API_VERSION = "leaderworkerset.x-k8s.io/v1"
LABEL_PREFIX = "leaderworkerset.sigs.k8s.io"
WORKER_INDEX_LABEL = f"{LABEL_PREFIX}/worker-index"
GROUP_INDEX_LABEL = f"{LABEL_PREFIX}/group-index"
GROUP_KEY_LABEL = f"{LABEL_PREFIX}/group-key"
REVISION_LABEL = f"{LABEL_PREFIX}/template-revision-hash"
SET_NAME_LABEL = f"{LABEL_PREFIX}/name"
DEFAULT_IMAGE = "python:3.11-slim"  # replace with an image that has xpufleet (and the model) installed
DEFAULT_PORT = 8000
DEFAULT_MASTER_PORT = 29500
RESOURCE_BY_KIND = {"cuda": "nvidia.com/gpu", "xpu": "gpu.intel.com/i915"}
MODEL_SERVER_ARGV = ["python", "-m", "xpufleet.server.units.model_server"]
NAMESPACE_RE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # a Kubernetes DNS-1123 label
MAX_IMAGE_CHARS = 512


def kubelet_literal(text: str) -> str:
    """``text`` as a ``command``/``env`` value the kubelet leaves as it is: ``$`` doubled, so a
    ``$(NAME)`` in a spec is not replaced by the container's variable NAME."""
    return text.replace("$", "$$")


def check_target(image: str, namespace: str | None) -> None:
    """Raise ValueError naming the field unless ``image`` is one word of printable text and
    ``namespace`` (when given) a DNS-1123 label, as Kubernetes takes them."""
    if not image or len(image) > MAX_IMAGE_CHARS or any(c.isspace() or not c.isprintable() for c in image):
        raise ValueError(f"image: must be a container image reference (printable, no spaces, at most "
                         f"{MAX_IMAGE_CHARS} characters), got {ascii(image[:80])}")
    if namespace is not None and not NAMESPACE_RE.fullmatch(namespace):
        raise ValueError(f"namespace: must be a Kubernetes namespace (lower-case letters, digits and '-', "
                         f"at most 63 characters), got {ascii(namespace[:80])}")


def _label_ref(label: str) -> dict[str, Any]:
    return {"valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{label}']"}}}


def _env(spec: ServiceSpec, port: int, master_port: int) -> list[dict[str, Any]]:
    """The contract (docs/services.md) in Kubernetes terms; ``$(LWS_LEADER_ADDRESS)`` is expanded by the kubelet
    from the variable LWS injects into every container."""
    env: list[dict[str, Any]] = [
        {"name": "RANK_ID", **_label_ref(WORKER_INDEX_LABEL)},
        {"name": "RANK", **_label_ref(WORKER_INDEX_LABEL)},
        {"name": "WORLD_SIZE", "value": str(spec.size)},
        {"name": "LOCAL_RANK", "value": "0"},
        {"name": "LOCAL_WORLD_SIZE", "value": "1"},
        {"name": "MASTER_ADDR", "value": "$(LWS_LEADER_ADDRESS)"},
        {"name": "MASTER_PORT", "value": str(master_port)},
        {"name": "UNIT_ID", **_label_ref(GROUP_INDEX_LABEL)},
        {"name": "UNIT_GENERATION", **_label_ref(REVISION_LABEL)},
        {"name": RENDEZVOUS_ENV, **_label_ref(GROUP_KEY_LABEL)},
        {"name": SERVICE_ENV, "value": spec.name},
        {"name": PORT_ENV, "value": str(port)},
        {"name": HOST_ENV, "value": "0.0.0.0"},
    ]
    if isinstance(spec.program, ModelProgram):
        program = json.dumps({"model": spec.to_json()["program"]["model"]}, separators=(",", ":"))
        env.append({"name": PROGRAM_ENV, "value": kubelet_literal(program)})
    else:
        env += [{"name": k, "value": kubelet_literal(v)} for k, v in spec.program.env]
    return env


def _argv(spec: ServiceSpec, port: int, master_port: int) -> list[str]:
    if isinstance(spec.program, CommandProgram):
        return fill_placeholders([kubelet_literal(a) for a in spec.program.argv], {
            "port": str(port), "host": "0.0.0.0", "rank": "$(RANK_ID)", "size": str(spec.size),
            "master_addr": "$(LWS_LEADER_ADDRESS)", "master_port": str(master_port)})
    return list(MODEL_SERVER_ARGV)


def _template(spec: ServiceSpec, role: str, image: str, port: int, master_port: int) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "instance", "image": image, "command": _argv(spec, port, master_port),
        "env": _env(spec, port, master_port),
    }
    kind = spec.device.split(":")[0]
    if kind in RESOURCE_BY_KIND:
        container["resources"] = {"limits": {RESOURCE_BY_KIND[kind]: 1}}  # one card per instance
    if role == "leader":
        container["ports"] = [{"name": "http", "containerPort": port, "protocol": "TCP"}]
        container["readinessProbe"] = {"httpGet": {"path": spec.health_path, "port": port},
                                       "periodSeconds": 2, "failureThreshold": 3}
    return {
        "metadata": {"labels": {"app.kubernetes.io/name": spec.name, "xpufleet.io/role": role}},
        "spec": {"containers": [container],
                 "terminationGracePeriodSeconds": int(max(1, round(spec.drain_timeout_s)))},
    }


def lws_manifest(spec: ServiceSpec, image: str = DEFAULT_IMAGE, namespace: str | None = None,
                 port: int = DEFAULT_PORT, master_port: int = DEFAULT_MASTER_PORT) -> list[dict[str, Any]]:
    """The LeaderWorkerSet and the leader Service for ``spec`` (two Kubernetes objects); ValueError for
    an image or namespace Kubernetes would not take (:func:`check_target`)."""
    check_target(image, namespace)
    meta: dict[str, Any] = {"name": spec.name,
                            "labels": {"app.kubernetes.io/name": spec.name, "app.kubernetes.io/managed-by": "xpufleet"}}
    if namespace:
        meta["namespace"] = namespace
    lws = {
        "apiVersion": API_VERSION,
        "kind": "LeaderWorkerSet",
        "metadata": meta,
        "spec": {
            "replicas": spec.replicas,
            "startupPolicy": "LeaderCreated",
            "rolloutStrategy": {"type": "RollingUpdate",
                                "rollingUpdateConfiguration": {"maxSurge": 1, "maxUnavailable": 0}},
            "networkConfig": {"subdomainPolicy": "Shared"},
            "leaderWorkerTemplate": {
                "size": spec.size,
                "restartPolicy": "RecreateGroupOnPodRestart" if spec.guard else "None",
                "leaderTemplate": _template(spec, "leader", image, port, master_port),
                "workerTemplate": _template(spec, "worker", image, port, master_port),
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": dict(meta),
        "spec": {"selector": {SET_NAME_LABEL: spec.name, WORKER_INDEX_LABEL: "0"},
                 "ports": [{"name": "http", "port": 80, "targetPort": port, "protocol": "TCP"}]},
    }
    return [lws, service]


def to_yaml(docs: list[dict[str, Any]]) -> str:
    """Kubernetes YAML, one document per object (``kubectl apply -f`` reads it)."""
    import yaml

    return "---\n".join(yaml.safe_dump(d, sort_keys=False, default_flow_style=False) for d in docs)
