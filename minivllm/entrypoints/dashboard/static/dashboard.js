// The live dashboard: reads GET /v1/engine/events and draws it (timeline.js draws the
// requests). Plain canvas and SVG, no library, nothing fetched from outside the server.
"use strict";

const HISTORY = 300;  // snapshots kept for the charts
const history = [];
const requestLog = new RequestLog(200);
let serverNow = null;  // the latest snapshot's server time, and when it came
let receivedAt = 0;

const $ = (id) => document.getElementById(id);

function setValue(id, value, text) {
  const el = $(id);
  el.dataset.value = String(value);
  el.textContent = text;
}

const pct = (x) => `${(x * 100).toFixed(1)}%`;
const MIB = 1 << 20;
const mib = (bytes) => `${(bytes / MIB).toFixed(1)} MiB`;

// A line chart of `series` [{name, color, key(point)}] over the history.
const tick = (v) => (Number.isInteger(v) || v >= 10 ? v.toFixed(0) : v.toFixed(1));

function lineChart(canvas, series, {max = null, format = tick, counts = false} = {}) {
  const ratio = window.devicePixelRatio || 1;
  const w = canvas.clientWidth, h = canvas.clientHeight;
  canvas.width = w * ratio;
  canvas.height = h * ratio;
  const ctx = canvas.getContext("2d");
  ctx.scale(ratio, ratio);
  ctx.clearRect(0, 0, w, h);
  const left = 44, bottom = 16, topPad = 16;
  const values = series.flatMap((s) => history.map(s.key));
  // Counts get whole ticks: the top a multiple of the 4 grid steps.
  const top = max ?? (counts ? 4 * Math.ceil(Math.max(1, ...values) / 4)
                             : Math.max(1, ...values) * 1.1);
  const y = (v) => topPad + (h - topPad - bottom) * (1 - v / top);
  const x = (i) => left + (w - left - 4) * (history.length > 1 ? i / (history.length - 1) : 1);
  ctx.font = "10px sans-serif";
  ctx.strokeStyle = "#e9ecef";
  ctx.fillStyle = "#868e96";
  for (let i = 0; i <= 4; i++) {
    const v = top * i / 4;
    ctx.beginPath();
    ctx.moveTo(left, y(v));
    ctx.lineTo(w - 4, y(v));
    ctx.stroke();
    ctx.fillText(format(v), 2, y(v) + 3);
  }
  if (history.length > 1) {
    const span = history[history.length - 1].t - history[0].t;
    ctx.fillText(`last ${span.toFixed(0)} s`, left, h - 3);
  }
  let legendX = left;
  for (const s of series) {
    ctx.strokeStyle = s.color;
    ctx.lineWidth = 1.5;
    ctx.beginPath();
    history.forEach((p, i) => (i ? ctx.lineTo(x(i), y(s.key(p))) : ctx.moveTo(x(i), y(s.key(p)))));
    ctx.stroke();
    ctx.fillStyle = s.color;
    ctx.fillRect(legendX, 4, 8, 8);
    ctx.fillStyle = "#495057";
    ctx.fillText(s.name, legendX + 11, 12);
    legendX += ctx.measureText(s.name).width + 24;
  }
}

const BLOCK_COLORS = {u: "#1c7ed6", c: "#74c0fc", f: "#e9ecef", s: "#7950f2"};

// The block map: the device pool, then the host (swap) pool, one square per cell.
function drawBlockMap(canvas, map) {
  const ratio = window.devicePixelRatio || 1;
  const w = canvas.clientWidth;
  const cell = 9, perRow = Math.max(1, Math.floor(w / cell));
  const rows = (s) => Math.ceil(s.length / perRow);
  const device = map.cells.map, host = map.swap_cells.map;
  const h = (rows(device) + (host.length ? rows(host) + 1 : 0)) * cell + 2;
  canvas.style.height = `${h}px`;
  canvas.width = w * ratio;
  canvas.height = h * ratio;
  const ctx = canvas.getContext("2d");
  ctx.scale(ratio, ratio);
  const paint = (letters, firstRow) => [...letters].forEach((letter, i) => {
    ctx.fillStyle = BLOCK_COLORS[letter];
    ctx.fillRect((i % perRow) * cell, (firstRow + Math.floor(i / perRow)) * cell, cell - 1, cell - 1);
  });
  paint(device, 0);
  if (host.length) paint(host, rows(device) + 1);
}

function showBlockMap(map) {
  if (!map) return;
  drawBlockMap($("block-map"), map);
  $("block-map-legend").innerHTML =
    `<span class="legend-item"><i style="background:${BLOCK_COLORS.u}"></i>in use ${map.in_use}</span>` +
    `<span class="legend-item"><i style="background:${BLOCK_COLORS.c}"></i>cached (evictable) ${map.cached}</span>` +
    `<span class="legend-item"><i style="background:${BLOCK_COLORS.f}"></i>free ${map.free}</span>` +
    `<span class="legend-item"><i style="background:${BLOCK_COLORS.s}"></i>swapped ${map.swapped} / ${map.swap_total} host blocks</span>` +
    `<span class="note">${map.total} device blocks, ${map.cells.per_cell} per square</span>`;
}

// Where the TTFT went (the server's parts, mean ms over the interval), stacked: each line
// is the sum of its part and those before it, so the top one is the server's mean TTFT.
const TTFT_PARTS = [["frontend_in_ms", "frontend in", "#868e96"], ["queue_ms", "queue", "#f59f00"],
                    ["prefill_ms", "prefill", "#1c7ed6"], ["frontend_out_ms", "frontend out", "#2f9e44"]];

function showTtftSplit(split) {
  for (const [key] of TTFT_PARTS) {  // the figures keep the last interval that had streams
    const id = `ttft-${key.replace("_ms", "").replaceAll("_", "-")}`;
    if (split) setValue(id, split[key], `${split[key].toFixed(1)} ms`);
  }
  lineChart($("chart-ttft"), TTFT_PARTS.map(([key, name, color], i) => ({
    name, color,
    key: (p) => (p.ttft_split ? TTFT_PARTS.slice(0, i + 1).reduce((sum, [k]) => sum + p.ttft_split[k], 0) : 0),
  })));
}

// The prefix cache's disk tier: its figures while there is one, hidden otherwise.
function showDiskTier(disk) {
  $("kv-disk").hidden = !disk;
  if (!disk) return;
  setValue("kv-disk-used", disk.used_bytes,
           `${mib(disk.used_bytes)} / ${mib(disk.capacity_bytes)} (${pct(disk.used_bytes / disk.capacity_bytes)})`);
  setValue("kv-disk-blocks", disk.blocks, disk.blocks);
  setValue("kv-disk-hits", disk.hit_tokens, disk.hit_tokens);
  setValue("kv-disk-io", disk.bytes_read + disk.bytes_written,
           `${mib(disk.bytes_read)} / ${mib(disk.bytes_written)}`);
  setValue("kv-disk-evictions", disk.evictions, disk.evictions);
  setValue("kv-disk-corrupt", disk.corrupt, disk.corrupt);
}

function onSnapshot(s) {
  serverNow = s.t;
  receivedAt = performance.now();
  history.push(s);
  if (history.length > HISTORY) history.shift();
  setValue("q-running", s.running, s.running);
  $("q-running").dataset.t = String(s.t);  // which snapshot the figures are from
  setValue("q-waiting", s.waiting, s.waiting);
  setValue("q-swapped", s.swapped, s.swapped);
  setValue("q-preemptions", s.preemptions, s.preemptions);
  const budget = s.steps.token_budget;
  const use = budget && s.steps.count ? s.steps.mean_tokens / budget : 0;
  setValue("q-budget", use, s.steps.count ? `${s.steps.mean_tokens.toFixed(0)} / ${budget} (${pct(use)})` : "idle");
  setValue("kv-usage", s.kv_cache_usage, pct(s.kv_cache_usage));
  setValue("kv-hit-rate", s.prefix_cache_hit_rate, pct(s.prefix_cache_hit_rate));
  setValue("kv-cpu-usage", s.cpu_cache_usage, pct(s.cpu_cache_usage));
  setValue("tp-prompt", s.prompt_throughput, `${s.prompt_throughput.toFixed(1)} tokens/s`);
  setValue("tp-generation", s.generation_throughput, `${s.generation_throughput.toFixed(1)} tokens/s`);
  lineChart($("chart-queues"), [
    {name: "running", color: "#2f9e44", key: (p) => p.running},
    {name: "waiting", color: "#f59f00", key: (p) => p.waiting},
    {name: "swapped", color: "#7950f2", key: (p) => p.swapped},
  ], {counts: true});
  lineChart($("chart-budget"), [
    {name: "mean tokens / step", color: "#1c7ed6",
     key: (p) => (p.steps.token_budget ? p.steps.mean_tokens / p.steps.token_budget : 0)},
    {name: "max tokens / step", color: "#e8590c",
     key: (p) => (p.steps.token_budget ? p.steps.max_tokens / p.steps.token_budget : 0)},
  ], {max: 1, format: pct});
  showDiskTier(s.kv_disk);
  lineChart($("chart-kv"), [
    {name: "KV usage", color: "#1c7ed6", key: (p) => p.kv_cache_usage},
    {name: "prefix cache hit rate", color: "#2f9e44", key: (p) => p.prefix_cache_hit_rate},
    ...(s.kv_disk ? [{name: "disk tier used", color: "#e8590c",
                      key: (p) => (p.kv_disk ? p.kv_disk.used_bytes / p.kv_disk.capacity_bytes : 0)}] : []),
  ], {max: 1, format: pct});
  lineChart($("chart-throughput"), [
    {name: "prompt tokens/s", color: "#f59f00", key: (p) => p.prompt_throughput},
    {name: "generation tokens/s", color: "#2f9e44", key: (p) => p.generation_throughput},
  ]);
  showTtftSplit(s.ttft_split);
  showBlockMap(s.block_map);
  requestLog.setRanks(s.ranks || {});
  drawTimeline();
}

function now() {
  return serverNow === null ? Date.now() / 1000 : serverNow + (performance.now() - receivedAt) / 1000;
}

function drawTimeline() {
  renderTimeline($("timeline"), requestLog, {now: now(), maxRows: 60, tooltip: $("tooltip")});
}

function onConfig(c) {
  $("model").textContent = c.model;
  $("policy-name").textContent = c.policy.scheduling_policy ?? "?";
  const table = (obj) => Object.entries(obj).map(([k, v]) =>
    `<tr><th>${k}</th><td>${v === null ? "-" : typeof v === "object" ? JSON.stringify(v) : v}</td></tr>`).join("");
  $("policy").innerHTML = table(c.policy);
  $("config").innerHTML = table({max_model_len: c.max_model_len, ...c.engine});
}

function connect() {
  const source = new EventSource("/v1/engine/events");
  source.addEventListener("config", (e) => onConfig(JSON.parse(e.data)));
  source.addEventListener("snapshot", (e) => onSnapshot(JSON.parse(e.data)));
  source.addEventListener("lifecycle", (e) => {
    requestLog.add(JSON.parse(e.data).events);
    drawTimeline();
  });
  source.onopen = () => { $("status").textContent = "live"; $("status").className = "live"; };
  // EventSource reconnects by itself; the history starts again with the new stream.
  source.onerror = () => { $("status").textContent = "reconnecting…"; $("status").className = "down"; };
}

timelineLegend($("timeline-legend"));
connect();
