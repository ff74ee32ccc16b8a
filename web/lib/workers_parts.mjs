// Parts of the Workers panel (lib/workers_panel.mjs) drawn from GET /api/workers (docs/architecture.md,
// "Workers panel"): a worker's running and recently finished runs, the rule by which a card takes runs
// (slots, or memory on a card shared by memory: the server's `devices[].admission`), and the pools with
// their instances, waiting runs and Slurm jobs. Every figure and rule is the server's; only words are here.
import { h } from "./dom.mjs";
import { ago, duration, gib, shortId } from "./format.mjs";
import { t } from "./i18n.mjs";

/** A worker's (or this server's) runs: every running one, then the recently finished ones, each a link to
 * the run in the Runs panel. */
export function runsLine(w, openRun) {
  const link = (r, text) => h("button", { type: "button", class: "xf-link", dataset: { run: r.id, runStatus: r.status },
    onclick: () => openRun(r.id) }, text);
  const name = (r) => r.name || shortId(r.id);
  const devices = (r) => (r.devices?.length ? `, ${r.devices.join(", ")}` : "");
  const running = (w.runs || []).map((r) => link(r, `${name(r)} (${t(`runs.status.${r.status}`)}${devices(r)})`));
  const recent = (w.recent_runs || []).map((r) => link(r, t("workers.run_done", {
    name: name(r), status: t(`runs.status.${r.status}`), took: duration(r.duration_s), ago: ago(r.finished_age_s) })));
  return h("div", { class: "xf-worker-runs", dataset: { xpufleet: "worker-runs" } },
    h("div", { dataset: { xpufleet: "runs-running" } }, h("span", {}, `${t("workers.runs")}: `),
      running.length ? running : t("workers.no_runs"),
      w.queued ? h("span", { class: "xf-hint" }, ` · ${t("workers.queued", { n: w.queued })}`) : null),
    recent.length ? h("div", { dataset: { xpufleet: "runs-recent" } },
      h("span", {}, `${t("workers.recent_runs")}: `), recent) : null);
}

/** The device table's rule cell: slots used / limit on an exclusive card (with the provider whose limit
 * applies when it is another one's); on a card shared by memory what the memory rule leaves (free for a new
 * budget, reserved, runs). The server's sentence is the title. */
export function admissionCell(d, owner) {
  const a = d.admission;
  const from = d.limit_from && d.limit_from !== owner
    ? ` (${d.limit_from === "local" ? t("workers.this_server") : d.limit_from})` : "";
  if (!a) return `${d.slots_used ?? 0} / ${d.slot_limit ?? "—"}${from}`;
  if (a.by === "memory") {
    const text = a.free_for_budgets_gib == null ? t("workers.rule_memory_unknown")
      : t("workers.rule_memory", { free: gib(a.free_for_budgets_gib), reserved: gib(a.reserved_gib), n: a.runs });
    return h("span", { dataset: { xpufleet: "admission", by: "memory" }, title: a.text }, text);
  }
  const slots = `${a.used ?? d.slots_used ?? 0} / ${a.limit ?? "—"}${from}`;
  return h("span", { dataset: { xpufleet: "admission", by: "slots" }, title: a.text }, slots);
}

/** Every pool: its kind and counts, its instances (idle, running its run, gone), the runs waiting for it
 * with the server's reason, and a Slurm pool's jobs. */
export function poolsSection(pools, openRun) {
  if (!pools?.length) return null;
  return h("section", { class: "xf-pools", dataset: { xpufleet: "pools" } },
    h("h3", {}, t("workers.pools")),
    pools.map((p) => poolCard(p, openRun)));
}

function poolCard(p, openRun) {
  const counts = t("queue.pool_counts", { idle: p.idle ?? 0, busy: p.busy ?? 0, queued: p.queued ?? 0 });
  const runLink = (r) => h("button", { type: "button", class: "xf-link", dataset: { run: r.id }, onclick: () => openRun(r.id) },
    r.name || shortId(r.id));
  const instances = (p.instances || []).map((i) => h("li", { dataset: { instance: i.name, state: i.instance_state } },
    `${i.name} — ${t(`workers.instance_${i.instance_state || "gone"}`)}`, (i.runs || []).map((r) => [" ", runLink(r)])));
  const waiting = (p.waiting || []).map((r) => h("li", { dataset: { run: r.id } }, runLink(r),
    ` — ${t("workers.pool_waiting_for", { ago: ago(r.waiting_s) })}`,
    r.waiting_reason ? h("div", { class: "xf-hint", dataset: { xpufleet: "waiting-reason" } }, r.waiting_reason) : null));
  const more = (p.queued || 0) - waiting.length;
  if (more > 0) waiting.push(h("li", { class: "xf-hint" }, t("workers.pool_more", { n: more })));
  return h("article", { class: "xf-worker xf-pool", dataset: { pool: p.name, kind: p.kind } },
    h("header", { class: "xf-worker-head" },
      h("h3", {}, p.name),
      h("span", { class: "xf-tag" }, p.kind === "slurm" ? t("workers.pool_slurm") : t("queue.pool")),
      h("span", { class: "xf-hint", dataset: { xpufleet: "pool-counts" } }, counts),
      p.revoked ? h("span", { class: "xf-warn" }, t("queue.pool_revoked")) : null),
    h("div", { dataset: { xpufleet: "pool-instances" } }, h("strong", {}, `${t("workers.pool_instances")}: `),
      instances.length ? h("ul", { class: "xf-list" }, instances) : h("span", { class: "xf-hint" }, t("workers.pool_no_instances"))),
    h("div", { dataset: { xpufleet: "pool-waiting" } }, h("strong", {}, `${t("workers.pool_waiting")}: `),
      waiting.length ? h("ul", { class: "xf-list" }, waiting) : h("span", { class: "xf-hint" }, t("workers.pool_no_waiting"))),
    p.kind === "slurm" ? slurmJobs(p) : null);
}

/** A Slurm pool's jobs with their Slurm state and reason (a PENDING job is an instance starting), and the
 * report of one that never joined. */
function slurmJobs(p) {
  const jobs = p.jobs || [];
  return h("section", { class: "xf-slurm", dataset: { xpufleet: "slurm-jobs", pool: p.name } },
    h("h4", {}, t("workers.slurm_jobs", { pool: p.name })),
    jobs.length ? h("ul", { class: "xf-list" }, jobs.map((j) => h("li", { dataset: { job: j.id } },
      `${j.id}: ${j.status}${j.run_id ? ` · ${shortId(j.run_id)}` : ""}${j.report ? ` — ${j.report}` : ""}`)))
      : h("div", { class: "xf-hint" }, t("workers.slurm_none")));
}
