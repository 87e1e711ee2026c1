// The plugin's routes. The iframe's base is /data/plugin/diagnose/, so these resolve there.

async function getJSON(route, params = {}) {
  const query = new URLSearchParams(params).toString();
  const response = await fetch(query ? `${route}?${query}` : route);
  const body = await response.json().catch(() => ({ error: `${route}: HTTP ${response.status}` }));
  if (!response.ok) throw new Error(body.error || `${route}: HTTP ${response.status}`);
  return body;
}

export const listing = () => getJSON("runs");
export const run = (name) => getJSON("run", { run: name });
export const utilization = (name) => getJSON("utilization", { run: name });
export const comparison = (folder) => getJSON("compare", { folder });
export const reportImage = (folder) => `report.png?${new URLSearchParams({ folder })}`;

// A profile is analysed once, in the background: ask until it is done or failed. Cards and the
// comparisons that show the same run share one poll.
const polls = new Map();

export function diagnosis(name, onProgress = () => {}, intervalMs = 1000) {
  let poll = polls.get(name);
  if (!poll) {
    poll = { listeners: [], promise: null };
    poll.promise = (async () => {
      for (;;) {
        const state = await run(name);
        if (state.state === "done" || state.state === "failed") return state;
        poll.listeners.forEach((listener) => listener(state));
        await new Promise((resolve) => setTimeout(resolve, intervalMs));
      }
    })();
    poll.promise.catch(() => polls.delete(name));
    polls.set(name, poll);
  }
  poll.listeners.push(onProgress);
  return poll.promise;
}

// Reload: ask again (the server answers from its cache unless the profile changed).
export function forget() {
  polls.clear();
}

// The Profile tab's own pages for the same capture (xprof): the tab, and its input-pipeline page.
export function profileLinks(item) {
  const page = new URLSearchParams({ run: item.profile_run, tool: "input_pipeline_analyzer", host: item.hosts[0] });
  return { tab: "../../../#profile", page: `../profile/index.html?${page}` };
}
