"""The worker and pool contracts: the bodies of the ``/api/workers`` and ``/api/pools`` routes
(docs/workers.md, docs/slurm-and-k8s.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import Contract

DEVICE_MODES = ("exclusive", "shared")


class JoinTokenRequest(Contract):
    """``POST /api/workers/join-tokens``: a one-time token an agent joins with."""

    name: str | None = None
    ttl_s: float | None = None


class SshWorker(Contract):
    """``POST /api/workers/ssh``: a worker this server starts and keeps over SSH."""

    name: str
    host: str = Field(description="user@host")
    port: int | None = None
    identity: str | None = Field(None, description="key file here")
    python: str | None = Field(None, description="the host's python (default python3)")
    remote_dir: str | None = Field(None, description="default .xpufleet-ssh/NAME in the home")
    devices: str | None = None
    simulate: str | None = None
    mounts: list[str] | None = Field(None, description="LABEL=/folder")


class DeviceMode(Contract):
    """``PUT /api/workers/{name}/devices/{device}/mode``: a card held by one run, or shared by memory."""

    mode: Literal[DEVICE_MODES]  # type: ignore[valid-type]


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

    name: str
    slurm: Literal[True] | SlurmPool | None = Field(None, description="a Slurm pool (docs/slurm-and-k8s.md); true: "
                                                                      "the defaults")


class PoolExport(Contract):
    """``POST /api/pools/{name}/export``: the pool as Kubernetes manifests."""

    format: Literal["k8s"] | None = None
    image: str | None = None
    namespace: str | None = None
    gpus: int | None = None
    instances: int | None = None
    python: str | None = None
    server_url: str | None = None
    credential: str | None = None
    node_selector: dict[str, str] | None = None
