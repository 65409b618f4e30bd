// The HexGen-Flow status page: polls GET /ui/api/state with the operator's key and redraws in place.
// Plain DOM and inline SVG; every value from the server is set as text (kinds and ids are client-given).
"use strict";

const POLL_MS = 1500;
const KEY = "hexflow.adminKey";
const SVG = "http://www.w3.org/2000/svg";
let timer = null;
let polls = 0;

const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c);
  return node;
}

function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = text;
  return node;
}

const num = (v, digits = 2) => (v === null || v === undefined ? "–" : Number(v).toFixed(digits));
const pct = (v) => (v === null || v === undefined ? "–" : (100 * v).toFixed(1) + " %");
const ago = (s) => (s < 90 ? Math.round(s) + " s ago" : s < 5400 ? Math.round(s / 60) + " min ago" : Math.round(s / 3600) + " h ago");

function bar(frac, hot) {
  const f = Math.max(0, Math.min(1, frac || 0));
  const fill = el("i", {});
  fill.style.width = `${(100 * f).toFixed(1)}%`; // CSSOM, not a style attribute: the page's CSP allows no inline style
  return el("span", { class: hot ? "bar hot" : "bar" }, fill);
}

// ---------------------------------------------------------------- sign-in and polling

function showLogin(message) {
  clearTimeout(timer);
  $("main").hidden = true;
  $("summary").hidden = true;
  $("login").hidden = false;
  $("login-error").textContent = message || "";
  $("key").focus();
}

async function errorMessage(resp) {
  try {
    const body = await resp.json();
    if (body && body.error && body.error.message) return body.error.message;
  } catch (_) { /* not JSON */ }
  return `HTTP ${resp.status}`;
}

async function poll() {
  const key = sessionStorage.getItem(KEY);
  if (!key) return showLogin("");
  let resp;
  try {
    resp = await fetch("/ui/api/state", { headers: { Authorization: "Bearer " + key }, cache: "no-store" });
  } catch (exc) {
    $("poll-error").textContent = "the gateway does not answer (" + exc + "); retrying";
    $("dot").className = "";
    timer = setTimeout(poll, POLL_MS);
    return;
  }
  if (resp.status === 401 || resp.status === 404) {
    sessionStorage.removeItem(KEY);
    return showLogin(await errorMessage(resp));
  }
  if (!resp.ok) {
    $("poll-error").textContent = await errorMessage(resp);
    timer = setTimeout(poll, POLL_MS);
    return;
  }
  const state = await resp.json();
  $("poll-error").textContent = "";
  $("login").hidden = true;
  $("main").hidden = false;
  $("summary").hidden = false;
  render(state);
  polls += 1;
  $("updated").textContent = new Date().toLocaleTimeString();
  $("updated").dataset.polls = String(polls);
  $("dot").className = polls % 2 ? "on" : "";
  timer = setTimeout(poll, POLL_MS);
}

// ---------------------------------------------------------------- rendering

function render(s) {
  $("ready").textContent = s.draining ? "draining" : s.ready ? "ready" : "not ready";
  $("ready").className = "badge " + (s.ready ? "ready" : "notready");
  $("policy").textContent = s.policy;
  $("alpha-head").textContent = s.uses_alpha ? num(s.alpha) : "n/a";
  $("active").textContent = s.active_workflows;
  $("parked").textContent = s.parked_calls;
  $("window").textContent = s.window_s >= 120 ? Math.round(s.window_s / 60) + " min" : s.window_s + " s";
  renderWorkers(s.workers);
  renderTenants(s.tenants, s.outcomes);
  renderTuning(s);
  renderSlowest(s.slowest);
}

function renderWorkers(workers) {
  const body = $("workers").tBodies[0];
  const rows = workers.map((w) => {
    const kv = w.kv_cache_usage;
    const ratio = w.latency_ratio;
    const ratioCell = el("td", { text: ratio === null ? "–" : num(ratio) + "×" });
    const kinds = Object.entries(w.estimate_ratios || {});
    if (kinds.length) ratioCell.title = "estimator: " + kinds.map(([k, r]) => `${k} ${num(r)}`).join(", ");
    return el(
      "tr",
      { "data-worker": w.name },
      el("td", { text: w.name }),
      el("td", { text: w.gpu }),
      el("td", { text: w.model }),
      el("td", {}, el("span", { class: "badge " + w.state, text: w.state })),
      el("td", { class: "queued", text: String(w.queued) }),
      el("td", { class: "inflight" }, bar(w.inflight / Math.max(w.capacity, 1), false), `${w.inflight} / ${w.capacity}`),
      el("td", { class: "kv" }, kv === null ? "–" : bar(kv, kv > 0.9), kv === null ? "" : pct(kv)),
      ratioCell,
      el("td", { text: String(w.completed) }),
      el("td", { text: String(w.failed) }),
    );
  });
  body.replaceChildren(...rows);
  if (!rows.length) body.append(el("tr", {}, el("td", { colspan: "10", class: "empty", text: "no workers" })));
}

function outcomeBar(outcomes, order) {
  const total = order.reduce((a, o) => a + outcomes[o], 0);
  const root = svg("svg", { width: 280, height: 12, role: "img" });
  root.append(svg("title", {}, order.map((o) => `${o}: ${outcomes[o]}`).join(", ")));
  if (!total) {
    root.append(svg("rect", { x: 0, y: 0, width: 280, height: 12, rx: 3, fill: "#eef0f3" }));
    return root;
  }
  let x = 0;
  const colours = { met: "#1a7f37", late: "#f79009", no_valid_answer: "#9e77ed", failed: "#c0262d", rejected: "#667085", cancelled: "#d0d5dd" };
  for (const o of order) {
    const w = (280 * outcomes[o]) / total;
    if (w > 0) root.append(svg("rect", { x, y: 0, width: w, height: 12, fill: colours[o] || "#999" }));
    x += w;
  }
  return root;
}

function sparkline(series) {
  const W = 280, H = 40;
  const root = svg("svg", { width: W, height: H, class: "spark", role: "img" });
  root.append(svg("title", {}, "goodput per second, oldest to newest"));
  const max = Math.max(...series, 1e-9);
  const step = W / Math.max(series.length - 1, 1);
  const pts = series.map((v, i) => `${(i * step).toFixed(1)},${(H - 2 - ((H - 6) * v) / max).toFixed(1)}`);
  root.append(svg("polyline", { points: `0,${H} ${pts.join(" ")} ${W},${H}`, fill: "#dcfae6", stroke: "none" }));
  root.append(svg("polyline", { points: pts.join(" "), fill: "none", stroke: "#1a7f37", "stroke-width": 1.5 }));
  return root;
}

function renderTenants(tenants, order) {
  const cards = Object.entries(tenants).map(([name, t]) => {
    const legend = el("div", { class: "outcomes" });
    for (const o of order) legend.append(el("span", {}, el("i", { class: "o-" + o }), `${o.replaceAll("_", " ")} ${t.outcomes[o]}`));
    return el(
      "div",
      { class: "tenant", "data-tenant": name },
      el("h3", { text: name }),
      el(
        "div",
        { class: "nums" },
        el("div", {}, el("span", { text: "SLO attainment" }), el("b", { class: "attainment", text: pct(t.attainment) })),
        el("div", {}, el("span", { text: "goodput" }), el("b", { class: "goodput", text: num(t.goodput_per_s, 3) + " /s" })),
        el("div", {}, el("span", { text: "finished" }), el("b", { class: "finished", text: String(t.finished) })),
      ),
      sparkline(t.goodput_series),
      outcomeBar(t.outcomes, order),
      legend,
    );
  });
  $("tenants").replaceChildren(...cards);
  if (!cards.length) $("tenants").append(el("p", { class: "empty", text: "no tenants" }));
}

function renderTuning(s) {
  $("alpha").textContent = s.uses_alpha ? num(s.alpha) : "n/a";
  const t = s.tuning;
  $("tuning-note").textContent = !s.uses_alpha
    ? `(policy ${s.policy} does not use alpha)`
    : t.enabled ? `(${t.runs} tuning runs)` : "(background tuning is off)";
  const rows = t.history.map((r) =>
    el(
      "tr",
      {},
      el("td", { text: ago(r.age_s) }),
      el("td", { text: r.result }),
      el("td", { text: r.current === undefined ? num(r.alpha) : `${num(r.current)} → ${num(r.chosen)}` }),
      el("td", { text: r.current_p95_s === undefined ? "–" : `${num(r.current_p95_s)} → ${num(r.chosen_p95_s)}` }),
      el("td", { text: r.window_workflows === undefined ? "–" : `${r.window_workflows} wf` }),
      el("td", { text: r.reason || r.error || "" }),
    ),
  );
  const body = $("tuning").tBodies[0];
  body.replaceChildren(...rows);
  if (!rows.length) body.append(el("tr", {}, el("td", { colspan: "6", class: "empty", text: "no tuning run yet" })));
}

function timeline(wf) {
  const calls = wf.calls;
  const LABEL = 190, W = 900, ROW = 16, TOP = 18;
  const H = TOP + ROW * Math.max(calls.length, 1) + 6;
  // The axis covers the workflow; the deadline too unless it lies far beyond (then it is named at the edge).
  const end = Math.max(wf.latency_s, ...calls.map((c) => c.done_s), 1e-6);
  const deadlineShown = wf.deadline_s <= 1.5 * end;
  const span = deadlineShown ? Math.max(end, wf.deadline_s) : 1.1 * end;
  const x = (t) => LABEL + ((W - LABEL - 60) * Math.min(Math.max(t, 0), span)) / span;
  const root = svg("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, class: "timeline", role: "img" });
  for (let k = 0; k <= 4; k++) {
    const t = (span * k) / 4;
    root.append(svg("line", { x1: x(t), x2: x(t), y1: TOP - 4, y2: H, stroke: "#eef0f3" }));
    root.append(svg("text", { x: x(t), y: 11, "text-anchor": "middle", class: "muted" }, num(t, t < 10 ? 2 : 1) + " s"));
  }
  calls.forEach((c, i) => {
    const y = TOP + i * ROW;
    const lost = i === wf.lost_at;
    const label = svg("text", { x: 0, y: y + 11, class: lost ? "" : "muted" }, `${c.kind} @ ${c.worker || "—"}`);
    if (lost) label.setAttribute("fill", "#c0262d");
    root.append(label);
    const sent = c.sent_s === null ? c.done_s : c.sent_s;
    const g = svg("g", {});
    g.append(svg("title", {}, `${c.kind} on ${c.worker || "no worker"}: waited ${num(c.waited_s, 3)} s, ran ${num(c.ran_s, 3)} s, ` +
      `budget ${num(c.budget_s, 3)} s${c.over_budget ? " (over budget)" : ""}, ${c.attempts} attempt(s)${c.ok ? "" : ", failed"}`));
    g.append(svg("rect", { x: x(c.ready_s), y: y + 3, width: Math.max(x(sent) - x(c.ready_s), 1), height: 10, fill: "#b8c4d6" }));
    g.append(svg("rect", { x: x(sent), y: y + 3, width: Math.max(x(c.done_s) - x(sent), 1), height: 10,
      fill: c.ok ? (c.over_budget ? "#c0262d" : "#2f6fdb") : "#7a271a" }));
    if (c.budget_s > 0 && c.ready_s + c.budget_s <= span) {
      const bx = x(c.ready_s + c.budget_s);
      g.append(svg("line", { x1: bx, x2: bx, y1: y + 1, y2: y + 15, stroke: "#6941c6", "stroke-width": 2 }));
    }
    root.append(g);
  });
  if (deadlineShown) {
    const dx = x(wf.deadline_s);
    root.append(svg("line", { x1: dx, x2: dx, y1: TOP - 6, y2: H, stroke: "#c0262d", "stroke-width": 2, "stroke-dasharray": "4 3" }));
  } else {
    root.append(svg("text", { x: W - 4, y: TOP + 10, "text-anchor": "end", fill: "#c0262d" }, `deadline ${num(wf.deadline_s, 1)} s →`));
  }
  return root;
}

function renderSlowest(slowest) {
  const items = slowest.map((wf) => {
    const head = el(
      "div",
      { class: "wf-head" },
      el("code", { text: wf.id }),
      el("span", { text: `${wf.route} · ${wf.tenant}` }),
      el("span", { class: "badge " + (wf.outcome === "met" ? "up" : "down"), text: wf.outcome.replaceAll("_", " ") }),
      el("span", { text: `${num(wf.latency_s, 3)} s of ${num(wf.deadline_s, 3)} s deadline` }),
      el("span", { class: "empty", text: ago(wf.age_s) }),
    );
    if (wf.lost_at !== null) {
      const c = wf.calls[wf.lost_at];
      head.append(el("span", { class: "wf-lost", text: `deadline lost at call ${wf.lost_at + 1} (${c.kind} on ${c.worker || "no worker"})` }));
    } else if (wf.latency_s > wf.deadline_s) {
      head.append(el("span", { class: "wf-lost", text: "deadline lost after the last call (gateway or database work)" }));
    }
    const node = el("div", { class: "wf", "data-workflow": wf.id }, head, timeline(wf));
    if (wf.more_calls) node.append(el("p", { class: "empty", text: `… and ${wf.more_calls} more calls` }));
    return node;
  });
  $("slowest").replaceChildren(...items);
  if (!items.length) $("slowest").append(el("p", { class: "empty", text: "no workflow finished in the window" }));
}

// ---------------------------------------------------------------- start

document.addEventListener("DOMContentLoaded", () => {
  $("login-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const key = $("key").value.trim();
    if (!key) return;
    sessionStorage.setItem(KEY, key);
    $("key").value = "";
    clearTimeout(timer);
    poll();
  });
  $("logout").addEventListener("click", () => {
    sessionStorage.removeItem(KEY);
    showLogin("signed out");
  });
  poll();
});
