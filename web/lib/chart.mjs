// uPlot (web/vendor/uplot, MIT), loaded on first use only, for every chart of the front end: a run's
// metrics (metrics_chart.mjs), a sweep's and a study's plots (sweep_charts.mjs).
import { h } from "./dom.mjs";

let uPlotModule = null;
let cssAdded = false;

export async function loadUPlot() {
  if (!uPlotModule) uPlotModule = (await import("../vendor/uplot/uPlot.esm.mjs")).default;
  if (!cssAdded) {
    cssAdded = true;
    document.head.append(h("link", { rel: "stylesheet", href: new URL("../vendor/uplot/uPlot.min.css", import.meta.url).href }));
  }
  return uPlotModule;
}
