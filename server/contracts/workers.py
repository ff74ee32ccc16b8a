"""The worker and pool contracts: the bodies of the ``/api/workers`` and ``/api/pools`` routes
(docs/workers.md, docs/slurm-and-k8s.md)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from .base import OBJECT_TEXTS, Contract, refuse, ruled

DEVICE_MODES = ("exclusive", "shared")


class JoinTokenRequest(Contract):
    """``POST /api/workers/join-tokens``: a one-time token an agent joins with."""

    shape_texts = OBJECT_TEXTS
    name: Annotated[str | None, refuse("name must be a string (the worker's name) or absent")] = None
    ttl_s: Annotated[float | None, refuse("ttl_s must be a number of seconds")] = None


class SshWorker(Contract):
    """``POST /api/workers/ssh``: a worker this server starts and keeps over SSH. Each field's value is
    checked by the SSH supervisor (ssh/manager.py: a worker name, the ssh target, the folders)."""

    shape_texts = OBJECT_TEXTS
    name: Annotated[Any, ruled(str)] = None
    host: Annotated[Any, ruled(str)] = Field(None, description="user@host")
    port: Annotated[Any, ruled(int | None)] = None
    identity: Annotated[Any, ruled(str | None)] = Field(None, description="key file here")
    python: Annotated[Any, ruled(str | None)] = Field(None, description="the host's python (default python3)")
    remote_dir: Annotated[Any, ruled(str | None)] = Field(None, description="default .xpufleet-ssh/NAME in the home")
    devices: Annotated[Any, ruled(str | None)] = None
    simulate: Annotated[Any, ruled(str | None)] = None
    mounts: Annotated[Any, ruled(list[str] | None)] = Field(None, description="LABEL=/folder")


class DeviceMode(Contract):
    """``PUT /api/workers/{name}/devices/{device}/mode``: a card held by one run, or shared by memory."""

    shape_texts = OBJECT_TEXTS
    missing_texts = {"mode": "send {\"mode\": \"exclusive\"} or {\"mode\": \"shared\"}"}
    mode: Annotated[Any, ruled(Literal[DEVICE_MODES])]  # type: ignore[valid-type]  # (the registry's texts)


class SlurmPool(Contract):
    """A Slurm pool's settings (docs/slurm-and-k8s.md)."""

    partition: str | None = None
    gres: str | None = None
    time_limit: str | None = None
    account: str | None = None
    sbatch_args: list[str] | None = None
    python: str | None = None
    max_jobs: int | None = None
    idle_exit_s: float | None = None
    retries: int | None = None
    simulate_gib: float | None = None
    server_url: str | None = None
    workdir: str | None = None


class PoolCreate(Contract):
    """``POST /api/pools``: a one-shot worker pool."""

    shape_texts = OBJECT_TEXTS
    name: Annotated[Any, ruled(str)] = None  # (the registry checks a pool name with its texts)
    # (the Slurm spec's rules check it, with their texts: server/slurm/spec.py; a union's first branch
    # error would name `literal[True]` for an unknown setting)
    slurm: Annotated[Any, ruled(Literal[True] | SlurmPool | None)] = Field(
        None, description="a Slurm pool (docs/slurm-and-k8s.md); true: the defaults")
    # An allow-list: it becomes an argument of the agents' command line (a Slurm script, a pod, a join command).
    comfyui: Annotated[str | None, refuse("comfyui must be the ComfyUI folder on the pool's machines, an absolute "
                                          "path of letters, digits and . _ - + @ / (at most 1024 characters), "
                                          "or absent")] = Field(
        None, pattern=r"^/[A-Za-z0-9._+@/-]{0,1023}$",
        description="the pool's instances run ComfyUI workflows: their agents start with --comfyui PATH")


class PoolExport(Contract):
    """``POST /api/pools/{name}/export``: the pool as Kubernetes manifests."""

    shape_texts = OBJECT_TEXTS
    format: Literal["k8s"] | None = Field(None, description="k8s (the default): a Secret and an Indexed Job")
    image: str | None = Field(None, description="the container image, a reference without spaces")
    namespace: str | None = Field(None, description="an RFC 1123 label")
    gpus: int | None = Field(None, description="nvidia.com/gpu limit per pod (0: none)")
    instances: int | None = Field(None, description="the Job's completions and parallelism")
    python: str | None = Field(None, description="the interpreter in the image")
    server_url: str | None = Field(None, description="the URL the pods reach")
    credential: str | None = Field(None, description="the pool's current credential (else it is reissued)")
    node_selector: dict[str, str] | None = Field(None, description="default nvidia.com/gpu.present=true")
