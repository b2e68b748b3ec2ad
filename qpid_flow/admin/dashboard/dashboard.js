// qpid-flow's live dashboard: polls the admin API every second and redraws two tables.
// No framework and no build step. Every value comes from clients (destination names,
// container ids), so the page is built with textContent only, never innerHTML.
"use strict";

const POLL_MS = 1000;
const TOKEN_KEY = "qpid-flow-admin-token";

function headers() {
  // Beyond loopback the API needs the admin token; it lives in this tab only.
  const token = sessionStorage.getItem(TOKEN_KEY);
  return token ? { Authorization: `Bearer ${token}` } : {};
}

async function getJSON(path) {
  const response = await fetch(path, { headers: headers(), cache: "no-store" });
  if (response.status === 401 || response.status === 403) {
    const error = new Error("the admin token is needed");
    error.needsToken = true;
    throw error;
  }
  if (!response.ok) {
    const error = new Error(`${path}: ${response.status}`);
    error.status = response.status;
    throw error;
  }
  return response.json();
}

function cell(row, text, className) {
  const td = document.createElement("td");
  td.textContent = text === undefined || text === null ? "-" : String(text);
  if (className) td.className = className;
  row.appendChild(td);
  return td;
}

function label(td, name) {
  // The column name, shown beside the value when the table turns into cards (phones).
  td.dataset.label = name;
  return td;
}

function depthBar(record) {
  // Depth against the limit that applies: messages if max_count is set, else bytes.
  const byCount = record.maxCount > 0;
  const max = byCount ? record.maxCount : record.maxSize;
  const value = byCount ? record.depth : record.bytes;
  const stop = byCount ? record.flowStopCount : record.flowStopSize;
  const resume = byCount ? record.flowResumeCount : record.flowResumeSize;
  const wrap = document.createElement("div");
  wrap.className = "depth";
  const text = document.createElement("span");
  text.className = "depth-text";
  text.textContent = max > 0
    ? `${record.depth} msgs${byCount ? ` / ${max}` : ` (${formatBytes(value)} / ${formatBytes(max)})`}`
    : `${record.depth} msgs (unbounded)`;
  if (max > 0) {
    const bar = document.createElement("div");
    bar.className = "bar";
    const fill = document.createElement("div");
    fill.className = record.flowStopped ? "fill stopped" : "fill";
    fill.style.width = `${Math.min(100, (100 * value) / max)}%`;
    bar.appendChild(fill);
    for (const [mark, kind] of [[stop, "stop"], [resume, "resume"]]) {
      if (mark > 0) {
        const tick = document.createElement("div");
        tick.className = `tick ${kind}`;
        tick.style.left = `${Math.min(100, (100 * mark) / max)}%`;
        tick.title = `${kind} at ${byCount ? mark : formatBytes(mark)}`;
        bar.appendChild(tick);
      }
    }
    wrap.appendChild(bar);
  }
  wrap.appendChild(text);
  if (stop > 0) {
    const thresholds = document.createElement("span");
    thresholds.className = "thresholds";
    thresholds.textContent = byCount ? `stop ${stop} | resume ${resume}` : `stop ${formatBytes(stop)} | resume ${formatBytes(resume)}`;
    wrap.appendChild(thresholds);
  }
  return wrap;
}

function formatBytes(n) {
  if (n === undefined || n === null) return "-";
  const units = ["B", "KiB", "MiB", "GiB"];
  let value = n;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${unit === 0 ? value : value.toFixed(1)} ${units[unit]}`;
}

function drawDestinations(records) {
  const body = document.querySelector("#destinations tbody");
  const rows = records.map((record) => {
    const row = document.createElement("tr");
    row.dataset.destination = record.name;
    row.dataset.flowStopped = record.flowStopped ? "true" : "false";
    label(cell(row, record.name, "name"), "destination");
    const depth = label(document.createElement("td"), "depth");
    depth.appendChild(depthBar(record));
    row.appendChild(depth);
    const flow = label(document.createElement("td"), "flow");
    const badge = document.createElement("span");
    badge.className = record.flowStopped ? "badge stopped" : "badge flowing";
    badge.textContent = record.flowStopped ? "stopped" : "flowing";
    flow.appendChild(badge);
    row.appendChild(flow);
    label(cell(row, record.flowStoppedCount, "num flow-stopped-count"), "times stopped");
    const blocked = record.producersBlocked ? ` (${record.producersBlocked})` : "";
    label(cell(row, `${record.producers}${blocked}`, "num"), "producers (blocked)");
    label(cell(row, record.consumers, "num"), "consumers");
    label(cell(row, record.groups, "num"), "groups");
    label(cell(row, formatBytes(record.bytes), "num"), "bytes");
    return row;
  });
  body.replaceChildren(...rows);
  document.getElementById("total-destinations").textContent = String(records.length);
  document.getElementById("total-stopped").textContent = String(records.filter((r) => r.flowStopped).length);
}

function drawConnections(records) {
  const body = document.querySelector("#connections tbody");
  const rows = records.map((record) => {
    const row = document.createElement("tr");
    row.dataset.connection = record.id;
    label(cell(row, record.id), "id");
    label(cell(row, record.remote), "remote");
    label(cell(row, record.user), "user");
    label(cell(row, record.container, "name"), "container");
    label(cell(row, record.opened), "opened");
    label(cell(row, record.links, "num"), "links");
    return row;
  });
  body.replaceChildren(...rows);
  document.getElementById("total-connections").textContent = String(records.length);
}

function setStatus(state, text) {
  const status = document.getElementById("status");
  status.dataset.state = state;
  status.textContent = text;
}

async function poll() {
  try {
    const destinations = await getJSON("/v1/destinations");
    drawDestinations(destinations.destinations);
    try {
      drawConnections((await getJSON("/v1/connections")).connections);
      document.getElementById("connections-unavailable").hidden = true;
    } catch (error) {
      if (error.needsToken) throw error;
      document.getElementById("connections-unavailable").hidden = false;
    }
    document.getElementById("token-form").hidden = true;
    setStatus("live", `live, updated ${new Date().toLocaleTimeString()}`);
  } catch (error) {
    if (error.needsToken) {
      document.getElementById("token-form").hidden = false;
      setStatus("token", "the admin token is needed");
    } else {
      setStatus("disconnected", `disconnected (${error.message}), retrying`);
    }
  }
}

document.getElementById("token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, document.getElementById("token").value);
  poll();
});

poll();
setInterval(poll, POLL_MS);
