"""Kubernetes manifests that start one-shot agents joining a pool (pure; docs/slurm-and-k8s.md).

``xpufleet pools export NAME --format k8s`` writes three documents: the pool's credential as a Secret,
an Indexed Job whose pods each run one one-shot agent (``restartPolicy: Never``: an agent that ended its
run exits 0 and its pod completes) with ``nvidia.com/gpu`` limits and a node selector. Names follow
Kubernetes' rules (RFC 1123); a value that cannot be one is refused with the rule, never rewritten.
A control character (a newline, U+2028, ...) in any value is refused; every ``$`` in the container's
command is written ``$$``, so the kubelet, which expands ``$(VAR)`` there from the container's
environment (the credential is ``$(XPUFLEET_AGENT_JOIN_TOKEN)``), hands the agent the value as given.
There is no API-server client: nothing here could be tested against a real API server.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from ...constants import K8S_GPU_RESOURCE

_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")  # an RFC 1123 label (namespace, Job name part)
_IMAGE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-/:@+]{0,511}$")
_SEL_KEY_RE = re.compile(r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_URL_RE = re.compile(r"^https?://[^\s/?#]+(/[^\s]*)?$")
_FINGERPRINT_RE = re.compile(r"^(sha256:)?[A-Fa-f0-9:]{1,200}$")
_SEL_VALUE_RE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
NAME_PREFIX = "xpufleet-"
MAX_POOL_LEN = 63 - len(NAME_PREFIX) - len("-credential")  # every derived name stays a valid label
DEFAULT_IMAGE = "python:3.12-slim"
DEFAULT_NODE_SELECTOR = {"nvidia.com/gpu.present": "true"}  # set by NVIDIA's GPU feature discovery


class ExportError(ValueError):
    """A value that cannot go into the manifests; the text gives the rule."""


@dataclass(frozen=True)
class K8sExport:
    """What ``pools export --format k8s`` was asked for."""

    pool: str
    server_url: str
    image: str = DEFAULT_IMAGE
    namespace: str = "default"
    gpus: int = 1
    instances: int = 1
    python: str = "python3"
    fingerprint: str | None = None
    node_selector: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_NODE_SELECTOR))
    comfyui: str | None = None  # the pool runs ComfyUI workflows: its agents start with --comfyui PATH


def _control(value: str) -> bool:
    """A character that would break a line or act on a terminal: Cc, the line and paragraph separators."""
    return any(unicodedata.category(c) in ("Cc", "Zl", "Zp") for c in value)


def escape_expansion(value: str) -> str:
    """``value`` for a container's command or args: the kubelet reduces ``$$`` to ``$`` and expands
    ``$(NAME)`` from the environment, so each ``$`` is doubled."""
    return value.replace("$", "$$")


def check_export(ex: K8sExport) -> None:
    """Raise :class:`ExportError` naming the first value Kubernetes would not take."""
    for label, value in (("--server-url", ex.server_url), ("--python", ex.python), ("--image", ex.image),
                         ("--namespace", ex.namespace), ("pool name", ex.pool),
                         ("fingerprint", ex.fingerprint or ""), ("comfyui", ex.comfyui or ""),
                         *((f"--node-selector {k}", f"{k}={v}") for k, v in ex.node_selector.items())):
        if not isinstance(value, str) or _control(value):
            raise ExportError(f"{label} {value!r} holds a control character (a newline, tab, U+2028, ...): "
                              f"write it on one line")
    if not _URL_RE.match(ex.server_url):
        raise ExportError(f"--server-url {ex.server_url!r} is not a URL the pods can reach: http://HOST:PORT or "
                          f"https://HOST:PORT, no spaces")
    if ex.fingerprint is not None and not _FINGERPRINT_RE.match(ex.fingerprint):
        raise ExportError(f"fingerprint {ex.fingerprint!r} is not a SHA-256 fingerprint in hex")
    if not isinstance(ex.pool, str) or not _LABEL_RE.match(ex.pool) or len(ex.pool) > MAX_POOL_LEN:
        raise ExportError(f"pool name {ex.pool!r} cannot name Kubernetes objects: lower-case letters, digits and "
                          f"'-', starting and ending with a letter or digit, up to {MAX_POOL_LEN} characters "
                          f"(create a pool with such a name to export it)")
    if not isinstance(ex.namespace, str) or not _LABEL_RE.match(ex.namespace) or len(ex.namespace) > 63:
        raise ExportError(f"--namespace {ex.namespace!r} is not a Kubernetes namespace: lower-case letters, digits "
                          f"and '-', starting and ending with a letter or digit, up to 63 characters")
    if not isinstance(ex.image, str) or not _IMAGE_RE.match(ex.image):
        raise ExportError(f"--image {ex.image!r} is not an image reference (e.g. registry.example/xpufleet:1.0): "
                          f"letters, digits and . _ - / : @ +, no spaces")
    for label, n, high in (("--gpus", ex.gpus, 64), ("--instances", ex.instances, 10000)):
        if isinstance(n, bool) or not isinstance(n, int) or not (0 if label == "--gpus" else 1) <= n <= high:
            raise ExportError(f"{label} must be a whole number up to {high}, got {n!r}")
    if not isinstance(ex.python, str) or not ex.python or any(ord(c) < 32 for c in ex.python):
        raise ExportError("--python must be the interpreter in the image, e.g. python3 or /venv/bin/python")
    for key, value in ex.node_selector.items():
        if not _SEL_KEY_RE.match(key) or not isinstance(value, str) or not _SEL_VALUE_RE.match(value):
            raise ExportError(f"--node-selector {key}={value}: not a Kubernetes label (key [prefix/]name, value up "
                              f"to 63 letters, digits, '-', '_', '.')")


def manifests(ex: K8sExport, credential: str) -> list[dict[str, Any]]:
    """The Secret and the Job, as objects (``to_yaml`` writes them)."""
    check_export(ex)
    base = f"{NAME_PREFIX}{ex.pool}"
    labels = {"app.kubernetes.io/name": "xpufleet-agent", "xpufleet.dev/pool": ex.pool}
    if _control(credential):
        raise ExportError("the credential holds a control character: give the one the pool printed")
    secret = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
              "metadata": {"name": f"{base}-credential", "namespace": ex.namespace, "labels": labels},
              "stringData": {"credential": credential}}
    command = [ex.python, "-m", "xpufleet.server", "agent", "start", "--one-shot", "--foreground",
               "--server", ex.server_url]
    if ex.fingerprint and ex.server_url.startswith("https://"):
        command += ["--fingerprint", ex.fingerprint]
    if ex.comfyui:
        command += ["--comfyui", ex.comfyui]
    command = [escape_expansion(part) for part in command]
    container: dict[str, Any] = {
        "name": "agent", "image": ex.image, "command": command,
        "env": [{"name": "XPUFLEET_AGENT_JOIN_TOKEN",
                 "valueFrom": {"secretKeyRef": {"name": f"{base}-credential", "key": "credential"}}},
                {"name": "XPUFLEET_HOME", "value": "/tmp/xpufleet"}],
    }
    if ex.gpus:
        container["resources"] = {"limits": {K8S_GPU_RESOURCE: ex.gpus}}
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": base, "namespace": ex.namespace, "labels": labels},
           "spec": {"completionMode": "Indexed", "completions": ex.instances, "parallelism": ex.instances,
                    "backoffLimit": ex.instances * 2,
                    "template": {"metadata": {"labels": labels},
                                 "spec": {"restartPolicy": "Never", "nodeSelector": dict(ex.node_selector),
                                          "containers": [container]}}}}
    return [secret, job]


def to_yaml(docs: list[dict[str, Any]]) -> str:
    """A multi-document YAML stream (``kubectl apply -f`` takes it)."""
    return yaml.safe_dump_all(docs, sort_keys=False, default_flow_style=False)
