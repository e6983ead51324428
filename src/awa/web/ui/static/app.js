// Awa web UI: a small hash-routed page over the JSON API in api/.
// No framework and nothing fetched from the internet. Every value from the
// server goes through esc() before it reaches innerHTML.
"use strict";

const REFRESH_MS = 2000;
const state = { config: null, route: null, timer: null };
const view = () => document.getElementById("view");

// Only http(s) links are ever made clickable (a stored javascript: URL is not).
function webUrl(u) { return typeof u === "string" && /^https?:\/\/[^\s]/i.test(u.trim()); }

function esc(v) {
  return String(v ?? "").replace(/[&<>"']/g, (c) => ({
    "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}
const fmtN = (n) => esc((n ?? 0).toLocaleString("en-US"));
const capped = (n) => (n >= state.countCap ? fmtN(n) + "+" : fmtN(n));
function when(iso) {
  if (!iso) return "—";
  const d = new Date(iso), s = (Date.now() - d.getTime()) / 1000;
  const rel = Math.abs(s) < 60 ? `${Math.round(Math.abs(s))}s` :
    Math.abs(s) < 3600 ? `${Math.round(Math.abs(s) / 60)}m` :
    Math.abs(s) < 86400 ? `${Math.round(Math.abs(s) / 3600)}h` : `${Math.round(Math.abs(s) / 86400)}d`;
  return `<span title="${esc(d.toISOString())}">${s >= 0 ? rel + " ago" : "in " + rel}</span>`;
}
const stateChip = (s) => `<span class="state ${esc(s)}">${esc(s)}</span>`;
const mut = (html) => (state.config && state.config.read_only ? "" : html);
const btn = (label, action, args, cls = "") =>
  mut(`<button type="button" class="${cls}" data-action="${esc(action)}" ` +
      `data-args='${esc(JSON.stringify(args || {}))}'>${esc(label)}</button>`);

// -- API ------------------------------------------------------------------------------

class AuthError extends Error {}

async function api(path, body) {
  const headers = { accept: "application/json" };
  const token = localStorage.getItem("awa-token");
  if (token) headers.authorization = "Bearer " + token;
  const opts = { headers };
  if (body !== undefined) {
    opts.method = "POST";
    headers["content-type"] = "application/json";
    headers["x-awa-request"] = "1";
    opts.body = JSON.stringify(body);
  }
  const res = await fetch("api/" + path, opts);
  const data = await res.json().catch(() => ({ error: res.statusText }));
  if (res.status === 401) throw new AuthError(data.error);
  if (!res.ok) throw new Error(data.error || res.statusText);
  return data;
}

function toast(msg, bad = false) {
  const t = document.getElementById("toast");
  t.textContent = msg;
  t.className = bad ? "bad" : "";
  t.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => (t.hidden = true), 3500);
}

// -- charts -----------------------------------------------------------------------------

function chart(title, series, key, color, unit) {
  const w = 300, h = 110, pts = series.map((p) => p[key]);
  const vals = pts.filter((v) => v !== null && v !== undefined);
  const max = Math.max(1, ...vals);
  const x = (i) => (series.length < 2 ? 0 : (i / (series.length - 1)) * w);
  const y = (v) => h - 4 - (v / max) * (h - 14);
  const xy = [];
  pts.forEach((v, i) => { if (v !== null && v !== undefined) xy.push([x(i), y(v)]); });
  const d = xy.map(([a, b], i) => `${i ? "L" : "M"}${a.toFixed(1)},${b.toFixed(1)}`).join("");
  const last = vals.length ? vals[vals.length - 1] : 0;
  const area = xy.length > 1 ? `<path class="area" fill="${color}" d="M${xy[0][0]},${h}` +
    xy.map(([a, b]) => `L${a.toFixed(1)},${b.toFixed(1)}`).join("") + `L${xy[xy.length - 1][0]},${h}Z"/>` : "";
  const dot = xy.length === 1 ? `<circle cx="${xy[0][0]}" cy="${xy[0][1]}" r="3" fill="${color}"/>` : "";
  return `<div class="card chart"><div class="l">${esc(title)} · last ${series.length} min</div>
    <div class="n">${fmtN(Math.round(last))}<span class="muted" style="font-size:12px"> ${esc(unit)}</span></div>
    <svg viewBox="0 0 ${w} ${h}" preserveAspectRatio="none" role="img" aria-label="${esc(title)}">
      <line class="axis" x1="0" y1="${h - 4}" x2="${w}" y2="${h - 4}"/>${area}
      <path class="line" stroke="${color}" d="${d}"/>${dot}</svg>
    <div class="muted">peak ${fmtN(Math.round(Math.max(0, ...vals)))} ${esc(unit)}</div></div>`;
}

// -- views ------------------------------------------------------------------------------

const STATES = ["available", "scheduled", "retryable", "running", "waiting_external",
  "completed", "failed", "cancelled"];

async function dashboard() {
  const o = await api("overview");
  state.countCap = o.count_cap;
  const c = o.counts;
  const card = (label, n, href) =>
    `<a class="card" href="${href}"><div class="n">${capped(n)}</div><div class="l">${esc(label)}</div></a>`;
  const cssColor = (v) => getComputedStyle(document.documentElement).getPropertyValue(v).trim();
  return `<h1>Dashboard</h1>
  <div class="cards" id="counts">
    ${card("available", c.available, "#/jobs?state=available")}
    ${card("scheduled", c.scheduled, "#/jobs?state=scheduled")}
    ${card("retryable", c.retryable, "#/jobs?state=retryable")}
    ${card("running", c.running, "#/jobs?state=running")}
    ${card("waiting for callback", c.waiting_external, "#/jobs?state=waiting_external")}
    ${card("failed", c.failed, "#/jobs?state=failed")}
    ${card("dead letter queue", c.dlq, "#/dlq")}
    ${card("completed (last hour)", c.completed_last_hour, "#/jobs?state=completed")}
  </div>
  <h2>Over time</h2>
  <div class="charts">
    ${chart("Completed per minute", o.series, "completed", cssColor("--ok"), "jobs/min")}
    ${chart("Failed per minute", o.series, "failed", cssColor("--bad"), "jobs/min")}
    ${chart("Pickup latency (avg)", o.series, "wait_ms_avg", cssColor("--accent"), "ms")}
  </div>
  <h2>Queues</h2>${queueTable(o.queues)}
  <h2>Recent failures</h2>
  ${o.recent_failures.length ? `<table><tr><th>id</th><th>kind</th><th>queue</th><th>attempt</th><th>when</th><th>error</th></tr>
  ${o.recent_failures.map((f) => `<tr><td><a href="#/jobs/${f.id}">${f.id}</a></td><td>${esc(f.kind)}</td>
    <td>${esc(f.queue)}</td><td>${f.attempt}/${f.max_attempts}</td><td>${when(f.finalized_at)}</td>
    <td class="mono">${esc(f.error.split("\n")[0])}</td></tr>`).join("")}</table>` :
    `<p class="muted">No failed jobs.</p>`}`;
}

function queueTable(queues) {
  if (!queues.length) return `<p class="muted">No queues yet.</p>`;
  return `<table id="queues"><tr><th>queue</th><th class="num">available</th><th class="num">running</th>
    <th class="num">lag</th><th class="num">completed/min</th><th class="num">failed (1h)</th>
    <th class="num">DLQ</th><th>status</th>${mut("<th></th>")}</tr>
  ${queues.map((q) => `<tr data-queue="${esc(q.queue)}"><td><a href="#/jobs?queue=${encodeURIComponent(q.queue)}">${esc(q.queue)}</a></td>
    <td class="num">${capped(q.available)}</td><td class="num">${capped(q.running)}</td>
    <td class="num">${q.lag_seconds == null ? "—" : q.lag_seconds.toFixed(1) + " s"}</td>
    <td class="num">${q.completed_per_min.toFixed(1)}</td><td class="num">${fmtN(q.failed_last_hour)}</td>
    <td class="num">${capped(q.dlq)}</td>
    <td>${q.paused ? `<span class="state failed">paused</span>` : `<span class="state completed">active</span>`}</td>
    ${mut(`<td class="row">${q.paused ? btn("Resume", "queue-resume", { name: q.queue }) :
      btn("Pause", "queue-pause", { name: q.queue })}
      ${btn("Drain", "queue-drain", { name: q.queue }, "danger")}</td>`)}</tr>`).join("")}</table>`;
}

function overrideText(o) {
  if (!o) return "—";
  const parts = [];
  if (o.poll_interval_ms != null) parts.push(`poll ${o.poll_interval_ms} ms`);
  if (o.claim_batch_size != null) parts.push(`batch ${o.claim_batch_size}`);
  if (o.rate_limit) parts.push(`rate ${o.rate_limit.max_rate}/s burst ${o.rate_limit.burst}`);
  if (o.deadline_ms != null) parts.push(`deadline ${o.deadline_ms} ms`);
  return esc(parts.join(", ")) + (o.updated_by ? ` <span class="muted">by ${esc(o.updated_by)}</span>` : "");
}

function descriptorCell(d) {
  if (!d) return `<span class="muted">—</span>`;
  const x = d.descriptor;
  const name = webUrl(x.docs_url) ? `<a href="${esc(x.docs_url)}" rel="noreferrer">${esc(x.display_name || d.name)}</a>` : esc(x.display_name || d.name);
  return `${name}${x.owner ? ` · ${esc(x.owner)}` : ""} <span class="state ${d.status === "live" ? "completed" : d.status === "drifted" ? "retryable" : "failed"}">${esc(d.status)}</span>`;
}

// Concurrency keys with jobs in flight, saturated first (client.concurrency_keys).
function keyTable(keys) {
  if (!keys.length) return "";
  return `<h2>Concurrency keys in flight</h2>
  <table id="keys"><tr><th>queue</th><th>key</th><th class="num">in flight / limit</th>
    <th class="num">running here</th><th class="num">waiting</th><th></th></tr>
  ${keys.map((k) => `<tr data-key="${esc(k.key)}"><td>${esc(k.queue)}</td><td>${esc(k.key)}</td>
    <td class="num">${fmtN(k.in_flight)} / ${fmtN(k.max_in_flight)}</td><td class="num">${fmtN(k.running)}</td>
    <td class="num">${fmtN(k.waiting)}${k.waiting_at_least ? "+" : ""}</td>
    <td>${k.saturated ? `<span class="state retryable">saturated</span>` : ""}</td></tr>`).join("")}</table>
  <p class="muted">Keys with jobs running (at most 50, saturated first); a saturated key's next job waits for one of its slots.</p>`;
}

async function queuesView() {
  const r = await api("queues");
  const names = r.queues.map((q) => q.queue);
  return `<h1>Queues</h1>${queueTable(r.queues)}
  <h2>Descriptors and live overrides</h2>
  <table id="queue-meta"><tr><th>queue</th><th>descriptor</th><th>overrides (applied by workers within seconds)</th></tr>
  ${r.queues.map((q) => `<tr data-queue="${esc(q.queue)}"><td>${esc(q.queue)}</td><td>${descriptorCell(q.descriptor)}</td>
    <td>${overrideText(q.override)} ${q.override ? btn("Clear", "override-clear", { name: q.queue }) : ""}</td></tr>`).join("")}</table>
  ${mut(names.length ? `<form id="override-form" class="filters" data-sticky style="margin-top:10px">
    <select name="queue">${names.map((n) => `<option>${esc(n)}</option>`).join("")}</select>
    <input name="poll_interval_ms" placeholder="poll interval ms" size="14">
    <input name="claim_batch_size" placeholder="claim batch size" size="14">
    <input name="rate_limit" placeholder="rate/s[/burst]" size="12">
    <input name="deadline_ms" placeholder="deadline ms" size="12">
    <button type="submit">Set override</button></form>` : "")}
  ${keyTable(r.keys || [])}
  ${r.kinds.length ? `<h2>Job kinds</h2><table id="kinds"><tr><th>kind</th><th>descriptor</th><th>description</th></tr>
    ${r.kinds.map((k) => `<tr><td>${esc(k.name)}</td><td>${descriptorCell(k)}</td><td>${esc(k.descriptor.description || "")}</td></tr>`).join("")}</table>` : ""}`;
}

function jobRows(jobs, extra) {
  if (!jobs.length) return `<p class="muted">No jobs match.</p>`;
  return `<table id="jobs"><tr><th>id</th><th>state</th><th>kind</th><th>queue</th><th>attempt</th>
    <th>args</th><th>created</th>${extra ? "<th>reason</th>" : ""}</tr>
  ${jobs.map((j) => `<tr><td><a href="#/jobs/${j.id}">${j.id}</a></td><td>${stateChip(j.state)}</td>
    <td>${esc(j.kind)}</td><td>${esc(j.queue)}</td><td>${j.attempt}/${j.max_attempts}</td>
    <td class="mono">${esc(j.args_preview)}</td><td>${when(j.created_at)}</td>
    ${extra ? `<td>${esc(j.reason)}</td>` : ""}</tr>`).join("")}</table>`;
}

function filterForm(route, fields) {
  const p = route.params;
  const input = (name, ph) =>
    `<input name="${name}" placeholder="${ph}" value="${esc(p.get(name) || "")}">`;
  return `<form class="filters" data-filter="${esc(route.name)}">
    ${fields.includes("state") ? `<select name="state"><option value="">any state</option>
      ${STATES.map((s) => `<option ${p.get("state") === s ? "selected" : ""}>${s}</option>`).join("")}</select>` : ""}
    ${input("queue", "queue")}${input("kind", "kind")}${input("tag", "tag")}
    ${fields.includes("q") ? input("q", "search args, kind, tags") : ""}
    <button type="submit">Filter</button></form>`;
}

function pager(route, next) {
  const p = new URLSearchParams(route.params);
  const first = p.has("cursor");
  p.set("cursor", next || "");
  const base = new URLSearchParams(route.params); base.delete("cursor");
  return `<div class="pager">${first ? `<a class="btn" href="#/${route.name}?${base}">« newest</a>` : ""}
    ${next ? `<a class="btn" id="older" href="#/${route.name}?${p}">older »</a>` : ""}</div>`;
}

async function jobsView(route) {
  const r = await api("jobs?" + route.params.toString());
  const failed = route.params.get("state") === "failed";
  return `<h1>Jobs</h1>${filterForm(route, ["state", "q"])}
    ${failed ? `<p>${btn("Retry every failed job matching queue/kind", "retry-failed",
      { queue: route.params.get("queue"), kind: route.params.get("kind") })}</p>` : ""}
    ${jobRows(r.jobs)}${pager(route, r.next_cursor)}`;
}

async function jobView(route) {
  const full = route.params.get("full") === "1";
  const r = await api("jobs/" + route.id + (full ? "?full=1" : ""));
  const j = r.job;
  const wf = await api("jobs/" + route.id + "/workflow");
  const waiting = wf.nodes.some((n) => n.id === j.id && n.status === "waiting");
  const cut = r.truncated || {};
  // A value over the page's limit arrives as a text preview: say so, link the whole.
  const big = (name, value) => cut[name]
    ? `<pre>${esc(value)}</pre><p class="muted">Showing the start of ${(cut[name] / 1048576).toFixed(1)} MB.
       <a id="show-all-${name}" href="#/jobs/${j.id}?full=1">show all</a></p>`
    : `<pre>${esc(JSON.stringify(value, null, 2))}</pre>`;
  const prog = j.progress || {};
  const pct = typeof prog.percent === "number" ? Math.max(0, Math.min(100, prog.percent)) : null;
  const canRetry = ["failed", "cancelled", "retryable", "scheduled", "waiting_external"].includes(j.state);
  const canCancel = !["completed", "failed", "cancelled"].includes(j.state);
  return `<h1>Job ${j.id} ${stateChip(j.state)}</h1>
  <div class="row" id="job-actions">${canRetry && !r.dlq ? btn("Retry", "job-retry", { id: j.id }) : ""}
    ${r.dlq ? btn("Retry from DLQ", "dlq-retry", { id: j.id }) + btn("Purge", "dlq-purge-one", { id: j.id }, "danger") : ""}
    ${canCancel ? btn("Cancel", "job-cancel", { id: j.id }, "danger") : ""}</div>
  <h2>Summary</h2>
  <div class="kv">
    <div>kind</div><div>${esc(j.kind)}</div><div>queue</div><div>${esc(j.queue)}</div>
    <div>attempt</div><div>${j.attempt} of ${j.max_attempts}</div>
    <div>priority</div><div>${j.priority}</div><div>tags</div><div>${esc(j.tags.join(", ") || "—")}</div>
    <div>run at</div><div>${waiting ? "when its parents finish" : when(j.run_at)}</div><div>created</div><div>${when(j.created_at)}</div>
    <div>finished</div><div>${when(j.finalized_at)}</div>
    <div>callback</div><div id="callback">${esc(r.callback || "—")}</div>
    ${r.dlq ? `<div>dead-lettered</div><div>${esc(r.dlq.reason)}, ${when(r.dlq.dlq_at)}</div>` : ""}
    ${j.traceparent ? `<div>trace</div><div class="mono">${esc(j.traceparent)}</div>` : ""}
  </div>
  ${workflowGraph(wf, j.id)}
  <h2>Progress</h2>${j.progress ? `${pct !== null ? `<div class="progress"><span style="width:${pct}%"></span></div> ${pct}%` : ""}
    ${prog.message ? `<p>${esc(prog.message)}</p>` : ""}${big("progress", j.progress)}` : `<p class="muted">None reported.</p>`}
  <h2>Timeline</h2><ul class="timeline" id="timeline">${r.timeline.map((e) => `<li>
    <div><b>${esc(e.event)}</b> <span class="when">${when(e.at)}</span></div>
    ${e.detail ? `<pre>${esc(e.detail)}</pre>` : ""}</li>`).join("")}</ul>
  ${cut.errors ? `<p class="muted">Long error text is cut (the longest has ${fmtN(cut.errors)} characters).
    <a id="show-all-errors" href="#/jobs/${j.id}?full=1">show all</a></p>` : ""}
  <h2>Args</h2><div id="args">${big("args", j.args)}</div>
  <h2>Output</h2>${j.output === null || j.output === undefined ? `<p class="muted">None.</p>` : big("output", j.output)}
  <h2>Metadata</h2>${big("metadata", j.metadata)}`;
}

// The jobs connected to this one by dependencies, one row per layer (a job's layer is
// one more than its deepest parent's); "waiting" = parked until its parents finish.
function workflowGraph(wf, current) {
  if (wf.nodes.length < 2) return "";
  const byId = new Map(wf.nodes.map((n) => [n.id, n]));
  const me = byId.get(current);
  const node = (n) => `<div class="wf-node${n.id === current ? " current" : ""}" data-job="${n.id}">
    <a href="#/jobs/${n.id}">${n.id}</a> ${esc(n.kind || "—")} ${stateChip(n.status)}
    ${n.parents.length ? `<div class="muted">after ${n.parents.map((e) => `<a href="#/jobs/${e.parent_id}">${e.parent_id}</a>`).join(", ")}
      · ${esc(n.parents[0].policy)}</div>` : ""}</div>`;
  return `<h2>Workflow</h2>
  ${me && me.waiting_on ? `<p id="waiting-on">Waiting for ${me.waiting_on} parent job(s) to finish.</p>` : ""}
  <div class="workflow" id="workflow">${wf.layers.map((layer) => `<div class="wf-layer">
    ${layer.map((id) => node(byId.get(id))).join("")}</div>`).join("")}</div>
  ${wf.truncated ? `<p class="muted">Only the first ${wf.nodes.length} jobs are shown.</p>` : ""}`;
}

async function cronView() {
  const r = await api("cron");
  if (!r.cron.length) return `<h1>Cron</h1><p class="muted">No schedules. Declare them with client.periodic(...).</p>`;
  return `<h1>Cron</h1><table id="cron"><tr><th>name</th><th>schedule</th><th>kind</th><th>queue</th>
    <th>last fire</th><th>next fire</th><th>status</th>${mut("<th></th>")}</tr>
  ${r.cron.map((c) => `<tr data-cron="${esc(c.name)}"><td>${esc(c.name)}</td><td class="mono">${esc(c.cron_expr)} ${esc(c.timezone)}</td>
    <td>${esc(c.kind)}</td><td>${esc(c.queue)}</td><td>${when(c.last_fire_at)}</td><td>${when(c.next_fire_at)}</td>
    <td>${c.error ? `<span class="state failed">cannot fire</span> <span class="cron-error">${esc(c.error)}</span>`
      : c.paused ? `<span class="state failed">paused</span>` : `<span class="state completed">active</span>`}</td>
    ${mut(`<td class="row">${c.paused ? btn("Resume", "cron-resume", { name: c.name }) : btn("Pause", "cron-pause", { name: c.name })}
      ${btn("Trigger now", "cron-trigger", { name: c.name })}</td>`)}</tr>`).join("")}</table>`;
}

async function dlqView(route) {
  const r = await api("dlq?" + route.params.toString());
  const f = { queue: route.params.get("queue"), kind: route.params.get("kind"), tag: route.params.get("tag") };
  const filtered = f.queue || f.kind || f.tag;
  return `<h1>Dead letter queue</h1>${filterForm(route, [])}
    ${filtered ? `<p class="row">${btn("Retry all matching", "dlq-retry-bulk", f)}
      ${btn("Purge all matching", "dlq-purge", f, "danger")}</p>` :
      mut(`<p class="muted">Filter by queue, kind or tag to retry or purge in bulk.</p>`)}
    ${jobRows(r.jobs, true)}${pager(route, r.next_cursor)}`;
}

// A worker's queues as it published them (any role that writes runtime_instances
// could put anything there): every part escaped, a non-object shown as JSON.
function queueSlots(queues) {
  if (!queues || typeof queues !== "object") return esc(JSON.stringify(queues ?? null));
  return Object.entries(queues).map(([n, q]) =>
    `${esc(n)} ${esc(q && q.in_flight)}/${esc(q && q.max_workers)}`).join("<br>");
}

async function runtimeView() {
  const r = await api("runtime");
  const l = r.leader;
  return `<h1>Runtime</h1>
  <p>Maintenance leader: ${l && l.live ? `<b class="mono" id="leader">${esc(l.holder)}</b> (lease ${when(l.expires_at)})` : `<span class="muted">none</span>`}</p>
  ${r.workers.length ? `<table id="workers"><tr><th>instance</th><th>host</th><th>pid</th><th>queues</th>
    <th class="num">in flight</th><th class="num">claimed</th><th class="num">completed</th><th>listen</th><th>started</th><th>seen</th></tr>
  ${r.workers.map((w) => `<tr class="${w.stale ? "muted" : ""}"><td class="mono">${esc(w.instance_id)} ${w.is_leader ? `<span class="state running">leader</span>` : ""}
    ${w.stale ? `<span class="state failed">stale</span>` : ""}</td><td>${esc(w.hostname)}</td><td>${esc(w.pid)}</td>
    <td>${queueSlots(w.queues)}</td>
    <td class="num">${fmtN(w.in_flight)}</td><td class="num">${fmtN(w.claimed)}</td><td class="num">${fmtN(w.completed)}</td>
    <td>${w.listening ? "LISTEN" : "polling"}</td><td>${when(w.started_at)}</td><td>${when(w.last_seen_at)}</td></tr>`).join("")}</table>` :
    `<p class="muted">No worker processes are running.</p>`}`;
}

// Batch operations: the form's values and the last preview survive live re-renders.
const BATCH_FIELDS = ["op_kind", "priority", "target_queue", "queue", "kind", "tag", "state",
  "ids", "created_after", "created_before"];
state.batch = { form: { op_kind: "set_priority" }, preview: null };

function batchChange(spec) {
  if (spec.op_kind === "move_queue") {
    return `queue → ${esc(spec.queue)}${spec.priority ? `, priority ${esc(spec.priority)}` : ""}`;
  }
  return `priority → ${esc(spec.priority)}`;
}

function batchFilter(f) {
  const parts = Object.entries(f).filter(([, v]) => v !== null && v !== undefined)
    .map(([k, v]) => `${esc(k)}=${esc(Array.isArray(v) ? v.join(",") : v)}`);
  return parts.length ? parts.join(", ") : `<span class="muted">every queued job</span>`;
}

function batchProgress(op) {
  const done = op.processed + op.skipped + op.errored;
  const total = op.total_matched;
  const pct = op.state === "completed" ? 100 : total ? Math.min(100, Math.round((done / total) * 100)) : 0;
  return `<div class="progress"><span style="width:${pct}%"></span></div>
    <div class="muted">${fmtN(done)} / ${total === null ? "?" : fmtN(total)}</div>`;
}

function batchForm() {
  const v = state.batch.form;
  const input = (name, ph, extra = "") =>
    `<input name="${name}" placeholder="${esc(ph)}" value="${esc(v[name] || "")}" ${extra}>`;
  const move = v.op_kind === "move_queue";
  return `<form id="batch-form" class="card">
    <div class="row"><select name="op_kind">
      <option value="set_priority" ${move ? "" : "selected"}>set priority</option>
      <option value="move_queue" ${move ? "selected" : ""}>move to queue</option></select>
      ${move ? input("target_queue", "to queue") : ""}
      ${input("priority", move ? "new priority (optional)" : "new priority 1-4", 'type="number" min="1" max="4" style="width:13em"')}</div>
    <div class="row" style="margin-top:8px"><span class="muted">of queued jobs with</span>
      ${input("queue", "queue")}${input("kind", "kind")}${input("tag", "tag")}
      <select name="state"><option value="">any queued state</option>
        ${["available", "scheduled", "retryable"].map((s) =>
          `<option ${v.state === s ? "selected" : ""}>${s}</option>`).join("")}</select>
      ${input("ids", "ids: 1, 2, 3")}${input("created_after", "created after (ISO)")}
      ${input("created_before", "created before (ISO)")}</div>
    <div class="row" style="margin-top:8px"><button type="submit" value="preview">Preview</button>
      <button type="submit" value="submit" class="danger">Submit</button></div></form>`;
}

function batchPreview() {
  const p = state.batch.preview;
  if (!p) return "";
  return `<div id="batch-preview"><p><b>${fmtN(p.total_matched)}</b> queued jobs match now${p.sample.length ? `; the first ${p.sample.length}:` : "."}</p>
    ${p.sample.length ? `<table><tr><th>id</th><th>state</th><th>kind</th><th>queue</th><th>priority</th><th>created</th></tr>
    ${p.sample.map((j) => `<tr><td><a href="#/jobs/${esc(j.id)}">${esc(j.id)}</a></td><td>${stateChip(j.state)}</td>
      <td>${esc(j.kind)}</td><td>${esc(j.queue)}</td><td>${esc(j.priority)}</td><td>${when(j.created_at)}</td></tr>`).join("")}</table>` : ""}</div>`;
}

async function batchesView() {
  const r = await api("batches");
  const ops = r.operations;
  return `<h1>Batch operations</h1>
  ${mut(`<p class="muted">Change the priority or queue of queued jobs. A worker's maintenance leader
    runs the operation in small transactions and skips jobs that started meanwhile.</p>
    ${batchForm()}${batchPreview()}`)}
  <h2>Operations</h2>
  ${ops.length ? `<table id="batches"><tr><th>id</th><th>change</th><th>filter</th><th>state</th><th>progress</th>
    <th class="num">processed</th><th class="num">skipped</th><th class="num">errored</th><th>submitted</th><th>finished</th>${mut("<th></th>")}</tr>
  ${ops.map((o) => `<tr data-batch="${esc(o.id)}"><td class="mono" title="${esc(o.id)}">${esc(o.id.slice(0, 8))}</td>
    <td>${batchChange(o.spec)}</td><td>${batchFilter(o.filter)}</td><td>${stateChip(o.state)}</td>
    <td>${batchProgress(o)}</td><td class="num">${fmtN(o.processed)}</td><td class="num">${fmtN(o.skipped)}</td>
    <td class="num" title="${esc(o.last_error || "")}">${fmtN(o.errored)}</td>
    <td>${when(o.submitted_at)}${o.submitted_by ? ` <span class="muted">by ${esc(o.submitted_by)}</span>` : ""}</td>
    <td>${when(o.finalized_at)}</td>
    ${mut(`<td>${["pending", "scanning", "running"].includes(o.state) ?
      btn("Cancel", "batch-cancel", { id: o.id }, "danger") : ""}</td>`)}</tr>`).join("")}</table>` :
    `<p class="muted">No batch operations yet.</p>`}`;
}

function batchValues(form) {
  const v = {};
  for (const name of BATCH_FIELDS) {
    const el = form.elements.namedItem(name);
    if (el && el.value.trim()) v[name] = el.value.trim();
  }
  return v;
}

async function batchSubmit(form, submitter) {
  state.batch.form = batchValues(form);
  const body = state.batch.form;
  try {
    if (submitter && submitter.value === "submit") {
      if (!confirm("Submit this batch operation for the matching queued jobs?")) return;
      const r = await api("batches", body);
      state.batch.preview = null;
      toast(`Submitted ${r.operation.id.slice(0, 8)}`);
    } else {
      state.batch.preview = await api("batches/preview?" + new URLSearchParams(body));
    }
  } catch (e) {
    toast(e.message, true);
  }
  render(true);
}

function loginView(message) {
  return `<div class="login card"><h1>Access token</h1><p class="muted">${esc(message || "This Awa UI is protected.")}</p>
    <form id="login" class="row"><input name="token" type="password" placeholder="token" autofocus>
    <button type="submit">Open</button></form></div>`;
}

// -- routing and actions ---------------------------------------------------------------

const VIEWS = { dashboard, jobs: jobsView, job: jobView, queues: queuesView, cron: cronView,
  dlq: dlqView, runtime: runtimeView, batches: batchesView };

function parseRoute() {
  const raw = location.hash.replace(/^#\/?/, "");
  const [path, query] = raw.split("?");
  const parts = path.split("/").filter(Boolean);
  const params = new URLSearchParams(query || "");
  if (parts[0] === "jobs" && parts[1]) return { name: "job", id: parts[1], params };
  return { name: VIEWS[parts[0]] ? parts[0] : "dashboard", params };
}

async function render(live = false) {
  const route = parseRoute();
  state.route = route;
  document.querySelectorAll("nav a").forEach((a) =>
    a.classList.toggle("active", a.dataset.nav === (route.name === "job" ? "jobs" : route.name)));
  try {
    if (!state.config) state.config = await api("config");
    document.getElementById("mode").hidden = !state.config.read_only;
    const html = await VIEWS[route.name](route);
    if (state.route !== route) return; // navigated meanwhile
    view().innerHTML = html;
    view().dataset.view = route.name;
    document.getElementById("live").className = "live";
  } catch (e) {
    if (e instanceof AuthError) {
      stopLive();
      view().innerHTML = loginView(localStorage.getItem("awa-token") ? "That token was not accepted." : "");
      return;
    }
    document.getElementById("live").className = "live off";
    if (!live) view().innerHTML = `<p class="muted">Could not load: ${esc(e.message)}</p>`;
  }
}

const ACTIONS = {
  "job-retry": (a) => api(`jobs/${a.id}/retry`, {}),
  "job-cancel": (a) => confirm(`Cancel job ${a.id}?`) && api(`jobs/${a.id}/cancel`, {}),
  "retry-failed": (a) => confirm("Retry every matching failed job?") && api("jobs/retry-failed", a),
  "queue-pause": (a) => api(`queues/${encodeURIComponent(a.name)}/pause`, {}),
  "queue-resume": (a) => api(`queues/${encodeURIComponent(a.name)}/resume`, {}),
  "queue-drain": (a) => confirm(`Cancel every queued job of ${a.name}?`) &&
    api(`queues/${encodeURIComponent(a.name)}/drain`, {}),
  "override-clear": (a) => confirm(`Clear the overrides of ${a.name}?`) &&
    api(`queues/${encodeURIComponent(a.name)}/overrides/clear`, {}),
  "cron-pause": (a) => api(`cron/${encodeURIComponent(a.name)}/pause`, {}),
  "cron-resume": (a) => api(`cron/${encodeURIComponent(a.name)}/resume`, {}),
  "cron-trigger": (a) => api(`cron/${encodeURIComponent(a.name)}/trigger`, {}),
  "dlq-retry": (a) => api(`dlq/${a.id}/retry`, {}),
  "dlq-purge-one": (a) => confirm(`Delete dead-lettered job ${a.id} for good?`) && api(`dlq/${a.id}/purge`, {}),
  "dlq-retry-bulk": (a) => confirm("Retry every matching dead-lettered job?") && api("dlq/retry", a),
  "dlq-purge": (a) => confirm("Delete every matching dead-lettered job for good?") && api("dlq/purge", a),
  "batch-cancel": (a) => confirm(`Cancel batch operation ${a.id.slice(0, 8)}?`) &&
    api(`batches/${encodeURIComponent(a.id)}/cancel`, {}),
};

document.addEventListener("click", async (ev) => {
  const b = ev.target.closest("button[data-action]");
  if (!b) return;
  b.disabled = true;
  try {
    const result = await ACTIONS[b.dataset.action](JSON.parse(b.dataset.args));
    if (result) toast(b.textContent.trim() + ": done");
  } catch (e) {
    toast(e.message, true);
  } finally {
    b.disabled = false;
    render(true);
  }
});

document.addEventListener("submit", (ev) => {
  ev.preventDefault();
  const form = ev.target;
  if (form.id === "batch-form") {
    batchSubmit(form, ev.submitter);
    return;
  }
  if (form.id === "login") {
    localStorage.setItem("awa-token", new FormData(form).get("token"));
    state.config = null;
    startLive();
    render();
    return;
  }
  if (form.id === "override-form") {
    const body = {};
    for (const [k, v] of new FormData(form)) if (v && k !== "queue") body[k] = k !== "rate_limit" && /^-?\d+$/.test(v) ? Number(v) : v;
    const queue = new FormData(form).get("queue");
    api(`queues/${encodeURIComponent(queue)}/overrides`, body)
      .then(() => { form.reset(); toast(`overrides of ${queue} saved`); render(true); },
        (e) => toast(e.message, true));  // on error the form keeps what was typed
    return;
  }
  const params = new URLSearchParams();
  for (const [k, v] of new FormData(form)) if (v) params.set(k, v);
  location.hash = `#/${form.dataset.filter}?${params}`;
});

// The batch form changes shape with its kind (a target queue to move to).
document.addEventListener("change", (ev) => {
  const form = ev.target.closest && ev.target.closest("#batch-form");
  if (!form) return;
  state.batch.form = batchValues(form);
  if (ev.target.name === "op_kind") render(true);
});

document.getElementById("theme").addEventListener("click", () => {
  const dark = getComputedStyle(document.documentElement).colorScheme === "dark";
  const next = dark ? "light" : "dark";
  document.documentElement.dataset.theme = next;
  localStorage.setItem("awa-theme", next);
  render(true);
});

function startLive() {
  stopLive();
  state.timer = setInterval(() => {
    const typing = document.activeElement && ["INPUT", "SELECT"].includes(document.activeElement.tagName);
    // A half-filled action form is not wiped by a refresh.
    const drafting = [...document.querySelectorAll("form[data-sticky] input")].some((i) => i.value);
    const busy = typing || drafting;
    if (!document.hidden && !busy) render(true);
  }, REFRESH_MS);
}
function stopLive() { clearInterval(state.timer); state.timer = null; }

window.addEventListener("hashchange", () => render());
startLive();
render();
