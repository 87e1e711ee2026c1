// Side by side: a compare folder's runs (report.json and the picture compare drew), and any two runs
// a user picks, each with its diagnosis.

import * as api from "./api.js";
import { anchor, h, ms, number } from "./dom.js";

function firstFix(diagnosis) {
  const first = (diagnosis.recommendations || [])[0];
  return first ? `${first.title} (${number(first.estimated_gain, 2)}x)` : "nothing to fix";
}

// Rows filled from each run's diagnosis once it arrives.
const DIAGNOSIS_ROWS = [
  ["verdict", (state) => (state.diagnosis.verdict || "unknown").toUpperCase()],
  ["first recommendation", (state) => firstFix(state.diagnosis)],
];

function diagnosisRows(names, runs) {
  return DIAGNOSIS_ROWS.map(([label, pick]) => {
    const cells = names.map((name) => {
      const cell = h("td", { class: "pending" }, runs[name] ? "analysing…" : "no profile found");
      if (runs[name]) {
        api
          .diagnosis(runs[name])
          .then((state) => {
            cell.className = label === "verdict" ? `v-${state.diagnosis?.verdict}` : "";
            cell.textContent = state.state === "failed" ? `failed: ${state.error}` : pick(state);
          })
          .catch((error) => (cell.textContent = error.message));
      }
      return cell;
    });
    return h("tr", {}, h("th", {}, label), cells);
  });
}

function runLink(name, run) {
  return run ? h("a", { href: `#${anchor("run", run)}`, "data-open": run }, name) : name;
}

export async function compareCard(folder) {
  const card = h("section", { class: "card compare", "data-folder": folder.name }, h("p", { class: "analysing" }, "Reading report.json…"));
  let report;
  try {
    report = await api.comparison(folder.name);
  } catch (error) {
    card.replaceChildren(h("h3", {}, folder.name), h("p", { class: "error" }, error.message));
    return card;
  }
  const speedup = report.speedup
    ? h("span", { class: "speedup" }, `${number(report.speedup, 2)}x`, ` examples/s, ${report.target} / ${report.baseline}`)
    : null;
  const table = h(
    "table",
    { class: "side-by-side" },
    h("thead", {}, h("tr", {}, h("th", {}, ""), report.names.map((name) => h("th", {}, runLink(name, report.runs[name]))))),
    h(
      "tbody",
      {},
      report.rows.map(([label, ...cells]) => h("tr", {}, h("th", {}, label), cells.map((cell) => h("td", {}, cell)))),
      diagnosisRows(report.names, report.runs),
    ),
  );
  card.replaceChildren(
    h("h3", {}, `${folder.name === "." ? "This log folder" : folder.name}: `, report.names.join(" vs "), " ", speedup),
    h("p", { class: "muted" }, [report.device, report.model && `model ${report.model}`].filter(Boolean).join("; ")),
    report.scenario ? h("p", { class: "muted" }, `${report.scenario}.`) : null,
    table,
    report.gpu_notes.length ? h("p", { class: "muted" }, `GPU figures n/a: ${report.gpu_notes.join("; ")}.`) : null,
    report.image
      ? h("img", { class: "report", src: api.reportImage(folder.name), alt: `${folder.name}: throughput, step-time breakdown, utilization` })
      : null,
  );
  return card;
}

const PAIR_ROWS = [
  ["verdict", (d) => (d.verdict || "unknown").toUpperCase()],
  ["step time", (d) => ms(d.profile?.step_time_ms)],
  ["waiting for input", (d) => number(d.profile?.input_bound_percent, 1, " %")],
  ["device busy", (d) => (d.device?.busy_percent == null ? (d.device?.cpu_only ? "n/a (CPU only)" : "not measured") : number(d.device.busy_percent, 1, " %"))],
  ["host compute", (d) => ms(d.profile?.host_compute_ms)],
  ["steps", (d) => (d.profile ? `${d.profile.steps}${d.steps_inferred ? " (inferred)" : " (marked)"}` : "n/a")],
  ["hardware", (d) => d.profile?.hardware_type || "n/a"],
  ["slowest tf.data stage", (d) => d.profile?.slow_stages?.[0]?.stage || "none"],
];

function recommendationsColumn(diagnosis) {
  const items = (diagnosis.recommendations || []).slice(0, 4);
  if (!items.length) return h("p", { class: "muted" }, "Nothing to fix.");
  return h(
    "ol",
    {},
    items.map((item) => h("li", {}, item.title, h("span", { class: "tag gain" }, `${number(item.estimated_gain, 2)}x`))),
  );
}

async function pairTable(first, second, slot) {
  slot.replaceChildren(h("p", { class: "analysing" }, `Diagnosing ${first} and ${second}…`));
  try {
    const states = await Promise.all([api.diagnosis(first), api.diagnosis(second)]);
    const failed = states.find((state) => state.state === "failed");
    if (failed) throw new Error(`${failed.run}: ${failed.error}`);
    const diagnoses = states.map((state) => state.diagnosis);
    slot.replaceChildren(
      h(
        "table",
        { class: "side-by-side" },
        h("thead", {}, h("tr", {}, h("th", {}, ""), h("th", {}, runLink(first, first)), h("th", {}, runLink(second, second)))),
        h(
          "tbody",
          {},
          PAIR_ROWS.map(([label, pick]) =>
            h("tr", {}, h("th", {}, label), diagnoses.map((d) => h("td", { class: label === "verdict" ? `v-${d.verdict}` : null }, pick(d)))),
          ),
          h("tr", {}, h("th", {}, "recommendations"), diagnoses.map((d) => h("td", {}, recommendationsColumn(d)))),
        ),
      ),
    );
  } catch (error) {
    slot.replaceChildren(h("p", { class: "error" }, error.message));
  }
}

export function pairPicker(runs) {
  const names = runs.map((run) => run.name);
  const choose = (selected) => h("select", {}, names.map((name) => h("option", { value: name, selected: name === selected }, name)));
  const first = choose(names[0]);
  const second = choose(names[Math.min(1, names.length - 1)]);
  const slot = h("div", { class: "pair-slot" });
  const button = h("button", { onclick: () => pairTable(first.value, second.value, slot) }, "Compare");
  return h(
    "section",
    { class: "card pair" },
    h("h3", {}, "Any two runs side by side"),
    h("p", {}, first, " against ", second, " ", button),
    slot,
  );
}
