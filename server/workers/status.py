"""The Workers panel (docs/workers.md): a worker's status and reason, and every field ``GET /api/workers`` lists."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ...constants import LOCAL_PROVIDER, VERSION
from ..comfyflow.reading import summary as comfyui_summary
from ..memory.admission import can_cap
from ..memory.views import card_view
from ..scheduling import build_state
from . import protocol
from .context import PartContext
from .panel_view import admission_rule, recent_runs, run_row, this_server_environment
from .ports import SshPort
from .records import Rejections


def node_type_diff(server_types: list[str] | set[str], worker_types: list[str] | set[str]) -> dict[str, Any]:
    """Which node types the worker lacks and which only it has (pure)."""
    s, w = set(server_types), set(worker_types)
    missing, extra = sorted(s - w), sorted(w - s)
    return {"match": not missing and not extra, "missing_on_worker": missing, "only_on_worker": extra}


def _names(items: list[str], n: int = 5) -> str:
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "")


def worker_status(
    *, connected: bool, drained: bool, heartbeat_age_s: float | None, late_after_s: float,
    node_types: dict[str, Any] | None, disconnected_for_s: float | None = None,
    ever_connected: bool = True, runs_in_grace: int = 0, grace_s: float = 0.0,
) -> tuple[str, str]:
    """Online / Degraded / Draining / Disconnected and the reason shown beside it (pure)."""
    if not connected:
        if not ever_connected:
            return "Disconnected", "has not connected since the server started"
        why = "disconnected" + (f" {disconnected_for_s:.0f} s ago" if disconnected_for_s is not None else "")
        if runs_in_grace:
            left = max(0.0, grace_s - (disconnected_for_s or 0.0))
            why += f"; its {runs_in_grace} run(s) keep running for up to {left:.0f} s more"
        return "Disconnected", why + ("; draining" if drained else "")
    if drained:
        return "Draining", "draining: no new runs; running runs finish"
    reasons = []
    if heartbeat_age_s is not None and heartbeat_age_s > late_after_s:
        reasons.append(f"late heartbeat: none for {heartbeat_age_s:.0f} s")
    if node_types is not None and not node_types["match"]:
        parts = []
        if node_types["missing_on_worker"]:
            parts.append(f"missing on the worker: {_names(node_types['missing_on_worker'])}")
        if node_types["only_on_worker"]:
            parts.append(f"only on the worker: {_names(node_types['only_on_worker'])}")
        reasons.append("node types differ from the server's (" + "; ".join(parts) + ")")
    if reasons:
        return "Degraded", "; ".join(reasons)
    return "Online", ""


def ssh_status(status: str, reason: str, ssh: dict[str, Any]) -> tuple[str, str]:
    """An SSH worker's status: Disabled when the user disabled it; while its agent is not connected, what
    the ssh connection is doing (pure)."""
    if ssh["disabled"]:
        return "Disabled", "disabled: its ssh connection is ended and its agent stopped; enable it to use it again"
    if status == "Disconnected" and ssh.get("state"):
        detail = ssh["state"] + (f": {ssh['detail']}" if ssh.get("detail") else "")
        return status, detail + (f"; {reason}" if reason and "has not connected" not in reason else "")
    return status, reason


# --- live state ------------------------------------------------------------------------------------


class WorkersPanel:
    """The Workers panel's data: each worker's row, this server's row, the slot view they share."""

    def __init__(self, ctx: PartContext, rejections: Rejections, ssh: SshPort | None = None,
                 part_holdings: Callable[[], dict[str, tuple[str, tuple[str, ...]]]] | None = None) -> None:
        """``ctx``: the table, the dispatcher (providers, overrides, the memory views), the links;
        ``part_holdings``: the other workers' cards of runs spread over workers (sidecar/spread.py)."""
        self.ctx = ctx
        self.rejections = rejections
        self.ssh = ssh
        self.part_holdings = part_holdings
        self._local_inventory: Any = None  # this machine's probe (devices/inventory.py), made on first use

    # --- slots view -------------------------------------------------------------------------------------
    def slot_state(self) -> Any:
        """The slot state of now (every provider's offers, the runs holding them)."""
        holdings = {r["id"]: (r["worker_id"] or LOCAL_PROVIDER, tuple(r["devices"])) for r in self.ctx.store.active()}
        holdings.update(self.part_holdings() if self.part_holdings is not None else {})
        return build_state(self.ctx.runs.provider_infos(), self.ctx.runs.overrides, holdings)

    def limit_warnings(self, name: str | None = None, state: Any = None) -> list[str]:
        """Overrides lowered by another provider of the same card (all, or those naming ``name``)."""
        state = state if state is not None else self.slot_state()
        return [w for w in state.warnings
                if name is None or f" on {name} is lowered" in w or f"offered by {name} with" in w]


    # --- the Workers panel -----------------------------------------------------------------------------
    def describe(self, name: str, state: Any = None) -> dict[str, Any]:
        """One worker as ``GET /api/workers`` lists it (every field of docs/workers.md's Workers panel)."""
        st = self.ctx.table.get(name)
        state = state if state is not None else self.slot_state()
        now_m = time.monotonic()
        hb_age = None if st.last_heartbeat is None or not st.online else now_m - st.last_heartbeat
        types = node_type_diff(self.ctx.links.server_node_types(), st.node_types) if st.version else None
        active = self.ctx.table.active_runs(name)
        disconnected_for = None if st.disconnected_at is None else now_m - st.disconnected_at
        status, reason = worker_status(
            connected=st.online, drained=st.drained, heartbeat_age_s=hb_age,
            late_after_s=protocol.heartbeat_late_s(), node_types=types if st.online else None,
            disconnected_for_s=disconnected_for, ever_connected=st.connected_since_start,
            runs_in_grace=len(active) if st.grace_handle is not None else 0, grace_s=protocol.resume_grace_s(),
        )
        ssh = self.ssh.describe(name) if self.ssh is not None and self.ssh.has(name) else None
        if ssh is not None:
            status, reason = ssh_status(status, reason, ssh)
        modes = self.ctx.table.modes(name)
        devices: list[dict[str, Any]] = []
        for d in st.devices:
            slot = state.slot_for(name, d["name"]) if st.provider is not None else None
            same = []
            limit = None
            if slot is not None:
                same = [{"provider": o.provider, "device": o.device} for o in slot.offers if o.provider != name]
                own = next((o.limit for o in slot.offers if o.provider == name), None)
                limit = slot.limit if slot.limit > 0 else own  # offline: its own limit, not 0
            used = slot.used if slot is not None else sum(1 for r in active if d["name"] in r["devices"])
            mode = modes.get(d["name"], "exclusive")
            memory = card_view(self.ctx.runs.memory, name, d["name"]) if st.provider is not None else None
            devices.append({
                "name": d["name"], "kind": d["kind"], "label": d.get("label"), "uuid": d.get("uuid"),
                "total_gib": d.get("total_gib"), "free_gib": d.get("free_gib"),
                "simulated": bool(d.get("simulated")),
                "slots_used": used,
                "slot_limit": limit,
                "limit_from": slot.limit_from if slot is not None else None,
                "mode": mode,
                "same_card_as": same,
                "last_reported": not st.online,
                "memory": memory,
                "admission": admission_rule(mode=mode, slots_used=used, slot_limit=limit, memory=memory),
            })
        last_seen_age = None if st.last_seen is None else round(time.time() - st.last_seen, 1)
        return {
            "name": name,
            "status": status,
            "status_reason": reason,
            "connected": st.online,
            "connected_since_start": st.connected_since_start,
            "auth": st.auth,
            "drained": st.drained,
            "version": st.version,
            "server_version": VERSION,
            "version_match": st.version == VERSION if st.version else None,
            "environment": st.env,
            "node_types": types,
            "last_rejection": self.rejections.last_for(name),
            "heartbeat_age_s": None if hb_age is None else round(hb_age, 1),
            "last_seen_age_s": last_seen_age,
            "simulated": any(d.get("simulated") for d in st.devices),
            "devices": devices,
            "runs": [{"id": r["id"], "name": r["name"], "status": r["status"], "devices": r["devices"],
                      "budget_gib": r["budget_gib"], "budget_source": r["budget_source"],
                      "memory_in_use": (r.get("execution_facts") or {}).get("memory_in_use"),
                      "started_at": r.get("started_at")} for r in active],
            "recent_runs": recent_runs(self.ctx.store, name),
            "agent_caps_memory": can_cap(st.provider) if st.provider is not None else None,
            "queued": len(self.ctx.table.queued_for(name)),
            "warnings": self.limit_warnings(name, state),
            "peer": st.conn.peer if st.conn is not None else None,
            "mounts": [{"label": k, "folder": v} for k, v in sorted(st.mounts.items())],
            "comfyui": comfyui_summary(st.comfyui_state, st.comfyui),  # {state, version, classes: N, error}
            "one_shot": st.one_shot,
            "one_shot_taken": st.taken if st.one_shot else None,
            "pool": st.pool,
            "ssh": ssh,
            # what the second click does (docs/workers.md: remove, delete an SSH worker, disable one with runs)
            "confirm": self._confirm_texts(name, st, ssh, active),
            # docs/workers.md, Queue on...: a draining or disabled worker is listed but cannot be chosen; a pool
            # instance is chosen through its pool
            "selectable": status not in ("Disabled", "Draining") and st.pool is None,
        }

    def _confirm_texts(self, name: str, st: Any, ssh: dict[str, Any] | None,
                       active: list[dict[str, Any]]) -> dict[str, str]:
        queued = len(self.ctx.table.queued_for(name))
        remove = (f"Remove {name}: " + ("end its ssh connection, delete the entry and everything it stored on "
                                        f"{ssh['host']} ({ssh['remote_dir']})" if ssh is not None
                                        else "revoke its credential and disconnect it")
                  + (f"; {queued} queued run(s) waiting for it fail" if queued else "")
                  + (f"; its {len(active)} running run(s) end interrupted" if active else ""))
        out = {"remove": remove}
        if ssh is not None and not ssh["disabled"]:
            out["disable"] = (f"Disable {name}: end its ssh connection and stop its agent"
                              + (f"; its {len(active)} running run(s) end interrupted" if active else "")
                              + "; queued runs for it wait until it is enabled")
        return out

    def describe_this_server(self, state: Any = None) -> dict[str, Any] | None:
        """This server's own machine as a Workers panel row (it runs local runs and takes sweep variants):
        its devices with slots, mode and admission rule, its running and recent runs, the runs queued for
        it. None when the sidecar has no local provider."""
        local = self.ctx.runs.providers.get(LOCAL_PROVIDER)
        if local is None:
            return None
        state = state if state is not None else self.slot_state()
        live = self._local_probe(local)
        active = [r for r in self.ctx.store.active() if r["worker_id"] is None and r.get("placement") == "local"]
        devices: list[dict[str, Any]] = []
        for d in local.device_details():
            now = live.get(d["name"])
            slot = state.slot_for(LOCAL_PROVIDER, d["name"])
            used = slot.used if slot is not None else sum(1 for r in active if d["name"] in r["devices"])
            limit = slot.limit if slot is not None else None
            mode = self.ctx.runs.memory.mode(local, d["name"])
            memory = card_view(self.ctx.runs.memory, LOCAL_PROVIDER, d["name"])
            devices.append({
                "name": d["name"], "kind": d.get("kind"), "label": d.get("label"), "uuid": d.get("uuid"),
                "total_gib": (now or d).get("total_gib"), "free_gib": (now or d).get("free_gib"),
                "simulated": bool(d.get("simulated")), "slots_used": used, "slot_limit": limit,
                "limit_from": slot.limit_from if slot is not None else None, "mode": mode,
                "same_card_as": [] if slot is None else [{"provider": o.provider, "device": o.device}
                                                         for o in slot.offers if o.provider != LOCAL_PROVIDER],
                "last_reported": now is None,  # the probe failed: the figures of the sidecar's start
                "memory": memory,
                "admission": admission_rule(mode=mode, slots_used=used, slot_limit=limit, memory=memory),
            })
        queued = self.ctx.store.query("SELECT COUNT(*) AS n FROM runs WHERE status='queued' AND target=?",
                                      (LOCAL_PROVIDER,))[0]["n"]
        return {
            "name": LOCAL_PROVIDER, "this_server": True, "status": "Online", "status_reason": "",
            "connected": True, "version": VERSION, "environment": this_server_environment(devices),
            "simulated": any(d["simulated"] for d in devices), "devices": devices,
            "runs": [{**run_row(r), "budget_gib": r["budget_gib"]} for r in active],
            "recent_runs": recent_runs(self.ctx.store, LOCAL_PROVIDER),
            "queued": int(queued),
            "warnings": self.limit_warnings(LOCAL_PROVIDER, state),
            "comfyui": comfyui_summary(str(getattr(local, "comfyui_state", "none") or "none"),
                                       getattr(local, "comfyui_reading", None)),
        }

    def _local_probe(self, local: Any) -> dict[str, dict[str, Any]]:
        """This machine's devices now (name -> figures); {} when the probe fails (the start figures show)."""
        from ..devices.inventory import Inventory

        try:
            if self._local_inventory is None:
                self._local_inventory = Inventory(LOCAL_PROVIDER, local.home)
            return {("mps:0" if d["name"] == "mps" else d["name"]): d for d in self._local_inventory.snapshot()}
        except Exception:  # noqa: BLE001 - a failing probe must not break the Workers panel
            return {}

    def list(self) -> list[dict[str, Any]]:
        """Every known worker but pool instances (listed with their pool), by name."""
        state = self.slot_state()
        workers = self.ctx.workers
        return [self.describe(n, state) for n in sorted(workers) if workers[n].pool is None]
