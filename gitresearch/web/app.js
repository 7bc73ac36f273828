// gitresearch serve: reads the repo's JSON API, polls for changes, writes every string as text.
"use strict";

const COLORS = {baseline: "#1f77b4", keep: "#1a7f37", discard: "#999999", early_stop: "#d97706",
                crash: "#cc0000", timeout: "#cc0000", invalid: "#cc0000", confirming: "#6d28d9", running: "#6d28d9"};
const FAILED = new Set(["crash", "timeout", "invalid"]);
let token = null, selected = null, rows = [], metric = "val_bpb", pollMs = 2000;

// Plotly draws hover text as a small HTML subset: escape what came from train.py or a policy.
function escapeHtml(text) {
  return String(text ?? "").replace(/[&<>"']/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
}
function fmt(value, digits = 6) { return typeof value === "number" ? value.toFixed(digits) : "-"; }
function signed(value) { return typeof value === "number" ? (value >= 0 ? "+" : "") + value.toFixed(6) : "-"; }
function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined) node.textContent = text;
  if (cls) node.className = cls;
  return node;
}
async function getJson(path) {
  const response = await fetch(path, {cache: "no-store"});
  if (!response.ok) throw new Error(path + ": " + response.status);
  return response.json();
}

function card(label, value) {
  const node = el("div", undefined, "card");
  node.append(el("b", value), el("span", label));
  return node;
}
function renderSummary(s) {
  metric = s.metric || metric;
  const pct = v => typeof v === "number" ? (100 * v).toFixed(1) + " %" : "-";
  const cards = [
    card("experiments", String(s.experiments)),
    card("baseline " + metric, fmt(s.baseline_val_bpb)),
    card("best " + metric, fmt(s.best_val_bpb)),
    card("gain over baseline", pct(s.relative_gain)),
    card("noise floor (sd)", fmt(s.noise_std)),
    card("min_delta to keep", fmt(s.min_delta)),
    card("compute saved by early stop", pct(s.compute_saved)),
    card("experiments per hour", typeof s.experiments_per_hour === "number" ? s.experiments_per_hour.toFixed(1) : "-"),
  ];
  document.getElementById("summary").replaceChildren(...cards);
  const chain = document.getElementById("chain");
  chain.replaceChildren(...s.best_chain.slice().reverse().map(link => {
    const item = el("li");
    const confirmed = /^(confirmed|baseline)/.test(link.evidence || "");
    item.append(el("span", confirmed ? "✔ " : "○ ", confirmed ? "mark" : "unmarked"),
                el("b", "#" + link.experiment + " " + fmt(link.val_bpb) + " "),
                el("span", link.description + " — " + link.evidence));
    item.title = link.commit;
    item.addEventListener("click", () => select(link.experiment));
    return item;
  }));
}

function renderTable(data) {
  rows = data;
  document.getElementById("count").textContent = "(" + rows.filter(r => r.status !== "baseline").length + " and the baseline)";
  const body = document.querySelector("#experiments tbody");
  body.replaceChildren(...rows.slice().reverse().map(r => {
    const tr = el("tr");
    tr.dataset.number = r.number;
    if (r.number === selected) tr.className = "selected";
    const finished = r.finished ? new Date(r.finished * 1000).toLocaleString() : "-";
    tr.append(el("td", String(r.number), "num"), el("td", r.status, "s-" + r.status),
              el("td", fmt(r.value), "num"), el("td", signed(r.delta), "num"), el("td", r.description),
              el("td", typeof r.seconds === "number" ? r.seconds.toFixed(1) : "-", "num"),
              el("td", finished), el("td", r.policy || "-"));
    tr.addEventListener("click", () => select(r.number));
    return tr;
  }));
  renderProgress();
}

function renderProgress() {
  if (!window.Plotly) return;
  const traces = [];
  const values = rows.filter(r => typeof r.value === "number").map(r => r.value);
  const floor = values.length ? Math.min(...values) : 0;
  for (const status of ["baseline", "keep", "discard", "early_stop", "crash", "timeout", "invalid"]) {
    const these = rows.filter(r => r.status === status && (FAILED.has(status) || typeof (status === "early_stop" ? r.forecast : r.value) === "number"));
    if (!these.length) continue;
    traces.push({type: "scatter", mode: "markers", name: status.replace("_", " "),
                 x: these.map(r => r.number),
                 y: these.map(r => FAILED.has(status) ? floor : (status === "early_stop" ? r.forecast : r.value)),
                 marker: {color: COLORS[status], size: status === "keep" ? 12 : 7,
                          symbol: FAILED.has(status) ? "x" : (status === "early_stop" ? "triangle-down" : "circle"),
                          opacity: status === "discard" || status === "early_stop" ? 0.6 : 1},
                 hovertext: these.map(r => "#" + r.number + " " + escapeHtml(r.status) + " " + fmt(r.value) + "<br>" + escapeHtml(r.description)),
                 hoverinfo: "text", customdata: these.map(r => r.number)});
  }
  let best = null;
  const xs = [], ys = [];
  for (const r of rows) {
    if ((r.status === "baseline" || r.status === "keep") && typeof r.value === "number") best = best === null ? r.value : Math.min(best, r.value);
    if (best !== null) { xs.push(r.number); ys.push(best); }
  }
  traces.push({type: "scatter", mode: "lines", name: "running best", x: xs, y: ys,
               line: {shape: "hv", color: COLORS.keep, width: 2}, hoverinfo: "skip"});
  const layout = {margin: {l: 60, r: 10, t: 30, b: 40}, xaxis: {title: {text: "experiment"}},
                  yaxis: {title: {text: metric + " (lower is better)"}}, legend: {orientation: "h", y: 1.12}, uirevision: "keep"};
  const node = document.getElementById("progress");
  Plotly.react(node, traces, layout, {displaylogo: false, responsive: true});
  if (!node.dataset.bound) {
    node.on("plotly_click", event => { const n = event.points[0].customdata; if (n !== undefined) select(n); });
    node.dataset.bound = "1";
  }
}

async function select(number) {
  selected = number;
  for (const tr of document.querySelectorAll("#experiments tbody tr")) tr.classList.toggle("selected", Number(tr.dataset.number) === number);
  const data = await getJson("/api/experiments/" + number);
  const rec = data.record || {};
  document.getElementById("detail-title").textContent = "Experiment #" + number + ": " + (rec.status || "running") + " " + fmt(rec.val_bpb);
  document.getElementById("diff").textContent = data.diff || "(the baseline: no diff)";
  document.getElementById("note").textContent = (data.readable || "") + "\n" + JSON.stringify(rec, null, 2);
  if (!window.Plotly) return;
  const traces = [];
  const curve = data.curve.metric.length ? data.curve.metric : data.curve.train_loss;
  const name = data.curve.metric.length ? metric : "training loss";
  traces.push({type: "scatter", mode: "lines+markers", name: name, x: curve.map(p => p.t), y: curve.map(p => p.value), marker: {size: 4}});
  const checks = data.checks.filter(c => typeof c.t === "number");
  const withLine = checks.filter(c => typeof c.line === "number");
  if (withLine.length) {
    traces.push({type: "scatter", mode: "lines", name: "stop line", x: withLine.map(c => c.t), y: withLine.map(c => c.line), line: {dash: "dash", color: "#d97706"}});
    traces.push({type: "scatter", mode: "lines", name: "best run", x: withLine.map(c => c.t), y: withLine.map(c => c.lead), line: {dash: "dot", color: COLORS.keep}});
  }
  const forecasts = checks.filter(c => typeof c.mean === "number" && typeof c.sd === "number");
  if (forecasts.length) {
    traces.push({type: "scatter", mode: "markers", name: "forecast ± sd", x: forecasts.map(c => c.t), y: forecasts.map(c => c.mean),
                 error_y: {type: "data", array: forecasts.map(c => c.sd)}, marker: {color: "#6d28d9"}});
  }
  const stops = checks.filter(c => c.decision === "stop" || c.decision === "diverged");
  if (stops.length) {
    traces.push({type: "scatter", mode: "markers", name: "stopped here", x: stops.map(c => c.t),
                 y: stops.map(c => typeof c.value === "number" ? c.value : null), marker: {color: "#cc0000", size: 12, symbol: "x"}});
  }
  Plotly.react("curve", traces, {margin: {l: 60, r: 10, t: 30, b: 40}, xaxis: {title: {text: "seconds of training"}},
                                 yaxis: {title: {text: name}}, legend: {orientation: "h", y: 1.12}}, {displaylogo: false, responsive: true});
}

async function refresh() {
  const [summary, table] = await Promise.all([getJson("/api/summary"), getJson("/api/experiments")]);
  renderSummary(summary);
  renderTable(table.experiments);
  token = table.token;
  document.body.dataset.token = token;
  if (selected === null && rows.length) await select(rows[rows.length - 1].number);
  else if (selected !== null) await select(selected);
}

async function poll() {
  const live = document.getElementById("live");
  try {
    const state = await getJson("/api/state");
    pollMs = 1000 * (state.poll_s || 2);
    document.getElementById("root").textContent = state.root;
    if (state.token !== token) await refresh();
    live.textContent = "live: read " + new Date().toLocaleTimeString();
    live.className = "";
  } catch (err) {
    live.textContent = "not reachable: " + err.message;
    live.className = "stale";
  }
  setTimeout(poll, pollMs);
}

document.addEventListener("DOMContentLoaded", poll);
