// The requests' Gantt timeline, shared by the live dashboard (dashboard.js) and the static
// reports of bench / sim (bench/timeline_html.py inlines this file). Plain SVG, no library.
//
// Input: lifecycle events {t, request_id, state, tokens?, priority?, user?, rank?, reason?}
// (GET /v1/engine/events documents them). A request's bar is its events in order, each
// state lasting until the next event; a prefill chunk is a segment of its own.
"use strict";

const STATE_COLORS = {
  queued: "#adb5bd", prefill: "#f59f00", decode: "#2f9e44", preempted: "#e8590c",
  swapped: "#7950f2", finished: "#1c7ed6", aborted: "#e03131",
};
const TERMINAL = new Set(["finished", "aborted"]);
const SVG_NS = "http://www.w3.org/2000/svg";

class RequestLog {
  // The last `maxRequests` requests by arrival, with their events.
  constructor(maxRequests) {
    this.maxRequests = maxRequests;
    this.requests = new Map();  // id -> {id, events, priority, user, rank, prompt, output, reason}
  }

  add(events) {
    for (const e of events) {
      let r = this.requests.get(e.request_id);
      if (!r) {
        r = {id: e.request_id, events: [], priority: null, user: null, rank: null,
             prompt: null, output: null, reason: null};
        this.requests.set(e.request_id, r);
      }
      r.events.push(e);
      if (e.state === "queued") {
        r.prompt = e.tokens ?? 0;
        r.priority = e.priority ?? r.priority;
        r.user = e.user ?? r.user;
      }
      if (e.rank !== undefined) r.rank = e.rank;
      if (TERMINAL.has(e.state)) {
        r.output = e.tokens ?? 0;
        r.reason = e.reason ?? e.state;
        r.rank = null;
      }
    }
    // Oldest arrivals leave first (a Map keeps insertion order: the first event seen).
    while (this.requests.size > this.maxRequests) {
      this.requests.delete(this.requests.keys().next().value);
    }
  }

  setRanks(ranks) {
    for (const r of this.requests.values()) {
      if (!TERMINAL.has(lastState(r))) r.rank = ranks[r.id] ?? null;
    }
  }
}

function lastState(request) {
  return request.events.length ? request.events[request.events.length - 1].state : null;
}

// The distinct states in order, chunks merged: "queued prefill decode finished".
function stateSequence(request) {
  const seq = [];
  for (const e of request.events) if (seq[seq.length - 1] !== e.state) seq.push(e.state);
  return seq;
}

function fmtSeconds(s) {
  return s < 1 ? `${(s * 1000).toFixed(0)} ms` : `${s.toFixed(2)} s`;
}

function describeRequest(r, now) {
  const start = r.events[0].t;
  const lines = [r.id];
  const facts = [];
  if (r.priority !== null) facts.push(`priority ${r.priority}`);
  if (r.user) facts.push(`user ${r.user}`);
  if (r.rank !== null) facts.push(`policy rank ${r.rank}`);
  if (facts.length) lines.push(facts.join(", "));
  lines.push(`prompt ${r.prompt ?? "?"} tokens` + (r.output !== null ? `, output ${r.output}` : ""));
  r.events.forEach((e, i) => {
    const end = i + 1 < r.events.length ? r.events[i + 1].t : (TERMINAL.has(e.state) ? e.t : now);
    let text = `${fmtSeconds(e.t - start)}  ${e.state}`;
    if (e.state === "prefill") text += ` ${e.tokens} tokens`;
    if (e.reason) text += ` (${e.reason})`;
    if (!TERMINAL.has(e.state)) text += `, ${fmtSeconds(Math.max(0, end - e.t))}`;
    lines.push(text);
  });
  return lines.join("\n");
}

function svgEl(name, attrs) {
  const el = document.createElementNS(SVG_NS, name);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  return el;
}

// Draw `log` into `container` (a div): one row per request, oldest at the top.
// opts: {now: the time the bars run to, maxRows, tooltip: a div for hover details}.
function renderTimeline(container, log, opts) {
  const rows = [...log.requests.values()].filter((r) => r.events.length)
    .slice(-(opts.maxRows || 60));
  const width = Math.max(container.clientWidth || 800, 400);
  const rowH = 14, labelW = 170, top = 18;
  const height = top + rows.length * rowH + 4;
  const svg = svgEl("svg", {width, height, class: "timeline"});
  if (!rows.length) {
    const t = svgEl("text", {x: 8, y: 14, class: "empty"});
    t.textContent = "no request yet";
    svg.appendChild(t);
    container.replaceChildren(svg);
    return;
  }
  const now = opts.now;
  const t0 = Math.min(...rows.map((r) => r.events[0].t));
  const t1 = Math.max(now, ...rows.map((r) => r.events[r.events.length - 1].t), t0 + 1e-3);
  const x = (t) => labelW + (t - t0) / (t1 - t0) * (width - labelW - 8);
  for (let i = 0; i <= 4; i++) {  // the time axis, seconds since the first arrival shown
    const t = t0 + (t1 - t0) * i / 4;
    const label = svgEl("text", {x: x(t), y: 11, class: "axis",
                                 "text-anchor": i === 0 ? "start" : i === 4 ? "end" : "middle"});
    label.textContent = `${(t - t0).toFixed(1)} s`;
    svg.appendChild(label);
  }
  rows.forEach((r, row) => {
    const y = top + row * rowH;
    const g = svgEl("g", {class: "request", "data-request-id": r.id,
                          "data-states": stateSequence(r).join(" ")});
    const name = svgEl("text", {x: 2, y: y + rowH - 3, class: "label"});
    name.textContent = r.id.length > 26 ? r.id.slice(0, 12) + "…" + r.id.slice(-12) : r.id;
    g.appendChild(name);
    r.events.forEach((e, i) => {
      const terminal = TERMINAL.has(e.state);
      const end = i + 1 < r.events.length ? r.events[i + 1].t : (terminal ? e.t : now);
      const x0 = x(e.t);
      const w = terminal ? 3 : Math.max(1, x(end) - x0);
      g.appendChild(svgEl("rect", {x: terminal ? x0 - 1 : x0, y: y + 1, width: w,
                                   height: rowH - 2, fill: STATE_COLORS[e.state] || "#000",
                                   class: `state-${e.state}`}));
    });
    if (opts.tooltip) {
      g.addEventListener("mousemove", (ev) => {
        opts.tooltip.textContent = describeRequest(r, now);
        opts.tooltip.style.display = "block";
        opts.tooltip.style.left = `${ev.pageX + 12}px`;
        opts.tooltip.style.top = `${ev.pageY + 12}px`;
      });
      g.addEventListener("mouseleave", () => { opts.tooltip.style.display = "none"; });
    }
    svg.appendChild(g);
  });
  container.replaceChildren(svg);
}

function timelineLegend(container) {
  container.replaceChildren(...Object.entries(STATE_COLORS).map(([state, color]) => {
    const item = document.createElement("span");
    item.className = "legend-item";
    item.innerHTML = `<i style="background:${color}"></i>${state}`;
    return item;
  }));
}
