// One card per run with a profile (one per worker of a multi-worker run): the verdict, the figures,
// the ranked recommendations, the latent notes, the utilization and the links to the Profile tab.

import * as api from "./api.js";
import { utilizationChart } from "./chart.js";
import { anchor, h, megabytes, ms, number, prose } from "./dom.js";

const BREAKDOWN = [
  ["input_ms", "waiting for input", "#d62728"],
  ["host_compute_ms", "host compute", "#1f77b4"],
  ["device_compute_ms", "device compute", "#2ca02c"],
  ["kernel_launch_ms", "kernel launch", "#ff7f0e"],
  ["other_ms", "other", "#7f7f7f"],
];

export function verdictLine(state) {
  const diagnosis = state.diagnosis;
  const verdict = diagnosis.verdict || "unknown";
  return h(
    "p",
    { class: `verdict v-${verdict}` },
    h("strong", { class: "badge" }, verdict.toUpperCase()),
    " ",
    state.headline || "",
  );
}

function stepsLine(diagnosis) {
  const profile = diagnosis.profile;
  const how = diagnosis.steps_inferred
    ? `inferred from the host trace (${profile.step_source || "no step marker"}), so every figure is per inferred step`
    : `marked by the run (${profile.step_source || "step markers"})`;
  return [
    h("p", {}, h("strong", {}, "Steps: "), `${profile.steps} steps, ${how}.`),
    diagnosis.how_to_capture ? h("p", { class: "muted" }, prose(diagnosis.how_to_capture)) : null,
  ];
}

function breakdown(profile) {
  const step = profile.step_time_ms || 0;
  if (!step) return null;
  const parts = BREAKDOWN.filter(([key]) => (profile[key] || 0) > 0);
  const bar = h(
    "div",
    { class: "bar", title: `step ${ms(step)}` },
    parts.map(([key, label, colour]) =>
      h("span", {
        class: "segment",
        title: `${label}: ${ms(profile[key])}`,
        style: { width: `${(100 * profile[key]) / step}%`, background: colour },
      }),
    ),
  );
  const legend = parts.map(([key, label, colour]) =>
    h("span", { class: "legend" }, h("span", { class: "swatch", style: { background: colour } }), `${label} ${ms(profile[key])}`),
  );
  return h("div", { class: "breakdown" }, h("div", {}, `Step ${ms(step)}:`), bar, h("div", {}, legend));
}

function figures(diagnosis) {
  const profile = diagnosis.profile;
  const device = diagnosis.device || {};
  let busy = "not measured";
  if (device.busy_percent !== null && device.busy_percent !== undefined) busy = number(device.busy_percent, 1, " %");
  else if (device.cpu_only) busy = "n/a (CPU-only profile)";
  const cells = [
    ["waiting for input", number(profile.input_bound_percent, 1, " %")],
    ["device busy", busy],
    ["hardware", profile.hardware_type],
    ["profile", `${megabytes(profile.profile_mb)}, analysed in ${number(profile.analysis_seconds, 1)} s`],
  ];
  return h(
    "dl",
    { class: "figures" },
    cells.map(([label, value]) => [h("dt", {}, label), h("dd", {}, value)]),
  );
}

function builtAt(where) {
  // The user's line that built the stage, recorded by step-doctor profile: the full path on hover.
  const file = where.file.split("/").pop();
  return h(
    "p",
    { class: "built-at" },
    h("em", {}, "Built at: "),
    h("code", { title: where.file }, `${file}:${where.line}`),
    " ",
    h("code", {}, where.code),
  );
}

function proofLine(proof) {
  // Measured by step-doctor profile --prove: paired runs of the unchanged script with the fix applied in memory.
  if (!proof.gain) return h("p", { class: "muted" }, h("em", {}, `Not proved (${proof.label}): `), prose(proof.why || ""));
  const spread = `${number(proof.low, 2)}x-${number(proof.high, 2)}x over ${proof.rounds} rounds`;
  const estimate = proof.estimated_gain ? `, estimated ${number(proof.estimated_gain, 2)}x` : "";
  return h("p", {}, h("em", {}, "Proved by running it: "), `${proof.label}: ${proof.verdict} ${number(proof.gain, 2)}x (${spread})${estimate}`);
}

function recommendation(item, index) {
  const badges = [
    item.kind !== "speed" ? h("span", { class: `tag k-${item.kind}` }, item.kind) : null,
    item.removes_ms ? h("span", { class: "tag" }, `removes ${ms(item.removes_ms)} per step (${number(item.score, 0)} %)`) : null,
    item.estimated_gain ? h("span", { class: "tag gain" }, `estimated gain ${number(item.estimated_gain, 2)}x`) : null,
    ...(item.proofs || []).filter((p) => p.gain).slice(0, 1).map((p) => h("span", { class: `tag proof v-${p.verdict.replace(" ", "-")}` }, `${p.verdict} ${number(p.gain, 2)}x`)),
  ];
  return h(
    "li",
    { class: "recommendation", "data-cause": item.cause },
    h("div", { class: "title" }, h("span", { class: "rank" }, `${index + 1}.`), " ", h("strong", {}, item.title), " ", badges),
    h("p", {}, h("em", {}, "Evidence: "), prose(item.evidence)),
    item.built_at ? builtAt(item.built_at) : null,
    ...(item.proofs || []).map(proofLine),
    h("p", {}, h("em", {}, "Fix: "), prose(item.fix)),
    item.caveat ? h("p", { class: "muted" }, h("em", {}, "Caveat: "), prose(item.caveat)) : null,
    item.if_faster ? h("p", { class: "muted" }, h("em", {}, "Where the step is faster: "), prose(item.if_faster)) : null,
  );
}

function budgetLine(diagnosis) {
  // The fixes estimated together, and the cores' budget every estimate keeps within (diagnose/cpu_budget.py).
  const together = diagnosis.together;
  const budget = diagnosis.cpu_budget;
  return h(
    "p",
    { class: "together" },
    together ? [h("em", {}, "Together: "), `${together.causes.join(" + ")}, estimated gain ${number(together.estimated_gain, 2)}x. `] : null,
    budget
      ? [
          h("em", {}, "Cores' budget: "),
          `${number(budget.core_ms, 1)} core-ms per step of ${budget.cores} cores' ${number(budget.cores * budget.step_ms, 1)}, ${number(100 * budget.busy, 0)} % busy (${budget.measured ? "measured: process_cpu.json" : "a lower bound from the trace"}).`,
        ]
      : null,
  );
}

function lists(diagnosis) {
  const profile = diagnosis.profile;
  const notes = [
    ...(diagnosis.notes || []),
    ...(profile.skipped || []).map((text) => `Skipped: ${text}`),
    profile.large_profile,
    ...(profile.profiler_errors || []).map((text) => `The profiler reported: ${text}`),
  ].filter(Boolean);
  return [
    h("h4", {}, "Recommendations"),
    diagnosis.recommendations.length
      ? h("ol", { class: "recommendations" }, diagnosis.recommendations.map(recommendation))
      : h("p", { class: "muted" }, "Nothing to fix: no cause in this profile is estimated to gain 5 % or more."),
    diagnosis.recommendations.length ? budgetLine(diagnosis) : null,
    diagnosis.latent.length ? h("h4", {}, "Latent (costs little at this step time)") : null,
    diagnosis.latent.length ? h("ul", { class: "recommendations" }, diagnosis.latent.map(recommendation)) : null,
    notes.length ? h("h4", {}, "Notes") : null,
    notes.length ? h("ul", { class: "notes" }, notes.map((text) => h("li", {}, prose(text)))) : null,
  ];
}

export function diagnosisBody(state) {
  const diagnosis = state.diagnosis;
  if (diagnosis.verdict === "unreadable") {
    return [verdictLine(state), h("p", { class: "error" }, diagnosis.error)];
  }
  return [
    verdictLine(state),
    stepsLine(diagnosis),
    diagnosis.unmeasured ? h("p", { class: "warning" }, h("strong", {}, "Not measured: "), prose(diagnosis.unmeasured)) : null,
    breakdown(diagnosis.profile),
    figures(diagnosis),
    lists(diagnosis),
    h("details", { class: "text" }, h("summary", {}, prose("As `step-doctor diagnose` prints it")), h("pre", {}, state.text)),
  ];
}

function progress(state) {
  const size = megabytes(state.size_mb);
  if (state.state === "queued") return `Queued: the ${size} profile waits for the analysis before it (${number(state.waited, 0)} s).`;
  return `Analysing the ${size} profile… ${number(state.seconds || 0, 0)} s (the command line's \`step-doctor diagnose\` takes as long).`;
}

async function load(item, body) {
  const status = h("p", { class: "analysing" }, "Asking for the diagnosis…");
  const usage = h("div", { class: "usage-slot" });
  body.replaceChildren(status, usage);
  api
    .utilization(item.name)
    .then((found) => usage.replaceChildren(h("h4", {}, "Utilization"), utilizationChart(found)))
    .catch((error) => usage.replaceChildren(h("p", { class: "error" }, `Utilization: ${error.message}`)));
  try {
    const state = await api.diagnosis(item.name, (now) => status.replaceChildren(...prose(progress(now))));
    if (state.state === "failed") status.replaceChildren(h("span", { class: "error" }, `Diagnosis failed: ${state.error}`));
    else status.replaceWith(...diagnosisBody(state).flat().filter(Boolean));
  } catch (error) {
    status.replaceChildren(h("span", { class: "error" }, error.message));
  }
}

const PROFILE_TAB_HEAVY_MB = 100; // above this, opening it in the Profile tab takes GBs (diagnose/analysis.py)

function links(item) {
  const to = api.profileLinks(item);
  return h(
    "span",
    { class: "links" },
    h("a", { href: to.tab, target: "_top" }, "Profile tab"),
    " · ",
    h("a", { href: to.page, target: "_blank", rel: "noopener" }, `input pipeline of ${item.profile_run}`),
    item.size_mb >= PROFILE_TAB_HEAVY_MB
      ? h("span", { class: "muted" }, ` (the Profile tab loads the whole ${megabytes(item.size_mb)}: 20-30 GB of memory per GB)`)
      : null,
  );
}

export function runCard(item, open, onToggle) {
  const role = item.role ? h("span", { class: "tag role" }, item.role === "chief" ? "chief (worker 0)" : item.role) : null;
  const body = h("div", { class: "card-body" });
  const card = h(
    "details",
    { class: "card run", id: anchor("run", item.name), "data-run": item.name },
    h(
      "summary",
      {},
      h("span", { class: "name" }, item.name === "." ? "(the log folder itself)" : item.name),
      " ",
      role,
      h("span", { class: "muted" }, ` ${megabytes(item.size_mb)} profile, ${item.session}, host ${item.hosts.join(", ")}`),
    ),
    h("div", { class: "card-links" }, links(item)),
    body,
  );
  let loaded = false;
  card.addEventListener("toggle", () => {
    onToggle(item.name, card.open);
    if (card.open && !loaded) {
      loaded = true;
      load(item, body);
    }
  });
  card.open = open;
  return card;
}
