// The Diagnose tab. TensorBoard loads this module in an iframe (/data/plugin_entry.html?name=diagnose)
// and calls render(). TensorBoard's own reload does not reach an iframe tab: the tab reloads itself.

import * as api from "./api.js";
import { compareCard, pairPicker } from "./compare.js";
import { runCard } from "./cards.js";
import { anchor, h } from "./dom.js";

const AUTO_OPEN_MB = 100; // larger profiles are analysed when their card is opened, not on sight
const AUTO_OPEN_RUNS = 12;
const RELOAD_S = 30;

const opened = new Map(); // run name -> open or closed by the user, kept across reloads

function groups(runs) {
  const byGroup = new Map();
  for (const run of runs) {
    if (!byGroup.has(run.group)) byGroup.set(run.group, []);
    byGroup.get(run.group).push(run);
  }
  return [...byGroup.entries()];
}

function runsSection(runs) {
  let automatic = 0;
  const shouldOpen = (run) => {
    if (opened.has(run.name)) return opened.get(run.name);
    const open = run.size_mb <= AUTO_OPEN_MB && automatic < AUTO_OPEN_RUNS;
    if (open) automatic += 1;
    return open;
  };
  const remember = (name, open) => opened.set(name, open);
  return groups(runs).map(([group, members]) => {
    const cards = members.map((run) => runCard(run, shouldOpen(run), remember));
    if (members.length === 1) return cards[0];
    return h(
      "section",
      { class: "group", id: anchor("group", group) },
      h("h3", {}, `${group}: ${members.length} workers`, h("span", { class: "muted" }, " (one card per worker)")),
      cards,
    );
  });
}

function openLinkedCard(event) {
  const target = event.target.closest("a[data-open]");
  if (!target) return;
  const card = document.getElementById(anchor("run", target.dataset.open));
  if (card) {
    card.open = true;
    card.scrollIntoView({ behavior: "smooth" });
  }
  event.preventDefault();
}

let shown = null; // what the page shows, to redraw on a timer only when the log folder changed

async function show(main, status, { onlyIfChanged = false } = {}) {
  let found;
  try {
    found = await api.listing();
  } catch (error) {
    status.textContent = `Could not list the runs: ${error.message}`;
    return;
  }
  const signature = JSON.stringify([found.runs, found.compares]);
  if (onlyIfChanged && signature === shown) return;
  shown = signature;
  api.forget();
  const sections = [];
  if (found.compares.length) {
    const cards = await Promise.all(found.compares.map(compareCard));
    sections.push(h("h2", {}, "Comparisons"), cards);
  }
  if (found.runs.length >= 2) sections.push(h("h2", {}, "Compare two runs"), pairPicker(found.runs));
  if (found.runs.length) sections.push(h("h2", {}, "Runs with a profile"), runsSection(found.runs));
  else sections.push(h("p", {}, "No profile under this log folder yet (no plugins/profile/*/*.xplane.pb)."));
  if (found.truncated) sections.push(h("p", { class: "warning" }, "The log folder is large: the search stopped early."));
  main.replaceChildren(...sections.flat());
  status.textContent = `${found.runs.length} runs with a profile, ${found.compares.length} compare folders in ${found.logdir}; updated ${new Date().toLocaleTimeString()}.`;
}

export async function render() {
  document.head.append(h("link", { rel: "stylesheet", href: "./diagnose.css" }));
  const status = h("span", { class: "muted status" });
  const main = h("main", { onclick: openLinkedCard });
  const reload = h("button", { onclick: () => show(main, status) }, "Reload");
  document.body.append(
    h("header", {}, h("h1", {}, "Diagnose"), reload, " ", status),
    h("p", { class: "intro muted" }, "Why each profiled run waits, read from its profile by step-doctor: the verdict, the measured causes ranked by the time their fix removes, and the utilization around the run."),
    main,
  );
  await show(main, status);
  setInterval(() => {
    if (!document.hidden) show(main, status, { onlyIfChanged: true });
  }, RELOAD_S * 1000);
}
