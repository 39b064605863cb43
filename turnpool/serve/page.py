"""The page a person opens at ``/`` of ``turnpool serve``: what the server runs, its live
sessions, step rate, step latency quantiles (p50 / p90 / p99 / p99.9, since the last poll and
since the start), failures by class (retryable or not, share, per 1000 steps, the latest
error), and plots of steps/s, sessions, step latency (p50 / p99), failures and each worker's
load over the last two minutes. Static HTML that polls
``/api/status`` once a second and keeps the plotted history itself, so the server renders
nothing per viewer and the page needs no build step or outside asset."""

from __future__ import annotations

STATUS_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>turnpool serve</title>
<style>
body{font-family:system-ui,sans-serif;margin:1.5rem;color:#222}
h1{font-size:1.3rem;margin:0 0 .8rem}
.cards{display:flex;gap:1rem;flex-wrap:wrap;margin-bottom:1rem}
.card{border:1px solid #ccc;border-radius:6px;padding:.5rem .9rem;min-width:8rem}
.card b{display:block;font-size:1.4rem}
table{border-collapse:collapse;font-size:.9rem;margin-bottom:1rem}
td,th{border-bottom:1px solid #ddd;padding:.2rem .6rem;text-align:left}
.fail{color:#a00}#error{color:#a00}
.plots{display:flex;gap:1rem;flex-wrap:wrap;margin-bottom:1rem}
.plot{border:1px solid #ccc;border-radius:6px;padding:.3rem .6rem}
.plot svg{display:block;width:260px;height:70px}
.plot span{font-size:.8rem;color:#555}
</style></head>
<body>
<h1>turnpool serve: <span id="env">?</span></h1>
<div id="error"></div>
<div class="cards">
 <div class="card">sessions<b><span id="sessions-count">0</span> /
  <span id="capacity">?</span></b></div>
 <div class="card">steps / s<b id="step-rate">0</b></div>
 <div class="card">steps<b id="steps-total">0</b></div>
 <div class="card">failures<b id="failures-total">0</b></div>
 <div class="card">backend<b id="backend">?</b></div>
</div>
<div class="plots" id="plots">
 <div class="plot"><span>steps / s <b id="plot-rate-last"></b></span>
  <svg id="plot-rate" viewBox="0 0 120 40" preserveAspectRatio="none"></svg></div>
 <div class="plot"><span>sessions <b id="plot-sessions-last"></b></span>
  <svg id="plot-sessions" viewBox="0 0 120 40" preserveAspectRatio="none"></svg></div>
 <div class="plot"><span>step latency ms, p50 / <span style="color:#c60">p99</span>
  <b id="plot-latency-last"></b></span>
  <svg id="plot-latency" viewBox="0 0 120 40" preserveAspectRatio="none"></svg></div>
 <div class="plot"><span>failures <b id="plot-failures-last"></b></span>
  <svg id="plot-failures" viewBox="0 0 120 40" preserveAspectRatio="none"></svg></div>
</div>
<h2>Workers</h2>
<table><thead><tr><th>worker</th><th>sessions</th><th>load (measured step cost, s)</th>
</tr></thead><tbody id="workers"></tbody></table>
<h2>Step latency (ms; the upper bound of the histogram bucket)</h2>
<table><thead><tr><th>steps</th><th>count</th><th>p50</th><th>p90</th><th>p99</th>
<th>p99.9</th></tr></thead><tbody id="latency-quantiles"></tbody></table>
<h2>Failures by class</h2>
<table><thead><tr><th>class</th><th>retryable</th><th>count</th><th>share</th>
<th>per 1000 steps</th><th>latest error</th></tr></thead><tbody id="failures"></tbody></table>
<h2>Recent failures</h2>
<table><thead><tr><th>when</th><th>class</th><th>error</th></tr></thead>
<tbody id="recent-failures"></tbody></table>
<h2>Sessions</h2>
<table><thead><tr><th>session</th><th>kind</th><th>slot</th><th>episode</th><th>seed</th>
<th>steps</th><th>done</th><th>failures</th><th>idle s</th></tr></thead>
<tbody id="sessions"></tbody></table>
<script>
const token = new URLSearchParams(location.search).get("token");
const headers = token ? {"Authorization": "Bearer " + token} : {};
function cell(row, text) { const td = document.createElement("td"); td.textContent = text;
  row.appendChild(td); }
function fill(id, rows) { const body = document.getElementById(id); body.replaceChildren();
  for (const r of rows) { const tr = document.createElement("tr");
    if (r.cls) tr.className = r.cls; for (const c of r.cells) cell(tr, c);
    body.appendChild(tr); } }
function set(id, text) { document.getElementById(id).textContent = text; }
const history = {rate: [], sessions: [], p50: [], p99: [], failures: []};
const KEEP = 120;
function keep(name, value) { const h = history[name]; h.push(value);
  if (h.length > KEEP) h.shift(); }
function line(svg, values, top, color) {
  const ns = "http://www.w3.org/2000/svg"; const pl = document.createElementNS(ns, "polyline");
  const pts = values.map((v, i) => (i + KEEP - values.length) + "," +
    (40 - 38 * (v == null ? 0 : v) / top).toFixed(2));
  pl.setAttribute("points", pts.join(" ")); pl.setAttribute("fill", "none");
  pl.setAttribute("stroke", color); pl.setAttribute("stroke-width", "1");
  pl.setAttribute("vector-effect", "non-scaling-stroke"); svg.appendChild(pl); }
function plot(id, series, last) {
  const svg = document.getElementById(id); svg.replaceChildren();
  const top = Math.max(1e-9, ...series.flatMap(([v]) => v.filter(x => x != null)));
  for (const [values, color] of series) line(svg, values, top, color);
  set(id + "-last", last); }
function draw() {
  const r = history.rate, n = history.sessions, f = history.failures;
  plot("plot-rate", [[r, "#36c"]], r.length ? r[r.length - 1].toFixed(0) : "");
  plot("plot-sessions", [[n, "#393"]], n.length ? n[n.length - 1] : "");
  const p50 = history.p50, p99 = history.p99;
  const fmt = v => v == null ? "-" : v.toFixed(1);
  plot("plot-latency", [[p50, "#36c"], [p99, "#c60"]],
       p50.length ? fmt(p50[p50.length - 1]) + " / " + fmt(p99[p99.length - 1]) : "");
  plot("plot-failures", [[f, "#a00"]], f.length ? f[f.length - 1] : ""); }
async function refresh() {
  try {
    const r = await fetch("api/status", {headers});
    if (!r.ok) throw new Error("status " + r.status);
    const s = await r.json();
    set("env", s.env); set("capacity", s.capacity);
    set("sessions-count", s.active_sessions); set("step-rate", s.step_rate.toFixed(1));
    set("steps-total", s.steps_total);
    set("backend", s.backend + " x" + s.num_workers);
    const fails = Object.entries(s.failures);
    set("failures-total", fails.reduce((a, [, n]) => a + n, 0));
    fill("failures", (s.failure_classes || []).map(f => ({
      cls: "failure-row" + (f.count ? " fail" : ""), cells: [f.failure,
      f.retryable ? "yes" : "no", f.count, (100 * f.share).toFixed(1) + "%",
      f.per_1k_steps == null ? "-" : f.per_1k_steps.toFixed(2), f.last_error || ""]})));
    const ms = v => v == null ? "-" : v.toFixed(1);
    const lq = s.latency_quantiles || {};
    fill("latency-quantiles", [["since the last poll", lq.recent],
      ["since the start", lq.since_start]].filter(([, q]) => q).map(([name, q]) => ({
      cls: "latency-row", cells: [name, q.steps, ms(q.p50_ms), ms(q.p90_ms), ms(q.p99_ms),
      ms(q["p99.9_ms"])]})));
    fill("workers", (s.workers || []).map((w, i) => ({cls: "worker-row",
      cells: [i, w.sessions, w.load.toFixed(4)]})));
    keep("rate", s.step_rate); keep("sessions", s.active_sessions);
    keep("p50", s.latency_p50_ms); keep("p99", s.latency_p99_ms);
    keep("failures", fails.reduce((a, [, n]) => a + n, 0)); draw();
    fill("recent-failures", s.recent_failures.slice().reverse().map(f => ({cls: "fail",
      cells: [new Date(f.time * 1000).toLocaleTimeString(), f.failure, f.error]})));
    fill("sessions", s.sessions.map(x => ({cls: "session-row", cells: [x.id.slice(0, 8),
      x.kind, x.slot, (x.episode_id || "").slice(0, 16), x.seed ?? "", x.step_count,
      x.done, x.failures, x.idle_s]})));
    set("error", "");
  } catch (e) { set("error", "cannot reach the server: " + e); }
}
refresh(); setInterval(refresh, 1000);
</script></body></html>
"""
