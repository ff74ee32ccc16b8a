// XPU Fleet front-end extension for ComfyUI (placeholder until the UI issue: registers the extension
// and its settings so ComfyUI loads the plugin's web folder).
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";

const AUTOSTART = "XPUFleet.Sidecar.AutoStart";

// Starts a sidecar on this machine when none runs (the server decides: POST /xpufleet/sidecar/start
// answers started=false when one already runs). The Queue on... dialog goes through /xpufleet/api/...
async function ensureSidecar() {
  try {
    const state = await (await api.fetchApi("/xpufleet/sidecar")).json();
    if (state.running) return;
    const resp = await api.fetchApi("/xpufleet/sidecar/start", { method: "POST", body: "{}" });
    if (!resp.ok) console.warn("XPU Fleet: could not start the sidecar:", (await resp.json()).error);
  } catch (err) {
    console.warn("XPU Fleet: could not start the sidecar:", err);
  }
}

function settingValue(id) {
  const store = app.extensionManager?.setting;
  return store ? store.get(id) : app.ui?.settings?.getSettingValue(id);
}

app.registerExtension({
  name: "XPUFleet.Monitor",
  settings: [
    {
      id: "XPUFleet.Language",
      name: "XPU Fleet: label language",
      type: "combo",
      options: ["en", "zh"],
      defaultValue: "en",
    },
    {
      id: AUTOSTART,
      name: "XPU Fleet: start the sidecar when none runs",
      tooltip: "Starts `xpufleet start` on this machine (queued runs, workers) when ComfyUI opens or when turned on.",
      type: "boolean",
      defaultValue: false,
      onChange: (value) => {
        if (value) ensureSidecar();
      },
    },
  ],
  async setup() {
    if (settingValue(AUTOSTART)) await ensureSidecar();
  },
});
