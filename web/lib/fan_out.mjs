// Fan-out (docs/comfyui.md "Fan out"): a workflow with a seed widget queued as N runs with seeds s, s+1, ...
// spread over the free cards: a sweep over that one input (POST /api/sweeps, server/sweeps/spec.py), its
// variants' images gathered in the sweep's view in seed order.

export const SEED_INPUTS = new Set(["seed", "noise_seed"]);
export const FAN_MAX = 64;

/** Whether ``prompt`` (API format) holds a node other than the fleet's own (their classes start with XPU):
 * a ComfyUI run (server/comfyflow/kind.py decides on the server). */
export function isComfyWorkflow(prompt) {
  return Object.values(prompt || {}).some((n) => n && !String(n.class_type || "").startsWith("XPU"));
}

/** The seed widgets of ``prompt`` with a literal value (a linked seed is not one): [{path, node, input,
 * class_type, title, value}], in node order. */
export function seedInputs(prompt) {
  const out = [];
  for (const [node, spec] of Object.entries(prompt || {})) {
    for (const [input, value] of Object.entries(spec?.inputs || {})) {
      if (SEED_INPUTS.has(input) && Number.isInteger(value)) {
        out.push({ path: `${node}.${input}`, node, input, class_type: spec.class_type, title: spec?._meta?.title || spec.class_type, value });
      }
    }
  }
  return out;
}

/** ``n`` seeds from ``start``: [start, start + 1, ...]. */
export function seedRange(start, n) {
  return Array.from({ length: n }, (_, i) => start + i);
}

/** The POST /api/sweeps body of a fan-out: one parameter, its seeds in order; ``options`` as a run's. */
export function fanOutBody({ prompt, path, start, n, name, options }) {
  const body = { graph: prompt, mode: "grid", parameters: { [path]: seedRange(start, n) }, options };
  if (name) body.name = name;
  return body;
}
