"""The environment of an instance (docs/services.md): the names common frameworks read, one place.

``RANK_ID`` (docs/services.md) and, for torch.distributed/torchrun-style code and LeaderWorkerSet-style code,
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``, ``LWS_LEADER_ADDRESS``,
``LWS_GROUP_SIZE``, ``LWS_WORKER_INDEX``; plus ``UNIT_ID`` and ``UNIT_GENERATION``. Each instance sees
only its own card (as ``cuda:0``, like a pod of its own), so ``LOCAL_RANK`` is 0 and
``LOCAL_WORLD_SIZE`` 1. ``XPUFLEET_UNIT_RENDEZVOUS`` is fresh for every generation: the key prefix the
built-in model server forms its group under (a program of its own may use it the same way).
"""

from __future__ import annotations

import ipaddress

CONTRACT = ("RANK_ID", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "LWS_LEADER_ADDRESS",
            "LWS_GROUP_SIZE", "LWS_WORKER_INDEX", "UNIT_ID", "UNIT_GENERATION")
RENDEZVOUS_ENV = "XPUFLEET_UNIT_RENDEZVOUS"
SERVICE_ENV = "XPUFLEET_SERVICE"
PORT_ENV = "XPUFLEET_UNIT_PORT"  # the instance's own HTTP port (rank 0 answers requests there)
HOST_ENV = "XPUFLEET_UNIT_HOST"  # the address to listen on
PROGRAM_ENV = "XPUFLEET_UNIT_PROGRAM"  # the built-in model server's program (JSON)
# Rank 0's answer header for "my group broke: send this request to another unit" (router.py).
BROKEN_HEADER = "X-Xpufleet-Unit-Broken"


def instance_env(*, service: str, unit_id: str, generation: int, rank: int, size: int, master_addr: str,
                 master_port: int, rendezvous: str) -> dict[str, str]:
    """The contract for instance ``rank`` of generation ``generation``."""
    env = {
        "RANK_ID": str(rank), "RANK": str(rank), "WORLD_SIZE": str(size), "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port),
        "LWS_LEADER_ADDRESS": master_addr, "LWS_GROUP_SIZE": str(size), "LWS_WORKER_INDEX": str(rank),
        "UNIT_ID": unit_id, "UNIT_GENERATION": str(generation), RENDEZVOUS_ENV: rendezvous, SERVICE_ENV: service,
    }
    if is_loopback(master_addr):
        # Every instance is on this machine: gloo/NCCL must not pick another interface (docs/ddp.md).
        env["GLOO_SOCKET_IFNAME"] = "lo"
        env["NCCL_SOCKET_IFNAME"] = "lo"
    return env


def is_loopback(address: str | None) -> bool:
    if not address:
        return False
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return False


def contract_of(environ: dict[str, str]) -> dict[str, str]:
    """The contract variables as a process sees them (what an instance reports back)."""
    return {k: environ[k] for k in (*CONTRACT, RENDEZVOUS_ENV) if k in environ}
