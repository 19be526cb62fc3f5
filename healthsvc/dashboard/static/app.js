// healthsvc dashboard: the runs page ("/") and a run's page ("/runs/{run_id}").
// Plain JavaScript over the service's JSON endpoints; uPlot (vendored) draws the curves, a canvas
// the heatmap. Everything the tests and the benchmark assert is kept in window.dashboard.
"use strict";

const POLL_MS = 3000;           // live updates: a training run's page follows within a few seconds
const RUNS_POLL_MS = 3000;
const TOKEN_KEY = "healthsvc.token";
const dashboard = window.dashboard = { page: null, ready: false, markers: [], charts: {}, heatmap: null,
                                       runs: [], errors: [], loads: 0, t0: performance.now() };

// ---------------------------------------------------------------------------------- helpers

const $ = (sel, root = document) => root.querySelector(sel);
const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
const fmt = (x, d = 4) => x == null ? "–" : typeof x !== "number" ? String(x)
  : Number.isInteger(x) ? String(x)
  : (Math.abs(x) >= 1e6 || (x !== 0 && Math.abs(x) < 1e-3)) ? x.toExponential(2) : String(+x.toFixed(d));
function ago(ts) {
  if (ts == null) return "never";
  const s = Math.max(0, Date.now() / 1000 - ts);
  return s < 90 ? `${Math.round(s)} s ago` : s < 5400 ? `${Math.round(s / 60)} min ago` : s < 172800 ? `${Math.round(s / 3600)} h ago` : `${Math.round(s / 86400)} d ago`;
}
const badge = (h) => `<span class="badge h-${esc(h || "info")}">${esc(h || "–")}</span>`;

class ApiError extends Error {
  constructor(status, msg) { super(msg); this.status = status; }
}

function token() { return localStorage.getItem(TOKEN_KEY) || ""; }

async function api(path, opts = {}) {
  const headers = { "accept": "application/json", ...(opts.headers || {}) };
  if (token()) headers["authorization"] = `Bearer ${token()}`;
  if (opts.body !== undefined) headers["content-type"] = "application/json";
  const resp = await fetch(path, { method: opts.method || "GET", headers,
                                   body: opts.body === undefined ? undefined : JSON.stringify(opts.body) });
  const text = await resp.text();
  let doc = null;
  try { doc = text ? JSON.parse(text) : null; } catch (e) { doc = text; }
  if (!resp.ok) {
    const detail = doc && doc.detail ? (Array.isArray(doc.detail) ? doc.detail.map((d) => d.msg).join("; ") : doc.detail) : resp.statusText;
    throw new ApiError(resp.status, `${resp.status}: ${detail}`);
  }
  return doc;
}

function banner(msg, kind = "error") {
  const el = $("#banner");
  if (!msg) { el.hidden = true; return; }
  el.className = `banner ${kind === "info" ? "info" : ""}`;
  el.textContent = msg;
  el.hidden = false;
}

// An admin action: 401/403 get a message that says what to do, not a stack trace.
async function adminAction(label, path, body) {
  try {
    const out = await api(path, { method: "POST", body });
    banner(`${label}: done`, "info");
    return out;
  } catch (e) {
    if (e.status === 401) banner(`${label}: not authorised (401). Paste an admin token in the box at the top right and try again.`);
    else if (e.status === 403) banner(`${label}: forbidden (403). This token may not do that; an admin token is needed.`);
    else banner(`${label} failed: ${e.message}`);
    dashboard.lastActionError = { label, status: e.status || 0 };
    return null;
  }
}

function setupToken() {
  const box = $("#token");
  box.value = token();
  box.addEventListener("change", () => { localStorage.setItem(TOKEN_KEY, box.value.trim()); banner("token saved in this browser", "info"); });
  $("#token-clear").addEventListener("click", () => { localStorage.removeItem(TOKEN_KEY); box.value = ""; banner("token forgotten", "info"); });
}

// ---------------------------------------------------------------------------------- runs page

const runsView = { filter: { health: "", status: "", q: "" }, timer: null };

function renderRunsShell() {
  $("#crumb").textContent = "runs";
  $("#app").innerHTML = `
    <div class="filters">
      <input id="q" type="search" placeholder="search runs" size="30">
      <select id="f-health"><option value="">any health</option><option>critical</option><option>warning</option><option>ok</option></select>
      <select id="f-status"><option value="">any status</option><option>running</option><option>finished</option></select>
      <span class="dim" id="runs-count"></span><span class="spacer"></span><span class="dim" id="runs-updated"></span>
    </div>
    <table id="runs"><thead><tr><th>run</th><th>health</th><th>status</th><th>last step</th><th>world size</th>
      <th>attempts</th><th>active findings</th><th>last push</th></tr></thead><tbody></tbody></table>`;
  const f = runsView.filter;
  $("#q").addEventListener("input", (e) => { f.q = e.target.value.trim().toLowerCase(); drawRuns(); });
  $("#f-health").addEventListener("change", (e) => { f.health = e.target.value; drawRuns(); });
  $("#f-status").addEventListener("change", (e) => { f.status = e.target.value; drawRuns(); });
}

function drawRuns() {
  const f = runsView.filter;
  const rank = { critical: 0, warning: 1, ok: 2 };
  const rows = dashboard.runs
    .filter((r) => (!f.health || r.health === f.health) && (!f.status || r.status === f.status)
                   && (!f.q || r.run_id.toLowerCase().includes(f.q) || r.active_kinds.join(" ").includes(f.q)))
    .sort((a, b) => (rank[a.health] - rank[b.health]) || ((b.last_push || 0) - (a.last_push || 0)));
  $("#runs tbody").innerHTML = rows.map((r) => `
    <tr data-run="${esc(r.run_id)}" data-health="${esc(r.health)}">
      <td><a href="/runs/${encodeURIComponent(r.run_id)}">${esc(r.run_id)}</a></td>
      <td>${badge(r.health)}</td><td>${esc(r.status)}</td><td>${fmt(r.last_step)}</td><td>${fmt(r.world_size)}</td>
      <td>${r.attempt}</td><td>${r.active_findings}${r.active_kinds.length ? ` <span class="dim">${esc(r.active_kinds.join(", "))}</span>` : ""}</td>
      <td title="${r.last_push ? new Date(r.last_push * 1000).toISOString() : ""}">${ago(r.last_push)}</td>
    </tr>`).join("");
  $("#runs-count").textContent = `${rows.length} of ${dashboard.runs.length} runs`;
}

async function refreshRuns() {
  try {
    dashboard.runs = await api("/v1/dashboard/runs");
    drawRuns();
    $("#runs-updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
    dashboard.loads += 1;
    markReady();
  } catch (e) { banner(`could not load runs: ${e.message}`); }
}

function runsPage() {
  dashboard.page = "runs";
  renderRunsShell();
  refreshRuns();
  runsView.timer = setInterval(refreshRuns, RUNS_POLL_MS);
}

// ---------------------------------------------------------------------------------- run page

const run = { id: null, detail: null, findings: [], checkpoints: [], timeline: null, rollback: null, zoom: null,
              series: null, focus: null, lastStep: null, plots: {} };

function renderRunShell() {
  $("#crumb").innerHTML = `<a href="/">runs</a> / <b>${esc(run.id)}</b>`;
  $("#app").innerHTML = `
    <div class="panel" id="header"></div>
    <div class="panel"><h2>Loss and gradient norm <span class="dim">(cross-rank median, band = per-rank min–max; drag to zoom, double-click to reset)</span></h2>
      <div id="chart-loss" class="chart"></div><div id="chart-grad_norm" class="chart"></div>
      <div class="legend-marks"><span><i style="background:var(--crit)"></i>critical finding</span><span><i style="background:var(--warn)"></i>warning finding</span>
        <span><i style="background:#6e7681"></i>checkpoint</span><span><i style="background:#bc8cff"></i>restart</span>
        <span><i style="background:#ff9b50"></i>world-size change</span><span><i style="background:rgba(248,81,73,.4)"></i>onset interval</span>
        <button id="zoom-reset" type="button">reset zoom</button></div></div>
    <div class="panel"><h2>Compute time per rank <span class="dim" id="heat-scale"></span></h2>
      <div id="heat-wrap"><canvas id="heat" height="240"></canvas><div id="heat-tip" hidden></div></div>
      <div id="heat-axis" class="dim axis-note"></div>
      <div id="heat-info" class="dim"></div></div>
    <div class="grid">
      <div class="panel" id="rollback"><h2>Where to restart from</h2><div class="dim">loading…</div></div>
      <div class="panel" id="alerts"><h2>Alerts</h2><div class="dim">loading…</div></div>
    </div>
    <div class="panel" id="findings"><h2>Findings</h2><div class="dim">loading…</div></div>
    <div class="grid">
      <div class="panel" id="advice"><h2>Checkpoint interval</h2><div class="dim">loading…</div></div>
      <div class="panel" id="goodput"><h2>Goodput</h2><div class="dim">loading…</div></div>
    </div>
    <div class="panel" id="retention"><h2>Retention plan</h2><div class="dim">loading…</div></div>
    <div class="panel" id="checkpoints"><h2>Checkpoints and restarts</h2></div>`;
  $("#zoom-reset").addEventListener("click", () => setZoom(null));
}

function drawHeader() {
  const d = run.detail;
  const restarts = Math.max(0, (d.attempts || []).length - 1);
  $("#header").innerHTML = `
    <dl class="kv">
      <dt>health</dt><dd id="run-health" data-health="${esc(d.health)}">${badge(d.health)} ${d.active_findings} active finding(s) ${esc(d.active_kinds.join(", "))}</dd>
      <dt>status</dt><dd id="run-status">${esc(d.status)}${d.catching_up ? ' <span class="dim">(dashboard catching up with stored history)</span>' : ""}</dd>
      <dt>last step</dt><dd id="run-last-step">${fmt(d.last_step)}</dd>
      <dt>world size</dt><dd>${fmt(d.world_size)} <span class="dim">(${d.ranks_seen} ranks seen)</span></dd>
      <dt>attempts</dt><dd>${d.attempt} <span class="dim">(${restarts} restart(s))</span></dd>
      <dt>last push</dt><dd>${ago(d.last_push)}</dd>
    </dl>`;
}

// -- curves ------------------------------------------------------------------------------

const FIELD_TITLES = { loss: "loss", grad_norm: "gradient norm" };

function makePlot(field, el) {
  const width = Math.max(300, el.clientWidth || 800);
  const opts = {
    title: FIELD_TITLES[field], width, height: 220,
    // Dragging selects a range; we zoom by fetching it (uPlot's own zoom would only stretch the
    // points already here), so the drag does not set the scale itself.
    cursor: { sync: { key: "run", setSeries: false }, drag: { x: true, y: false, setScale: false } },
    scales: { x: { time: false } },
    series: [
      { label: "step" },
      { label: "median", stroke: field === "loss" ? "#58a6ff" : "#3fb950", width: 1.5 },
      { label: "min", stroke: "rgba(139,149,165,.5)", width: 0.5 },
      { label: "max", stroke: "rgba(139,149,165,.5)", width: 0.5 },
    ],
    bands: [{ series: [3, 2], fill: field === "loss" ? "rgba(88,166,255,.18)" : "rgba(63,185,80,.18)" }],
    axes: [{ stroke: "#8b95a5", grid: { stroke: "#263040" } }, { stroke: "#8b95a5", grid: { stroke: "#263040" }, size: 60 }],
    hooks: {
      setSelect: [(u) => onSelect(u)],
      draw: [(u) => placeMarkers(field, u)],
    },
  };
  const u = new uPlot(opts, [[], [], [], []], el);
  u.over.addEventListener("dblclick", () => setZoom(null));
  return u;
}

function onSelect(u) {
  const { left, width } = u.select;
  if (width < 3) return;
  const lo = Math.max(0, Math.round(u.posToVal(left, "x"))), hi = Math.round(u.posToVal(left + width, "x"));
  u.setSelect({ left: 0, top: 0, width: 0, height: 0 }, false);
  if (hi > lo) setZoom([lo, hi]);
}

// Zoom asks the server for the visible range, so detail appears as the range narrows.
let zoomTimer = null;
function setZoom(range) {
  run.zoom = range;
  clearTimeout(zoomTimer);
  zoomTimer = setTimeout(() => { loadSeries(); loadHeatmap(); }, 120);
}

function seriesData(s) {
  return [s.steps, s.median, s.min, s.max];
}

async function loadSeries() {
  const q = new URLSearchParams({ fields: "loss,grad_norm", points: "1000" });
  if (run.zoom) { q.set("step_min", run.zoom[0]); q.set("step_max", run.zoom[1]); }
  const s = await api(`/v1/runs/${encodeURIComponent(run.id)}/dashboard/series?${q}`);
  run.series = s;
  for (const field of ["loss", "grad_norm"]) {
    const el = $(`#chart-${field}`);
    if (!run.plots[field]) run.plots[field] = makePlot(field, el);
    const fs = s.fields[field];
    const u = run.plots[field];
    u.setData(fs ? seriesData(fs) : [[], [], [], []]);
    // Both charts span the same steps (one field may stop earlier than the other).
    const [lo, hi] = run.zoom || [s.step_min, s.step_max];
    if (hi > lo) u.setScale("x", { min: lo, max: hi });
    dashboard.charts[field] = { points: fs ? fs.steps.length : 0, nonfinite_steps: fs ? fs.nonfinite_steps : [],
                                first: fs ? fs.steps[0] : null, last: fs ? fs.steps[fs.steps.length - 1] : null };
    placeMarkers(field, u);
  }
}

// Why attempt n was started, when a supervisor decided it (the timeline's decision record):
// who, the reason, the hosts left out and the sizes; empty for a restart nobody explained.
function decisionText(attempt) {
  const e = (run.timeline ? run.timeline.entries : []).filter((x) => x.kind === "event" && x.decision
    && x.decision.from_attempt === attempt - 1).pop();
  if (!e) return "";
  const d = e.decision;
  const hosts = d.exclude_hosts.length ? ` Hosts left out: ${d.exclude_hosts.join(", ")}.` : "";
  const sizes = d.old_world_size !== d.new_world_size ? ` World size ${d.old_world_size} → ${d.new_world_size}.` : "";
  return ` — ${d.decided_by}: ${e.reason || d.reason_code}${hosts}${sizes}`;
}

// Every mark on the curves, from findings, checkpoints, restarts, world-size changes, the onset.
function markList() {
  const marks = [];
  for (const f of run.findings) {
    if (f.status !== "firing") continue;
    marks.push({ kind: "finding", cls: `finding-${f.severity}`, step: f.step, id: f.id, label: `${f.kind} (${f.severity}) at step ${f.step}` });
  }
  for (const c of run.checkpoints) marks.push({ kind: "checkpoint", cls: "checkpoint", step: c.step, label: `checkpoint ${c.step}` });
  for (const a of (run.detail ? run.detail.attempts : []).slice(1)) {
    marks.push({ kind: "restart", cls: "restart", step: a.start_step, label: `attempt ${a.attempt} resumed at step ${a.start_step}${decisionText(a.attempt)}` });
  }
  for (const e of (run.timeline ? run.timeline.entries : [])) {
    if (e.kind === "world_size_change" && e.step != null) marks.push({ kind: "world_size", cls: "world_size", step: e.step, label: `world size ${e.old_world_size ?? "?"} → ${e.new_world_size ?? "?"}` });
  }
  return marks;
}

function placeMarkers(field, u) {
  if (!u || !u.over) return;
  u.over.querySelectorAll(".marker, .onset").forEach((m) => m.remove());
  const { min, max } = u.scales.x;
  if (min == null) return;
  const placed = [];
  const add = (m, cls) => {
    if (m.step < min || m.step > max) return;
    const x = u.valToPos(m.step, "x");
    const el = document.createElement("div");
    el.className = `marker ${cls}`;
    el.style.left = `${x}px`;
    el.dataset.kind = m.kind; el.dataset.step = m.step; el.title = m.label;
    if (m.id != null) el.dataset.finding = m.id;
    u.over.appendChild(el);
    placed.push({ chart: field, kind: m.kind, cls, step: m.step, id: m.id ?? null, x });
  };
  for (const m of markList()) add(m, m.cls);
  const fs = run.series && run.series.fields[field];
  if (fs) for (const s of fs.nonfinite_steps.slice(0, 200)) add({ kind: "nonfinite", step: s, label: `non-finite at step ${s}` }, "nonfinite");
  const onset = run.rollback && run.rollback.onset;
  if (onset && onset.high >= min && onset.low <= max) {
    const x0 = u.valToPos(Math.max(onset.low, min), "x"), x1 = u.valToPos(Math.min(onset.high, max), "x");
    const el = document.createElement("div");
    el.className = "onset"; el.style.left = `${x0}px`; el.style.width = `${Math.max(2, x1 - x0)}px`;
    el.dataset.low = onset.low; el.dataset.high = onset.high; el.title = `onset ${onset.low}–${onset.high}`;
    u.over.appendChild(el);
    placed.push({ chart: field, kind: "onset", step: onset.step, low: onset.low, high: onset.high, x: x0 });
  }
  dashboard.markers = dashboard.markers.filter((m) => m.chart !== field).concat(placed);
}

function redrawMarkers() {
  for (const [field, u] of Object.entries(run.plots)) placeMarkers(field, u);
}

// -- heatmap -----------------------------------------------------------------------------

// ratio to the step median -> colour: 1.0 (like its peers) is dark, 1.5 amber, >= 2 bright red.
function heatColour(v) {
  if (v == null) return [22, 28, 35];
  const t = Math.max(0, Math.min(1, (v - 0.9) / 1.1));
  const stops = [[13, 27, 62], [33, 102, 172], [240, 180, 40], [248, 60, 50]];
  const p = t * (stops.length - 1), i = Math.min(stops.length - 2, Math.floor(p)), f = p - i;
  return stops[i].map((c, k) => Math.round(c + (stops[i + 1][k] - c) * f));
}

function heatQuery(field = "compute_time") {
  const q = new URLSearchParams({ field, max_cols: "400" });
  if (run.zoom) { q.set("step_min", run.zoom[0]); q.set("step_max", run.zoom[1]); }
  return q;
}

// ``pending``: the request already under way (the first load starts it alongside the curves').
async function loadHeatmap(pending = null) {
  let h = await (pending || api(`/v1/runs/${encodeURIComponent(run.id)}/dashboard/heatmap?${heatQuery()}`));
  if (!h.n_rows) {  // no compute_time reported: fall back to step_time
    h = await api(`/v1/runs/${encodeURIComponent(run.id)}/dashboard/heatmap?${heatQuery("step_time")}`);
  }
  drawHeatmap(h);
}

function drawHeatmap(h) {
  const canvas = $("#heat");
  // Same horizontal extent as the curves' plot area, so a column sits under the steps it covers.
  const plot = run.plots.loss;
  if (plot) { canvas.style.marginLeft = `${plot.over.offsetLeft}px`; canvas.style.width = `${plot.over.clientWidth}px`; }
  const cssW = canvas.clientWidth || 800, cssH = Math.max(80, Math.min(320, h.n_rows * 18));
  canvas.width = cssW; canvas.height = cssH; canvas.style.height = `${cssH}px`;
  const ctx = canvas.getContext("2d");
  ctx.fillStyle = "#161c23"; ctx.fillRect(0, 0, cssW, cssH);
  $("#heat-scale").textContent = h.n_rows ? `(${h.field} ÷ the step's cross-rank median; ${h.rank_width} rank(s) per row, ${h.step_width} step(s) per column)` : "";
  if (!h.n_rows || !h.n_cols) { $("#heat-info").textContent = "no per-rank times reported yet"; dashboard.heatmap = h; return; }
  const img = ctx.createImageData(h.n_cols, h.n_rows);
  for (let r = 0; r < h.n_rows; r++) {
    const row = h.values[r];
    for (let c = 0; c < h.n_cols; c++) {
      const [R, G, B] = heatColour(row[c]);
      const o = (r * h.n_cols + c) * 4;
      img.data[o] = R; img.data[o + 1] = G; img.data[o + 2] = B; img.data[o + 3] = 255;
    }
  }
  // Draw at native size off-screen, then scale up without smoothing: one pixel per cell.
  const off = document.createElement("canvas");
  off.width = h.n_cols; off.height = h.n_rows;
  off.getContext("2d").putImageData(img, 0, 0);
  ctx.imageSmoothingEnabled = false;
  ctx.drawImage(off, 0, 0, cssW, cssH);
  const last = Math.min(h.step_min + h.n_cols * h.step_width - 1, run.series ? run.series.step_max : Infinity);
  $("#heat-axis").innerHTML = `<span>rank 0 at the top, rank ${h.n_rows * h.rank_width - 1} at the bottom</span><span>steps ${h.step_min}–${last}</span>`;
  const hot = h.hottest;
  const rankText = (lo, hi) => lo === hi ? `rank ${lo}` : `ranks ${lo}–${hi}`;
  // An arrow in the margin at the slowest row: at 16,384 ranks a row is about a pixel high.
  let arrow = $("#heat-arrow");
  if (!arrow) { arrow = document.createElement("div"); arrow.id = "heat-arrow"; arrow.textContent = "▶"; $("#heat-wrap").appendChild(arrow); }
  arrow.hidden = !hot;
  if (hot) { arrow.style.top = `${(hot.row + 0.5) * (cssH / h.n_rows) - 8}px`; arrow.style.left = `${canvas.offsetLeft - 16}px`; arrow.title = rankText(hot.rank_lo, hot.rank_hi); }
  $("#heat-info").innerHTML = hot ? `slowest: <b id="heat-hottest" data-rank-lo="${hot.rank_lo}" data-rank-hi="${hot.rank_hi}">${rankText(hot.rank_lo, hot.rank_hi)}</b>, ${hot.ratio}× its step's median on average over steps ${h.step_min}–${last}` : "";
  dashboard.heatmap = { field: h.field, n_rows: h.n_rows, n_cols: h.n_cols, rank_width: h.rank_width, step_width: h.step_width,
                        step_min: h.step_min, hottest: hot, rowHeight: cssH / h.n_rows, colWidth: cssW / h.n_cols };
  canvas.onmousemove = (ev) => {
    const r = Math.floor(ev.offsetY / (cssH / h.n_rows)), c = Math.floor(ev.offsetX / (cssW / h.n_cols));
    const tip = $("#heat-tip");
    if (r < 0 || r >= h.n_rows || c < 0 || c >= h.n_cols) { tip.hidden = true; return; }
    const v = h.values[r][c], s0 = h.step_min + c * h.step_width;
    tip.textContent = `${rankText(r * h.rank_width, r * h.rank_width + h.rank_width - 1)}, steps ${s0}–${s0 + h.step_width - 1}: ${v == null ? "no data" : v + "× median"}`;
    tip.style.left = `${ev.offsetX + 12}px`; tip.style.top = `${ev.offsetY + 8}px`; tip.hidden = false;
  };
  canvas.onmouseleave = () => { $("#heat-tip").hidden = true; };
}

// -- findings, rollback, alerts, economics ------------------------------------------------

function drawFindings() {
  const el = $("#findings");
  const focus = run.focus;
  const isFocus = (f) => focus && ((focus.finding != null && f.id === focus.finding)
                                   || (focus.finding == null && (focus.kind == null || f.kind === focus.kind) && (focus.step == null || f.step === focus.step)));
  const rows = [...run.findings].reverse();
  el.innerHTML = `<h2>Findings <span class="dim">(${run.findings.length}, newest first)</span></h2>` + (rows.length ? `
    <table><thead><tr><th>id</th><th>kind</th><th>severity</th><th>status</th><th>step</th><th>onset</th><th>ranks / hosts</th><th>score</th><th>evidence</th></tr></thead><tbody>
    ${rows.map((f) => `<tr id="finding-${f.id}" data-kind="${esc(f.kind)}" data-step="${f.step}" class="${isFocus(f) ? "focus" : ""}">
      <td><a href="?finding=${f.id}" data-zoom="${f.step}">${f.id}</a></td><td>${esc(f.kind)}${f.metric ? ` <span class="dim">${esc(f.metric)}</span>` : ""}</td>
      <td>${badge(f.severity)}</td><td>${esc(f.status)}</td><td>${f.step}</td><td>${fmt(f.onset_step)}</td>
      <td>${f.ranks.length ? esc(f.ranks.slice(0, 16).join(", ")) + (f.ranks.length > 16 ? ` … (${f.ranks.length})` : "") : '<span class="dim">run-wide</span>'}
          ${f.hosts.filter(Boolean).length ? `<br><span class="dim">${esc(f.hosts.filter(Boolean).slice(0, 8).join(", "))}</span>` : ""}</td>
      <td>${fmt(f.score, 3)}</td><td><details><summary>evidence</summary><pre>${esc(JSON.stringify(f.evidence, null, 1))}</pre></details></td></tr>`).join("")}
    </tbody></table>` : `<div class="dim">nothing found</div>`);
  el.querySelectorAll("a[data-zoom]").forEach((a) => a.addEventListener("click", (ev) => {
    ev.preventDefault();
    const id = +a.textContent;
    history.replaceState(null, "", `?finding=${id}`);
    run.focus = { finding: id };
    focusOn(+a.dataset.zoom);
    drawFindings();
  }));
}

// Zoom the curves to a window around a step (an alert's link, a finding clicked).
function focusOn(step) {
  const span = run.series ? Math.max(100, Math.round((run.series.step_max - run.series.step_min) * 0.1)) : 200;
  setZoom([Math.max(0, step - span), step + span]);
}

function drawRollback(r, bisection) {
  const el = $("#rollback");
  if (!r) { el.innerHTML = `<h2>Where to restart from</h2><div class="dim">unavailable</div>`; return; }
  const ck = r.checkpoint, on = r.onset;
  el.innerHTML = `<h2>Where to restart from</h2>
    <dl class="kv">
      <dt>checkpoint</dt><dd id="rollback-checkpoint" data-step="${ck ? ck.step : ""}">${ck ? `step <b>${ck.step}</b> <span class="dim">${esc(ck.uri)}</span>` : "<b>none</b>: start from scratch"}</dd>
      <dt>onset</dt><dd id="rollback-onset">${on ? `step ${on.step} (interval ${on.low}–${on.high}${on.confidence != null ? `, confidence ${fmt(on.confidence, 2)}` : ""})` : "no corruption seen"}</dd>
      ${r.skip_data_range ? `<dt>skip data</dt><dd>${esc(JSON.stringify(r.skip_data_range))}</dd>` : ""}
      <dt>bisection</dt><dd id="bisection">${bisection ? describeBisection(bisection) : '<span class="dim">none running (POST …/bisection or healthsvc bisect start)</span>'}</dd>
    </dl>
    <p class="reason" id="rollback-reason">${esc(r.reason)}</p>
    <details><summary>the whole answer</summary><pre>${esc(JSON.stringify(r, null, 1))}</pre></details>`;
}

function describeBisection(b) {
  const next = b.next_probe;
  const parts = [];
  if (b.done) parts.push("<b>done</b>");
  if (next) parts.push(`next probe: step <b>${esc(next.step ?? next)}</b>`);
  if (b.last_good != null) parts.push(`last good ${esc(b.last_good)}`);
  if (b.first_bad != null) parts.push(`first bad ${esc(b.first_bad)}`);
  return parts.join(" · ") + `<details><summary>state</summary><pre>${esc(JSON.stringify(b, null, 1))}</pre></details>`;
}

function drawAlerts(list) {
  const el = $("#alerts");
  const alerts = list ? list.alerts : null;
  el.innerHTML = `<h2>Alerts</h2>` + (alerts == null ? `<div class="dim">alerting unavailable</div>` : alerts.length ? `
    <table><thead><tr><th>alert</th><th>severity</th><th>status</th><th>since step</th><th></th></tr></thead><tbody>
    ${alerts.map((a) => `<tr data-fingerprint="${esc(a.fingerprint)}">
      <td>${esc(a.labels.alertname)} <span class="dim">rank ${esc(a.labels.rank)}</span><br><span class="dim">${esc(a.summary)}</span></td>
      <td>${badge(a.severity)}</td><td>${esc(a.status)}${a.acknowledged_by != null || a.acknowledged_at ? " · acknowledged" : ""}${(a.silenced_by || []).length ? " · silenced" : ""}</td>
      <td>${a.first_step}</td>
      <td class="row-actions"><button type="button" class="ack">acknowledge</button>
        <select class="sil-dur"><option value="3600">1 h</option><option value="14400">4 h</option><option value="86400">24 h</option></select>
        <button type="button" class="silence">silence</button></td></tr>`).join("")}</tbody></table>` : `<div class="dim">no alerts</div>`);
  el.querySelectorAll("tr[data-fingerprint]").forEach((tr) => {
    const fp = tr.dataset.fingerprint;
    const a = alerts.find((x) => x.fingerprint === fp);
    tr.querySelector(".ack").addEventListener("click", async () => {
      if (await adminAction("acknowledge", `/v1/alerts/${fp}/acknowledge`, { by: "dashboard" })) refreshRun();
    });
    tr.querySelector(".silence").addEventListener("click", async () => {
      const matchers = Object.entries(a.labels).filter(([k]) => ["alertname", "run", "rank", "metric"].includes(k))
        .map(([name, value]) => ({ name, value, op: "=" }));
      const body = { matchers, duration_s: +tr.querySelector(".sil-dur").value, created_by: "dashboard", comment: `silenced from the run page of ${run.id}` };
      if (await adminAction("silence", "/v1/silences", body)) refreshRun();
    });
  });
}

function drawEconomics(advice, retention, goodput) {
  $("#advice").innerHTML = `<h2>Checkpoint interval</h2>` + (advice ? `<dl class="kv">
    <dt>recommended</dt><dd id="advice-recommended">${advice.recommended_interval_steps != null ? `every <b>${advice.recommended_interval_steps}</b> steps` : "–"} <span class="dim">(Daly ${fmt(advice.daly_interval_s, 1)} s, Young ${fmt(advice.young_interval_s, 1)} s)</span></dd>
    <dt>current</dt><dd>${advice.current_interval_steps != null ? `every ${fmt(advice.current_interval_steps)} steps` : "–"} ${advice.current_to_optimum_ratio != null ? `<span class="dim">(${fmt(advice.current_to_optimum_ratio, 2)}× the optimum)</span>` : ""}</dd>
    <dt>checkpoint cost</dt><dd>${fmt(advice.checkpoint_cost_s, 2)} s <span class="dim">(${advice.checkpoints_observed} observed)</span></dd>
    <dt>MTBF</dt><dd>${fmt(advice.mtbf.mtbf_s / 3600, 2)} h <span class="dim">(${esc(advice.mtbf.source)})</span></dd>
    ${advice.warning ? `<dt>advice</dt><dd>${esc(advice.warning)}</dd>` : ""}</dl>` : `<div class="dim">unavailable</div>`);
  $("#goodput").innerHTML = `<h2>Goodput</h2>` + (goodput ? `<dl class="kv">
    <dt>goodput</dt><dd id="goodput-fraction">${goodput.goodput_fraction >= 0 && goodput.goodput_fraction <= 1
      ? `<b>${fmt(goodput.goodput_fraction * 100, 1)} %</b> of ${fmt(goodput.wall_s, 0)} s wall time`
      : `n/a % <span class="dim">(${fmt(goodput.wall_s, 0)} s wall time is shorter than the steps' own time: the data arrived faster than real time, as in a replay)</span>`}</dd>
    <dt>productive</dt><dd>${fmt(goodput.productive_s, 1)} s (${goodput.productive_steps} steps)</dd>
    <dt>checkpoints</dt><dd>${fmt(goodput.checkpoint_s, 1)} s</dd><dt>downtime</dt><dd>${fmt(goodput.downtime_s, 1)} s</dd>
    <dt>recompute</dt><dd>${fmt(goodput.recompute_s, 1)} s (${goodput.recomputed_steps} steps)</dd>
    <dt>corrupted</dt><dd>${fmt(goodput.corrupted_progress_s, 1)} s (${goodput.corrupted_steps} steps)</dd></dl>` : `<div class="dim">unavailable</div>`);
  $("#retention").innerHTML = `<h2>Retention plan <span class="dim">(a plan: nothing is deleted by the service)</span></h2>` + (retention ? `
    <div class="dim">keep ${retention.kept_count} checkpoint(s); ${fmt(retention.deletable_bytes / 1e9, 2)} GB may be deleted; lag window ${retention.lag_window_steps} steps${retention.over_budget ? "; <b>over budget</b>" : ""}</div>
    <table><thead><tr><th>step</th><th>action</th><th>why</th><th>uri</th></tr></thead><tbody>
    ${retention.checkpoints.map((c) => `<tr><td>${c.step}</td><td>${esc(c.action)}</td><td class="dim">${esc(c.reasons.join(", "))}</td><td class="dim">${esc(c.uri)}</td></tr>`).join("")}</tbody></table>` : `<div class="dim">unavailable</div>`);
}

function drawCheckpoints() {
  const d = run.detail;
  $("#checkpoints").innerHTML = `<h2>Checkpoints and restarts</h2>
    <div class="dim">attempts:</div><ul id="attempts">${(d.attempts || []).map((a) => `<li data-attempt="${a.attempt}">#${a.attempt} from step ${a.start_step}${esc(decisionText(a.attempt))}</li>`).join("") || "<li>none</li>"}</ul>
    <table><thead><tr><th>step</th><th>status</th><th>attempt</th><th>duration</th><th>uri</th></tr></thead><tbody>
    ${run.checkpoints.map((c) => `<tr><td>${c.step}</td><td>${esc(c.status)}</td><td>${c.attempt}</td><td>${fmt(c.duration_s, 2)} s</td><td class="dim">${esc(c.uri)}</td></tr>`).join("")}</tbody></table>`;
}

const orNull = (p) => p.catch((e) => { if (e.status === 401 || e.status === 403) banner(`not authorised to read this (${e.status}): paste a token at the top right`); return null; });

// The slower answers, after the curves are up. The rollback answer reads the run's history, so
// it is asked again only when what it rests on changed (findings, checkpoints, attempts, a
// bisection), not on every new step; economics at most every ECONOMICS_EVERY_MS; alerts each time.
const ECONOMICS_EVERY_MS = 15000;
const slow = { rollbackKey: null, economicsAt: 0 };

async function loadSlow() {
  const base = `/v1/runs/${encodeURIComponent(run.id)}`;
  const d = run.detail;
  const key = [run.findings.length, run.checkpoints.length, d.attempt, d.has_bisection].join(":");
  const wantRollback = key !== slow.rollbackKey;
  const wantEconomics = Date.now() - slow.economicsAt >= ECONOMICS_EVERY_MS;
  const [rollback, bisection, alerts, advice, retention, goodput, timeline] = await Promise.all([
    wantRollback ? orNull(api(`${base}/rollback`)) : run.rollback,
    wantRollback && d.has_bisection ? orNull(api(`${base}/bisection`)) : run.bisection || null,
    orNull(api(`/v1/alerts?run=${encodeURIComponent(run.id)}`)),
    ...(wantEconomics ? [orNull(api(`${base}/advice`)), orNull(api(`${base}/retention`)), orNull(api(`${base}/goodput`)),
                         orNull(api(`${base}/timeline`))] : [slow.advice, slow.retention, slow.goodput, run.timeline])]);
  if (wantRollback) { slow.rollbackKey = key; run.rollback = rollback; run.bisection = bisection; drawRollback(rollback, bisection); }
  if (wantEconomics) {
    slow.economicsAt = Date.now();
    Object.assign(slow, { advice, retention, goodput });
    run.timeline = timeline;
    drawEconomics(advice, retention, goodput);
    drawCheckpoints();   // the attempts list says why each was started, from the timeline
  }
  drawAlerts(alerts);
  redrawMarkers();
  dashboard.slowLoaded = (dashboard.slowLoaded || 0) + 1;
}

async function refreshRun(first = false) {
  const base = `/v1/runs/${encodeURIComponent(run.id)}`;
  try {
    const [detail, findings, checkpoints] = await Promise.all([
      api(`/v1/dashboard/runs/${encodeURIComponent(run.id)}`), api(`${base}/findings?limit=5000`), api(`${base}/checkpoints`)]);
    const changed = first || !run.detail || detail.rollup_last_step !== run.detail.rollup_last_step
      || findings.length !== run.findings.length || detail.attempt !== run.detail.attempt;
    run.detail = detail; run.findings = findings; run.checkpoints = checkpoints;
    drawHeader();
    if (changed) {
      drawFindings(); drawCheckpoints();
      const heat = api(`/v1/runs/${encodeURIComponent(run.id)}/dashboard/heatmap?${heatQuery()}`);
      heat.catch(() => {});  // handled where it is awaited; this only keeps it from counting as unhandled
      await loadSeries();
      await loadHeatmap(heat);
      if (first && run.focus) {
        const f = run.focus.finding != null ? findings.find((x) => x.id === run.focus.finding) : null;
        const step = f ? f.step : run.focus.step;
        const row = f ? $(`#finding-${f.id}`) : $("#findings tr.focus");
        if (step != null) focusOn(step);
        if (row) row.scrollIntoView({ block: "center" });
      }
      markReady();
      loadSlow();
    }
    dashboard.loads += 1;
  } catch (e) {
    if (e.status === 404) banner(`run ${run.id} does not exist`);
    else banner(`could not load run ${run.id}: ${e.message}`);
  }
}

function runPage(runId) {
  dashboard.page = "run";
  dashboard.plots = run.plots;
  run.id = runId;
  const q = new URLSearchParams(location.search);
  const h = new URLSearchParams(location.hash.slice(1));
  const num = (v) => (v == null || v === "" || isNaN(+v)) ? null : +v;
  const focus = { finding: num(q.get("finding")), kind: q.get("kind"), step: num(q.get("step") ?? h.get("step")) };
  run.focus = (focus.finding != null || focus.kind || focus.step != null) ? focus : null;
  dashboard.focus = run.focus;
  renderRunShell();
  refreshRun(true);
  setInterval(() => refreshRun(false), POLL_MS);
  window.addEventListener("resize", () => { for (const u of Object.values(run.plots)) u.setSize({ width: u.root.parentElement.clientWidth, height: 220 }); });
}

function markReady() {
  if (dashboard.ready) return;
  dashboard.ready = true;
  dashboard.readyMs = performance.now();
  document.body.dataset.ready = "1";
}

window.addEventListener("error", (e) => dashboard.errors.push(String(e.message)));
window.addEventListener("unhandledrejection", (e) => dashboard.errors.push(String(e.reason)));

setupToken();
const m = location.pathname.match(/^\/runs\/([^/]+)\/?$/);
if (m) runPage(decodeURIComponent(m[1])); else runsPage();
