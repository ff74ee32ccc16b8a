// The plugin's own nodes on ComfyUI's canvas (docs/canvas.md): their seeds stay as set by default.
//
// ComfyUI's front end (1.27) follows every INT input named `seed` with a "control after generate"
// widget that starts at "randomize", and its INPUT_TYPES option `control_after_generate` can only add
// or remove that widget, not change its default. A training graph's seeds must stay between Runs (the
// same seed, the same run), so a new node of ours starts at "fixed"; the user may still pick randomize,
// and a saved workflow keeps what it saved (ComfyUI sets saved widget values after nodeCreated).

export const PLUGIN_CATEGORY = "XPU Fleet";
export const SEED_CONTROL_DEFAULT = "fixed";

/** Whether a node definition (ComfyUI's nodeData) is one of the plugin's nodes. */
export function isPluginNodeDef(nodeData) {
  const category = String(nodeData?.category || "");
  return category === PLUGIN_CATEGORY || category.startsWith(`${PLUGIN_CATEGORY}/`);
}

/** Set every control-after-generate widget of ``node`` (linked to a seed widget) to "fixed". */
export function fixSeedControls(node) {
  for (const widget of node.widgets || []) {
    for (const control of widget.linkedWidgets || []) {
      if (control.options?.values?.includes(SEED_CONTROL_DEFAULT)) control.value = SEED_CONTROL_DEFAULT;
    }
  }
}
