// The utilization the sampler recorded, as an inline SVG line chart: percent against seconds.

import { h, number } from "./dom.js";

const SVG = "http://www.w3.org/2000/svg";
const COLOURS = { CPU: "#1f77b4", "GPU (NVML)": "#2ca02c", "SM activity (GPM)": "#ff7f0e" };
const WIDTH = 640;
const HEIGHT = 150;
const PAD = { left: 34, right: 8, top: 8, bottom: 20 };

function svg(tag, attributes = {}, text = null) {
  const element = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attributes)) element.setAttribute(name, value);
  if (text !== null) element.textContent = text;
  return element;
}

function axes(root, seconds) {
  const bottom = HEIGHT - PAD.bottom;
  for (const percent of [0, 50, 100]) {
    const y = bottom - ((bottom - PAD.top) * percent) / 100;
    root.append(svg("line", { x1: PAD.left, x2: WIDTH - PAD.right, y1: y, y2: y, class: "grid" }));
    root.append(svg("text", { x: PAD.left - 4, y: y + 4, "text-anchor": "end", class: "tick" }, `${percent}%`));
  }
  root.append(svg("text", { x: PAD.left, y: HEIGHT - 4, class: "tick" }, "0 s"));
  root.append(
    svg("text", { x: WIDTH - PAD.right, y: HEIGHT - 4, "text-anchor": "end", class: "tick" }, `${number(seconds, 1)} s`),
  );
}

function line(series, seconds) {
  const bottom = HEIGHT - PAD.bottom;
  const scaleX = (WIDTH - PAD.left - PAD.right) / Math.max(seconds, 1e-9);
  const points = series.points.map(([t, value]) => {
    const clipped = Math.max(0, Math.min(100, value));
    return `${(PAD.left + t * scaleX).toFixed(1)},${(bottom - ((bottom - PAD.top) * clipped) / 100).toFixed(1)}`;
  });
  return svg("polyline", {
    points: points.join(" "),
    fill: "none",
    stroke: COLOURS[series.name] || "#7f7f7f",
    "stroke-width": 1.6,
  });
}

export function utilizationChart(usage) {
  const events = usage.events;
  if (!events || !events.series.length) {
    const means = usage.summary;
    if (!means) return h("p", { class: "muted" }, "No utilization was recorded for this run.");
    const parts = ["CPU", "GPU (NVML)", "SM activity (GPM)"]
      .filter((name) => means[name] !== null && means[name] !== undefined)
      .map((name) => `${name} ${number(means[name], 1)} %`);
    return h("p", {}, `Utilization (means from summary.json): ${parts.join(", ") || "n/a"}.`, reasons(means));
  }
  const root = svg("svg", { viewBox: `0 0 ${WIDTH} ${HEIGHT}`, class: "chart", role: "img" });
  root.append(svg("title", {}, `Utilization over ${events.seconds} s, from ${events.source}`));
  axes(root, events.seconds);
  for (const series of events.series) root.append(line(series, events.seconds));
  const legend = events.series.map((series) =>
    h(
      "span",
      { class: "legend" },
      h("span", { class: "swatch", style: { background: COLOURS[series.name] || "#7f7f7f" } }),
      `${series.name}: mean ${number(series.mean, 1)} %`,
    ),
  );
  return h(
    "figure",
    { class: "usage" },
    root,
    h("figcaption", {}, legend, h("span", { class: "muted" }, ` (${events.source}, ${number(events.seconds, 1)} s)`)),
    usage.summary ? reasons(usage.summary) : null,
  );
}

function reasons(means) {
  const why = [means.gpu_unavailable_reason, means.gpm_unavailable_reason].filter(Boolean);
  const unique = [...new Set(why)];
  return unique.length ? h("p", { class: "muted" }, `GPU figures n/a: ${unique.join("; ")}.`) : null;
}
