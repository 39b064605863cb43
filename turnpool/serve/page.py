"""The page a person opens at ``/`` of ``turnpool serve``: what the server runs, its live
sessions, step rate and failures. Static HTML that polls ``/api/status`` once a second, so the
server renders nothing per viewer and the page needs no build step or outside asset."""

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
<h2>Failures by class</h2>
<table><thead><tr><th>class</th><th>count</th></tr></thead><tbody id="failures"></tbody></table>
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
    fill("failures", fails.map(([k, n]) => ({cells: [k, n]})));
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
