// turnpool view: the page over /api/*. Every text from the file is set as textContent
// (never as HTML): replies are model output.
"use strict";
const $ = (id) => document.getElementById(id);
let divergence = null;  // the replay's first divergence, once asked for

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "text") e.textContent = v; else if (k === "cls") e.className = v;
    else e.setAttribute(k, v);
  }
  for (const k of kids) if (k != null) e.appendChild(k);
  return e;
}
function fmt(x) { return x == null ? "-" : (typeof x === "number" ? +x.toFixed(3) : String(x)); }
function ok(x) { return x == null ? "?" : (x ? "yes" : "no"); }
function link(text, hash) { return el("a", {href: hash, text: text}); }
async function api(path, opts) {
  const r = await fetch("api/" + path, opts);
  if (!r.ok) throw new Error(path + ": HTTP " + r.status);
  return r.json();
}
function fail(e) { $("error").textContent = String(e); }

async function start() {
  const s = await api("summary");
  $("kind").textContent = s.kind;
  $("path").textContent = s.path;
  $("counts").textContent = s.episodes + " episodes" +
    (s.has_success ? ", success " + (100 * s.success).toFixed(1) + "%" : "");
  const addOptions = (select, values) => { for (const v of values)
    select.appendChild(el("option", {value: v, text: v})); };
  addOptions($("filter-env"), [...new Set([...Object.keys(s.envs), ...Object.keys(s.tags)])]);
  addOptions($("filter-group"), s.groups);
  for (const id of ["filter-env", "filter-group", "filter-success"])
    $(id).addEventListener("change", () => loadList().catch(fail));
  if (s.trees.length) {
    $("trees").appendChild(el("span", {text: "trees: "}));
    for (const g of s.trees) $("trees").appendChild(link(g, "#tree/" + encodeURIComponent(g)));
  }
  if (s.replayable) {
    $("replay-button").hidden = false;
    $("replay-button").addEventListener("click", () => replay().catch(fail));
  }
  await loadList();
  window.addEventListener("hashchange", () => route().catch(fail));
  await route();
}

async function loadList() {
  const q = new URLSearchParams({env: $("filter-env").value, group: $("filter-group").value,
                                 success: $("filter-success").value});
  const d = await api("episodes?" + q);
  $("shown").textContent = d.episodes.length + " of " + d.total + " shown";
  const body = $("episodes").querySelector("tbody");
  body.replaceChildren();
  for (const e of d.episodes) {
    const row = el("tr", {cls: "episode-row" + (e.success ? " success" : ""),
                          "data-id": e.id});
    const cells = [link(String(e.id), "#episode/" + e.id), el("span", {text: e.env_type || e.tag}),
      link(e.group, "#group/" + encodeURIComponent(e.group)), el("span", {text: fmt(e.seed)}),
      el("span", {text: ok(e.success) + (e.chosen ? " ★" : "")}), el("span", {text: fmt(e.score)}),
      el("span", {text: fmt(e.advantage)}), el("span", {text: String(e.turns)})];
    for (const c of cells) row.appendChild(el("td", {}, c));
    body.appendChild(row);
  }
  markSelected();
}

function markSelected() {  // the open episode's row in the list
  const m = location.hash.match(/^#episode\/(\d+)$/);
  for (const row of document.querySelectorAll("tr.episode-row"))
    row.classList.toggle("selected", m != null && row.dataset.id === m[1]);
}

async function route() {
  const [view, ...rest] = location.hash.slice(1).split("/");
  const arg = decodeURIComponent(rest.join("/"));
  markSelected();
  if (view === "episode") await showEpisode(arg);
  else if (view === "group") await showGroup(arg);
  else if (view === "tree") await showTree(arg);
}

function boardImg(id, k, alt) {
  const img = el("img", {cls: "board", src: "api/board/" + id + "/" + k + ".png", alt: alt});
  img.addEventListener("error", () => img.remove());
  return img;
}

function kv(pairs) {
  const dl = el("dl", {cls: "kv"});
  for (const [k, v] of pairs) { dl.appendChild(el("dt", {text: k}));
    dl.appendChild(el("dd", {cls: "v-" + k.replace(/\W+/g, "-"), text: fmt(v)})); }
  return dl;
}

async function showEpisode(id) {
  const d = await api("episodes/" + id);
  const out = el("div", {id: "episode-view"});
  out.appendChild(el("h2", {text: "Episode " + d.id}));
  out.appendChild(kv([["env", d.env_type], ["tag", d.tag], ["group", d.group], ["seed", d.seed],
    ["success", ok(d.success)], ["reward", d.score], ["advantage", d.advantage],
    ["end", d.end_reason], ["chosen", d.chosen == null ? null : ok(d.chosen)],
    ["error", d.error]]));
  out.appendChild(el("p", {}, link("group " + d.group + " side by side",
                                   "#group/" + encodeURIComponent(d.group))));
  const diverged = divergence && divergence.episode === d.id ? divergence : null;
  if (diverged) out.appendChild(divergenceNote(diverged));
  d.steps.forEach((s, k) => out.appendChild(turnCard(d, s, k, diverged)));
  const last = el("div", {cls: "turn final"}, el("h3", {text: "after the last turn"}));
  if (d.boards) last.appendChild(boardImg(d.id, d.steps.length, "final board"));
  last.appendChild(el("pre", {cls: "obs", text: d.final_obs}));
  out.appendChild(last);
  $("detail").replaceChildren(out);
}

function turnCard(d, s, k, diverged) {
  const bad = diverged && diverged.turn === s.turn;
  const card = el("div", {cls: "turn" + (bad ? " divergent" : ""), "data-turn": s.turn},
    el("h3", {text: "turn " + s.turn + (s.node_id ? "  (" + s.node_id + ")" : "")}));
  const obs = el("div", {cls: "obs-box"});
  if (d.boards) obs.appendChild(boardImg(d.id, k, "board before turn " + s.turn));
  obs.appendChild(el("pre", {cls: "obs", text: s.obs}));
  card.appendChild(obs);
  if (s.reply != null) card.appendChild(el("pre", {cls: "reply", text: s.reply}));
  card.appendChild(kv([["parsed", s.actions.join(", ")], ["executed", s.executed.join(", ")],
    ["valid", s.valid == null ? null : ok(s.valid)], ["reward", s.reward],
    ["done", ok(s.done)], ["error", s.error]]));
  const info = el("details", {}, el("summary", {text: "info"}),
                  el("pre", {cls: "info", text: JSON.stringify(s.info, null, 1)}));
  card.appendChild(info);
  return card;
}

async function showGroup(group) {
  const g = await api("groups/" + encodeURIComponent(group));
  const out = el("div", {id: "group-view"});
  out.appendChild(el("h2", {text: "Group " + g.group + " (mean reward " + fmt(g.mean_score) + ")"}));
  const grid = el("div", {cls: "members"});
  for (const m of g.members) {
    const col = el("div", {cls: "member" + (m.success ? " success" : "") + (m.chosen ? " chosen" : "")},
      el("h3", {}, link("episode " + m.id, "#episode/" + m.id)),
      kv([["env", m.env_id], ["success", ok(m.success)], ["reward", m.score],
          ["advantage", m.advantage], ["turns", m.turns]]));
    const t = el("table", {cls: "rewards"}, el("tr", {}, el("th", {text: "turn"}),
      el("th", {text: "actions"}), el("th", {text: "r"})));
    m.rewards.forEach((r, k) => t.appendChild(el("tr", {}, el("td", {text: String(k)}),
      el("td", {text: (m.actions[k] || []).join(" ")}), el("td", {text: fmt(r)}))));
    col.appendChild(t);
    if (m.boards) col.appendChild(boardImg(m.id, m.turns, "final board"));
    else col.appendChild(el("pre", {cls: "obs", text: m.final_obs}));
    grid.appendChild(col);
  }
  out.appendChild(grid);
  $("detail").replaceChildren(out);
}

async function showTree(group) {
  const t = await api("trees/" + encodeURIComponent(group));
  const out = el("div", {id: "tree-view"});
  out.appendChild(el("h2", {text: "Tree " + t.group}));
  out.appendChild(el("p", {cls: "hint", text: "Columns are turns; the chosen path is green " +
    "and thick; kept nodes have a dark border. Click a node for its path's turns."}));
  const byTurn = new Map();
  for (const n of t.nodes) { if (!byTurn.has(n.turn)) byTurn.set(n.turn, []);
    byTurn.get(n.turn).push(n); }
  const W = 210, H = 44, turns = [...byTurn.keys()].sort((a, b) => a - b);
  const rows = Math.max(...[...byTurn.values()].map(v => v.length));
  const pos = new Map([["root", [10, (rows * H) / 2]]]);
  turns.forEach((turn, c) => byTurn.get(turn).forEach((n, r) =>
    pos.set(n.node_id, [50 + c * W, 10 + r * H + H / 2])));
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("width", 60 + turns.length * W);
  svg.setAttribute("height", 20 + rows * H);
  svg.id = "tree-svg";
  const add = (tag, attrs, text) => { const e = document.createElementNS(ns, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (text != null) e.textContent = text; svg.appendChild(e); return e; };
  for (const n of t.nodes) {
    const from = n.parent_id != null && pos.has(n.parent_id) ? n.parent_id : "root";
    const [x1, y1] = pos.get(from);
    const [x2, y2] = pos.get(n.node_id);
    // from the parent box's right side (the root is a dot) to the child box's left side
    add("line", {x1: from === "root" ? x1 + 6 : x1 + W - 30, y1, x2: x2 - 4, y2,
                 class: "edge" + (n.chosen ? " chosen" : "")});
  }
  add("circle", {cx: 10, cy: pos.get("root")[1], r: 6, class: "root"});
  for (const n of t.nodes) {
    const [x, y] = pos.get(n.node_id);
    const g = add("g", {class: "tree-node" + (n.chosen ? " chosen" : "") + (n.kept ? " kept" : ""),
                        "data-node": n.node_id});
    const rect = document.createElementNS(ns, "rect");
    for (const [k, v] of Object.entries({x: x - 4, y: y - 15, width: W - 26, height: 30, rx: 4}))
      rect.setAttribute(k, v);
    const label = document.createElementNS(ns, "text");
    label.setAttribute("x", x + 2); label.setAttribute("y", y + 4);
    label.textContent = "env " + n.env_id + ": " + (n.actions.join(" ") || "-") +
      "  r=" + fmt(n.reward) + (n.score != null ? " s=" + fmt(n.score) : "");
    const title = document.createElementNS(ns, "title");
    title.textContent = n.node_id + (n.chosen ? " (chosen)" : "") + (n.kept ? " (kept)" : "");
    g.append(rect, label, title);
    if (n.episode != null) g.addEventListener("click", () => { location.hash = "#episode/" + n.episode; });
  }
  out.appendChild(el("div", {cls: "tree-scroll"}, svg));
  const chosen = t.nodes.filter(n => n.chosen).sort((a, b) => a.turn - b.turn);
  out.appendChild(el("p", {id: "chosen-path", text: chosen.length ? "chosen path: " +
    chosen.map(n => "t" + n.turn + " " + (n.actions.join(" ") || "-")).join(" → ") :
    "no chosen path (shared_prefix trees choose none)"}));
  $("detail").replaceChildren(out);
}

function divergenceNote(f) {
  return el("div", {cls: "divergence"}, el("b", {text: "first divergence: "}),
    el("span", {text: (f.turn == null ? "reset" : "turn " + f.turn) + ", " + f.field +
      ": recorded " + JSON.stringify(f.recorded) + ", replayed " + JSON.stringify(f.replayed)}));
}

async function replay() {
  $("replay").textContent = "replaying…";
  const r = await api("replay", {method: "POST"});
  const box = $("replay");
  box.replaceChildren();
  if (r.error) { box.appendChild(el("span", {cls: "bad", text: "replay failed: " + r.error})); return; }
  const counts = r.transitions + " transitions compared, " + r.not_compared + " not compared, " +
    r.divergent_episodes + " divergent episode(s)";
  if (!r.first) { box.appendChild(el("span", {cls: "good", text: "identical: " + counts})); return; }
  divergence = r.first;
  box.append(el("span", {cls: "bad", text: counts + "; "}),
    link("first divergence in episode " + r.first.episode, "#episode/" + r.first.episode),
    el("div", {cls: "describe", text: r.first.describe}));
  const target = "#episode/" + r.first.episode;
  if (location.hash === target) await route();  // else the hashchange routes, once
  else location.hash = target;
}

start().catch(fail);
