// The HexGen-Flow status page: polls GET /ui/api/state with the operator's key and redraws in place.
// Plain DOM and inline SVG; every value from the server is set as text (kinds and ids are client-given).
// The pure helpers (axis ticks, a call's bar segments) are on window.hexflowUi for the browser test.
"use strict";

const POLL_MS = 1500;
const FETCH_TIMEOUT_MS = 5000; // a poll that hangs this long counts as no answer
const STALE_MS = 3 * POLL_MS + 1000; // no fresh state for this long: the figures shown are stale
const KEY = "hexflow.adminKey";
const SVG = "http://www.w3.org/2000/svg";
let timer = null;
let polls = 0;
let lastOk = null; // Date.now() of the last state drawn (null: none yet)
let failure = ""; // why the last poll got no state ("" when it did)

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
const clock = (ms) => new Date(ms).toLocaleTimeString();
const secs = (s) => (s < 90 ? Math.round(s) + " s" : s < 5400 ? Math.round(s / 60) + " min" : (s / 3600).toFixed(1) + " h");

function bar(frac, hot) {
  const f = Math.max(0, Math.min(1, frac || 0));
  const fill = el("i", {});
  fill.style.width = `${(100 * f).toFixed(1)}%`; // CSSOM, not a style attribute: the page's CSP allows no inline style
  return el("span", { class: hot ? "bar hot" : "bar" }, fill);
}

// ---------------------------------------------------------------- pure helpers

// The step of an axis over [0, span] with about `target` intervals: 1, 2 or 5 times a power of ten.
function niceStep(span, target = 5) {
  if (!(span > 0) || !Number.isFinite(span)) return 1;
  const raw = span / Math.max(target, 1);
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const f = raw / mag;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
}

// Decimals that print every multiple of `step` exactly (0.05 -> 2, 0.1 -> 1, 5 -> 0).
function stepDigits(step) {
  return Math.max(0, -Math.floor(Math.log10(step) + 1e-9));
}

// Axis ticks 0, step, 2 step, ... up to the first one at or past `max` (the axis ends on a round number).
function niceTicks(max, target = 5) {
  const step = niceStep(max, target);
  const digits = stepDigits(step);
  const n = Math.max(1, Math.ceil(max / step - 1e-9));
  const ticks = [];
  for (let k = 0; k <= n; k++) ticks.push(Number((k * step).toFixed(digits)));
  return ticks;
}

// A tick's label, with the decimals of its axis's step.
function tickLabel(value, ticks) {
  const step = ticks.length > 1 ? ticks[1] - ticks[0] : 1;
  return value.toFixed(stepDigits(step));
}

// The pieces a call's bar is drawn in: its wait (queued in the gateway) and its run (on the worker), each cut
// where its stage budget ended (ready_s + budget_s: the share of the time then left that the scheduler gave
// its stage) and where the workflow's deadline passed. Level "ok": within its stage budget; "over": past it
// (its stage took time from the later ones) but before the deadline; "late": past the deadline. A call
// within its budget is one "ok" piece per phase, never red.
function callSegments(c, deadline) {
  const sent = c.sent_s === null ? c.done_s : c.sent_s;
  const budgetEnd = c.ready_s + c.budget_s;
  const level = (t) => (t > deadline ? "late" : t > budgetEnd ? "over" : "ok");
  const out = [];
  for (const [phase, from, to] of [["wait", c.ready_s, sent], ["run", sent, c.done_s]]) {
    if (!(to > from)) {
      if (phase === "run" && c.sent_s !== null) out.push({ from, to: from, phase, level: level(from) }); // 1 px wide
      continue;
    }
    const cuts = [budgetEnd, deadline].filter((t) => t > from && t < to).sort((a, b) => a - b);
    const points = [from, ...cuts, to];
    for (let i = 0; i + 1 < points.length; i++) {
      out.push({ from: points[i], to: points[i + 1], phase, level: level((points[i] + points[i + 1]) / 2) });
    }
  }
  return out;
}

// `text` cut to about `px` pixels of 11 px text (the full text goes in a tooltip).
function fitText(text, px) {
  const chars = Math.max(4, Math.floor(px / 6.4));
  return text.length <= chars ? text : text.slice(0, chars - 1) + "…";
}

window.hexflowUi = { niceStep, niceTicks, tickLabel, callSegments, fitText };

// ---------------------------------------------------------------- sign-in and polling

function showLogin(message) {
  clearTimeout(timer);
  lastOk = null;
  failure = "";
  showStale();
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

// The banner over stale figures: shown while the last poll failed, or while none has answered for STALE_MS
// (a poll still hanging); the figures under it are greyed out and say when they were fresh.
function showStale() {
  const signedIn = !$("main").hidden;
  const silent = lastOk !== null && Date.now() - lastOk > STALE_MS;
  const stale = signedIn && (failure !== "" || silent);
  $("stale").hidden = !stale;
  $("main").classList.toggle("stale", stale);
  $("summary").classList.toggle("stale", stale);
  if (!stale) return;
  const why = failure || `no answer for ${secs((Date.now() - lastOk) / 1000)}`;
  $("stale-why").textContent = why;
  $("stale-since").textContent = lastOk === null
    ? "Nothing below has been loaded yet."
    : `The figures below are from ${clock(lastOk)} (${secs((Date.now() - lastOk) / 1000)} ago) and are not current.`;
}

async function poll() {
  const key = sessionStorage.getItem(KEY);
  if (!key) return showLogin("");
  let resp;
  const abort = new AbortController();
  const hang = setTimeout(() => abort.abort(), FETCH_TIMEOUT_MS);
  try {
    resp = await fetch("/ui/api/state", {
      headers: { Authorization: "Bearer " + key },
      cache: "no-store",
      signal: abort.signal,
    });
  } catch (exc) {
    failure = abort.signal.aborted
      ? `the gateway did not answer within ${FETCH_TIMEOUT_MS / 1000} s`
      : "the gateway does not answer (" + (exc && exc.message ? exc.message : exc) + ")";
    $("dot").className = "";
    showStale();
    timer = setTimeout(poll, POLL_MS);
    return;
  } finally {
    clearTimeout(hang);
  }
  if (resp.status === 401 || resp.status === 404) {
    sessionStorage.removeItem(KEY);
    return showLogin(await errorMessage(resp));
  }
  if (!resp.ok) {
    failure = `the gateway answers HTTP ${resp.status}: ${await errorMessage(resp)}`;
    showStale();
    timer = setTimeout(poll, POLL_MS);
    return;
  }
  const state = await resp.json();
  $("login").hidden = true;
  $("main").hidden = false;
  $("summary").hidden = false;
  render(state);
  failure = "";
  lastOk = Date.now();
  showStale();
  polls += 1;
  $("updated").textContent = clock(lastOk);
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
  renderBurst(s.burst);
  $("window").textContent = s.window_s >= 120 ? Math.round(s.window_s / 60) + " min" : s.window_s + " s";
  renderWorkers(s.workers);
  renderTenants(s.tenants, s.outcomes);
  renderTuning(s);
  renderSlowest(s.slowest);
}

// Why a worker is ejected and until when (its back-off's end on this browser's clock; a probe call decides).
function ejection(w) {
  if (!w.ejected) return null;
  const left = w.ejected_for_s;
  const until = left === null || left <= 0
    ? "back-off over: back when a probe call answers"
    : `until ${clock(Date.now() + 1000 * left)} (${secs(left)}), then a probe call`;
  const times = w.ejections > 1 ? ` · ejection ${w.ejections} in a row` : "";
  return el(
    "div",
    { class: "why" },
    el("span", { class: "why-reason", text: w.ejected_reason || "an outlier" }),
    el("span", { class: "why-until", text: until + times }),
  );
}

function renderWorkers(workers) {
  const body = $("workers").tBodies[0];
  const rows = workers.map((w) => {
    const kv = w.kv_cache_usage;
    const ratio = w.latency_ratio;
    const ratioCell = el("td", { text: ratio === null ? "–" : num(ratio) + "×" });
    const kinds = Object.entries(w.estimate_ratios || {});
    if (kinds.length) ratioCell.title = "estimator: " + kinds.map(([k, r]) => `${k} ${num(r)}`).join(", ");
    const state = el("td", { class: "state" }, el("span", { class: "badge " + w.state, text: w.state }));
    const why = ejection(w);
    if (why) state.append(why);
    return el(
      "tr",
      { "data-worker": w.name },
      el("td", { text: w.name }),
      el("td", { text: w.gpu }),
      el("td", { class: "model", text: w.model }),
      state,
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
  const W = 280;
  const total = order.reduce((a, o) => a + outcomes[o], 0);
  const root = svg("svg", { width: W, height: 12, viewBox: `0 0 ${W} 12`, class: "outcome-bar", role: "img" });
  root.append(svg("title", {}, order.map((o) => `${o}: ${outcomes[o]}`).join(", ")));
  if (!total) {
    root.append(svg("rect", { x: 0, y: 0, width: W, height: 12, rx: 3, class: "o-none" }));
    return root;
  }
  let x = 0;
  for (const o of order) {
    const w = (W * outcomes[o]) / total;
    if (w > 0) root.append(svg("rect", { x, y: 0, width: w, height: 12, class: "o-" + o }));
    x += w;
  }
  return root;
}

// Goodput per second over the window, on a 0 .. round-number scale (its top named at the left).
function sparkline(series) {
  const W = 280, H = 44, TOP = 12;
  const root = svg("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, class: "spark", role: "img" });
  root.append(svg("title", {}, "goodput per second, oldest to newest"));
  const ticks = niceTicks(Math.max(...series, 0), 2);
  const top = ticks[ticks.length - 1];
  const y = (v) => H - 1 - ((H - 1 - TOP) * v) / top;
  for (const t of ticks) {
    root.append(svg("line", { x1: 0, x2: W, y1: y(t), y2: y(t), class: "grid" }));
  }
  root.append(svg("text", { x: 0, y: 9, class: "muted tick", "data-tick": top }, `${tickLabel(top, ticks)} /s`));
  const step = W / Math.max(series.length - 1, 1);
  const pts = series.map((v, i) => `${(i * step).toFixed(1)},${y(v).toFixed(1)}`);
  root.append(svg("polyline", { points: `0,${H} ${pts.join(" ")} ${W},${H}`, class: "spark-area" }));
  root.append(svg("polyline", { points: pts.join(" "), class: "spark-line" }));
  return root;
}

function share(label, cls, value, of, count, note) {
  return el(
    "div",
    { class: "share", title: note },
    el("span", { text: label }),
    el("b", { class: cls, text: pct(value) }),
    el("small", {}, "of ", el("b", { class: count.cls, text: String(count.n) }), ` ${of}`),
  );
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
        share("SLO attainment", "attainment", t.attainment, "finished", { cls: "finished", n: t.finished },
          "met over the workflows that ran to an end (refused, shed and cancelled ones are not counted)"),
        share("answered in time", "in-time", t.answered_in_time, "arrivals", { cls: "arrivals", n: t.arrivals },
          "met over every workflow that arrived and ended: refused (429), shed and cancelled ones included"),
        el("div", { class: "share" }, el("span", { text: "goodput" }), el("b", { class: "goodput", text: num(t.goodput_per_s, 3) + " /s" })),
      ),
      sparkline(t.goodput_series),
      outcomeBar(t.outcomes, order),
      legend,
    );
  });
  $("tenants").replaceChildren(...cards);
  if (!cards.length) $("tenants").append(el("p", { class: "empty", text: "no tenants" }));
}

// The burst regime (admission.burst_capacity): the load, and while a burst is on, what it trades.
function renderBurst(b) {
  $("load").textContent = b ? num(b.load) + "×" : "n/a";
  const badge = $("burst");
  badge.hidden = !(b && b.in_burst);
  if (!b || !b.in_burst) return;
  const trades = b.trades.length ? b.trades.join("; ") : "nothing yet";
  badge.textContent = `burst: ${b.capped_questions} questions capped (${trades})`;
  badge.title = `burst regime ${b.bursts}: the arriving work is ${num(b.load)}× what the cluster sustains`;
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
      el("td", { class: "note", text: r.reason || r.error || "" }),
    ),
  );
  const body = $("tuning").tBodies[0];
  body.replaceChildren(...rows);
  if (!rows.length) body.append(el("tr", {}, el("td", { colspan: "6", class: "empty", text: "no tuning run yet" })));
}

function timeline(wf, W) {
  const calls = wf.calls;
  const LABEL = Math.round(Math.min(190, 0.27 * W)), RIGHT = 22, ROW = 16, TOP = 18;
  // The axis covers the workflow, and the deadline too unless it lies far beyond (then it is named under the
  // bars); it ends on a round number.
  const end = Math.max(wf.latency_s, ...calls.map((c) => c.done_s), 1e-6);
  const ticks = niceTicks(wf.deadline_s <= 1.5 * end ? Math.max(end, wf.deadline_s) : end, W < 600 ? 4 : 6);
  const span = ticks[ticks.length - 1];
  const deadlineShown = wf.deadline_s <= span;
  const rows = TOP + ROW * Math.max(calls.length, 1) + 6;
  const H = deadlineShown ? rows : rows + 14;
  const x = (t) => LABEL + ((W - LABEL - RIGHT) * Math.min(Math.max(t, 0), span)) / span;
  const root = svg("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, class: "timeline", role: "img" });
  for (const t of ticks) {
    root.append(svg("line", { x1: x(t), x2: x(t), y1: TOP - 4, y2: rows, class: "grid" }));
    root.append(svg("text", { x: x(t), y: 11, "text-anchor": "middle", class: "muted tick", "data-tick": t }, tickLabel(t, ticks) + " s"));
  }
  calls.forEach((c, i) => {
    const y = TOP + i * ROW;
    const name = `${c.kind} @ ${c.worker || "—"}`;
    const label = svg("text", { x: 0, y: y + 11, class: i === wf.lost_at ? "lost" : "muted" }, fitText(name, LABEL - 6));
    root.append(label);
    const g = svg("g", { class: "call" });
    const left = wf.deadline_s - c.ready_s;
    g.append(svg("title", {}, `${name}: waited ${num(c.waited_s, 3)} s, ran ${num(c.ran_s, 3)} s; stage budget ` +
      `${num(c.budget_s, 3)} s (of the ${num(left, 3)} s then left to the deadline)` +
      `${c.over_budget ? ", went past it" : ", within it"}; ${c.attempts} attempt(s)${c.ok ? "" : ", failed"}`));
    // The stage budget as it was: a band from the call's queueing to the end of its budget.
    const budgetEnd = c.ready_s + c.budget_s;
    if (c.budget_s > 0) {
      g.append(svg("rect", { x: x(c.ready_s), y: y + 13, width: Math.max(x(budgetEnd) - x(c.ready_s), 1), height: 2, class: "budget-band" }));
      if (budgetEnd <= span) {
        g.append(svg("line", { x1: x(budgetEnd), x2: x(budgetEnd), y1: y + 1, y2: y + 15, class: "budget-end" }));
      }
    }
    for (const seg of callSegments(c, wf.deadline_s)) {
      const cls = seg.phase === "run" && !c.ok ? "seg run-failed" : `seg ${seg.phase}-${seg.level}`;
      g.append(svg("rect", { x: x(seg.from), y: y + 3, width: Math.max(x(seg.to) - x(seg.from), 1), height: 10, class: cls }));
    }
    root.append(g);
  });
  if (deadlineShown) {
    const dx = x(wf.deadline_s);
    root.append(svg("line", { x1: dx, x2: dx, y1: TOP - 6, y2: H, class: "deadline" }));
  } else {
    const note = `deadline at ${num(wf.deadline_s, 1)} s, beyond the axis →`;
    root.append(svg("text", { x: W - 2, y: H - 3, "text-anchor": "end", class: "muted deadline-note" }, note));
  }
  return root;
}

// What the id shown is, for its client.
function idTitle(wf) {
  if (wf.request_id && wf.request_id === wf.id) return "the X-Request-Id of its request";
  if (wf.route === "text2sql") return "the id of its /v1/text2sql response";
  if (wf.route === "workflows") return "the id of its /v1/workflows response";
  return "the gateway's own id of this call (its client got the X-Request-Id header and the worker's response id)";
}

function renderSlowest(slowest) {
  const W = Math.max(320, Math.floor($("slowest").clientWidth || 900));
  const items = slowest.map((wf) => {
    const head = el(
      "div",
      { class: "wf-head" },
      el("code", { class: "wf-id", text: wf.id, title: idTitle(wf) }),
    );
    if (wf.request_id && wf.request_id !== wf.id) {
      head.append(el("span", { class: "rid", title: "the X-Request-Id header of its request" }, "X-Request-Id ", el("code", { text: wf.request_id })));
    }
    head.append(
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
    const node = el("div", { class: "wf", "data-workflow": wf.id }, head, timeline(wf, W));
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
  setInterval(showStale, 1000); // a poll that hangs leaves the figures stale too
  poll();
});
