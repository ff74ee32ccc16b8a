// XPU Fleet front-end extension for ComfyUI (placeholder until the UI issue: registers the extension
// and its settings so ComfyUI loads the plugin's web folder).
import { app } from "../../scripts/app.js";

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
  ],
});
