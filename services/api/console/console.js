// Concord console: a thin page over the public JSON API. Every button is one API call with the
// key typed in above (kept in this tab's sessionStorage only); the page holds no data itself.
"use strict";

const $ = (id) => document.getElementById(id);
const FINAL_STATES = new Set(["indexed", "failed", "dead_lettered"]);

function apiKey() { return sessionStorage.getItem("concord-key") || ""; }

function showMessage(text, isError) {
  const box = $("message");
  box.textContent = text;
  box.className = isError ? "error" : "";
}

async function api(method, path, body) {
  const headers = { Authorization: `Bearer ${apiKey()}` };
  const init = { method, headers };
  if (body instanceof FormData) {
    init.body = body;
  } else if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  if (response.status === 204) return null;
  const data = await response.json().catch(() => ({}));
  if (!response.ok) {
    const reason = (data.error && data.error.message) || response.statusText;
    throw new Error(`${method} ${path}: ${response.status} ${reason}`);
  }
  return data;
}

function escapeHtml(text) {
  return String(text ?? "").replace(/[&<>"']/g, (c) => ({
    "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;",
  })[c]);
}

// Marks the words the server matched to the query's terms: its [start, end) offsets count
// code points, as Python does, so the text is sliced as an array of code points, not UTF-16.
function highlight(text, spans) {
  const points = Array.from(text);
  let html = "";
  let cursor = 0;
  for (const [start, end] of spans || []) {
    html += escapeHtml(points.slice(cursor, start).join("")) + `<mark>${escapeHtml(points.slice(start, end).join(""))}</mark>`;
    cursor = end;
  }
  return html + escapeHtml(points.slice(cursor).join(""));
}

function table(element, columns, rows, extra) {
  const head = `<tr>${columns.map((c) => `<th>${escapeHtml(c.label)}</th>`).join("")}${extra ? "<th></th>" : ""}</tr>`;
  const body = rows.map((row) => `<tr>${columns.map((c) => `<td>${c.html ? c.html(row) : escapeHtml(c.value(row))}</td>`).join("")}${extra ? `<td>${extra(row)}</td>` : ""}</tr>`).join("");
  element.innerHTML = rows.length ? head + body : `<tr><td class="muted">nothing to show</td></tr>`;
}

async function guarded(action) {
  try {
    await action();
  } catch (error) {
    showMessage(error.message, true);
  }
}

// --- search -----------------------------------------------------------------------------

function traceTable(trace) {
  const cell = (part, key) => (part ? part[key] : "–");
  return `<table class="trace"><tr><th>stage</th><th>rank</th><th>score</th></tr>
    <tr><td>dense</td><td>${cell(trace.dense, "rank")}</td><td>${cell(trace.dense, "score")}</td></tr>
    <tr><td>BM25</td><td>${cell(trace.lexical, "rank")}</td><td>${cell(trace.lexical, "score")}</td></tr>
    <tr><td>fused</td><td>${trace.fused.rank}</td><td>${trace.fused.score}</td></tr>
    <tr><td>rerank</td><td>${trace.rerank ? `change ${trace.rerank.rank_change}` : "–"}</td><td>${trace.rerank ? trace.rerank.score : "–"}</td></tr>
    <tr><td>final</td><td>${trace.final_rank}</td><td>policy: ${escapeHtml(trace.policy)}</td></tr></table>`;
}

// A result as a reader names it: its title (or external id), and the section or PDF page.
function resultName(r) {
  return `${r.title || r.external_id || r.document_id}${r.section ? ` § ${r.section}` : ""}`;
}

function timingsTable(timings) {
  const rows = Object.entries(timings || {});
  if (!rows.length) return "";
  return `<table id="timings" class="timings"><tr><th>stage</th><th>ms</th></tr>${rows
    .map(([stage, ms]) => `<tr><td>${escapeHtml(stage)}</td><td>${escapeHtml(ms)}</td></tr>`)
    .join("")}</table>`;
}

async function runSearch(event) {
  event.preventDefault();
  const query = $("q").value;
  const body = {
    query,
    mode: $("mode").value,
    top_k: Number($("top-k").value) || 10,
    fusion: { method: $("fusion").value },
    rerank: { enabled: $("rerank").checked },
    explain: true,
    highlight: true,
  };
  if ($("filters").value.trim()) {
    try {
      body.filters = JSON.parse($("filters").value);
    } catch (error) {
      showMessage(`filters are not valid JSON: ${error.message}`, true);
      return;
    }
  }
  await guarded(async () => {
    const result = await api("POST", "/v1/search", body);
    const d = result.decision;
    $("decision").innerHTML = `<p>Decision: <span class="decision-${d.status}">${escapeHtml(d.status)}</span>
      ${d.reason ? `(${escapeHtml(d.reason)})` : ""} · score type ${escapeHtml(d.score_type)}
      · threshold ${d.threshold} · top score ${d.top_score ?? "–"}
      ${result.degraded.length ? `· <strong>degraded: ${escapeHtml(result.degraded.join(", "))}</strong>` : ""}</p>
      <details><summary>timings</summary>${timingsTable(result.timings_ms)}</details>`;
    const ev = result.evidence;
    // Omitted chunks are named as results are: by title and section, where they are among them.
    const byChunk = new Map(result.results.map((r) => [r.chunk_id, r]));
    const omitted = ev.omitted.map((o) => `${byChunk.has(o.chunk_id) ? resultName(byChunk.get(o.chunk_id)) : o.chunk_id} (${o.reason})`);
    $("evidence").innerHTML = `<p>Evidence packed: ${ev.items.length} chunk(s), ${ev.tokens_used} of ${ev.token_budget} tokens;
      omitted: ${omitted.length ? escapeHtml(omitted.join("; ")) : "none"}</p>`;
    $("results").innerHTML = result.results.map((r, i) => `<li>
        <strong class="result-name">${escapeHtml(resultName(r))}</strong>
        <span class="muted">${escapeHtml(r.external_id)} · v${r.version} · found by ${escapeHtml(r.found_by.join("+"))} · score ${r.score}</span>
        <div class="result-text">${highlight(r.text, r.highlights)}</div>
        <button type="button" class="show-trace" data-index="${i}">Show trace</button>
        <div class="trace-box" id="trace-${i}" hidden>${traceTable(r.trace)}</div>
      </li>`).join("") || "<li class='muted'>no results</li>";
    // under the search form, with the results it counts (it sat above the page's title)
    $("result-count").textContent = `${result.results.length} result(s)`;
  });
}

// --- ingestion --------------------------------------------------------------------------

async function upload(event) {
  event.preventDefault();
  const file = $("upload-file").files[0];
  if (!file) return;
  const form = new FormData();
  form.append("file", file);
  form.append("external_id", $("upload-external-id").value || file.name);
  if ($("upload-title").value) form.append("title", $("upload-title").value);
  await guarded(async () => {
    const accepted = await api("POST", "/v1/documents", form);
    $("upload-status").textContent = `document ${accepted.document_id} v${accepted.version}: ${accepted.status}`;
    if (accepted.job_id) await watchJob(accepted.job_id);
  });
}

async function watchJob(jobId) {
  for (let i = 0; i < 240; i += 1) {
    const job = await api("GET", `/v1/jobs/${jobId}`);
    $("upload-status").innerHTML = `job <code>${escapeHtml(jobId)}</code>: <span id="job-state" class="state-${escapeHtml(job.state)}">${escapeHtml(job.state)}</span>${job.error ? ` – ${escapeHtml(job.error.message)}` : ""}`;
    if (FINAL_STATES.has(job.state)) {
      await loadJobs();
      return;
    }
    await new Promise((resolve) => setTimeout(resolve, 500));
  }
}

// Jobs are named by their document (external id and title); the ids are in the tooltips.
const JOB_COLUMNS = [
  { label: "document", html: (j) => `<span title="document ${escapeHtml(j.document_id)}">${escapeHtml(j.external_id ?? j.document_id)}</span> v${j.version}` },
  { label: "title", value: (j) => j.title ?? "" },
  { label: "state", html: (j) => `<span class="state-${escapeHtml(j.state)}" title="job ${escapeHtml(j.id)}">${escapeHtml(j.state)}</span>` },
  { label: "attempts", value: (j) => j.attempts },
  { label: "stage timings (s)", value: (j) => Object.entries(j.stage_timings || {}).map(([k, v]) => `${k} ${v}`).join(", ") },
  { label: "error", value: (j) => (j.error ? `${j.error_stage || ""}: ${j.error}` : "") },
  { label: "created", value: (j) => j.created_at.replace("T", " ").slice(0, 19) },
  { label: "tenant", value: (j) => j.tenant_id },
];

async function loadJobs() {
  await guarded(async () => {
    table($("jobs"), JOB_COLUMNS, await api("GET", "/v1/admin/jobs?limit=25"));
    table($("stuck-jobs"), JOB_COLUMNS, await api("GET", "/v1/admin/jobs?stuck=true&limit=25"));
    const letters = await api("GET", "/v1/admin/dead-letters?limit=25");
    table($("dead-letters"), [
      { label: "id", value: (d) => d.id },
      { label: "tenant", value: (d) => d.tenant_id },
      { label: "source", value: (d) => `${d.source} ${d.ref}` },
      { label: "stage", value: (d) => d.stage },
      { label: "reason", value: (d) => `${d.error_class}: ${d.message}` },
      { label: "attempts", value: (d) => d.attempts },
      { label: "what to do", value: (d) => d.remedy },
    ], letters, (d) => (d.replayable
        ? `<button type="button" class="replay" data-id="${d.id}">Replay</button>`
        : "") + ` <button type="button" class="discard" data-id="${d.id}">Discard</button>`);
  });
}

async function deadLetterAction(event) {
  const button = event.target.closest("button");
  if (!button || !button.dataset.id) return;
  const id = button.dataset.id;
  await guarded(async () => {
    if (button.classList.contains("replay")) {
      const result = await api("POST", `/v1/admin/dead-letters/${id}/replay`);
      showMessage(`dead letter ${id} replayed: ${result.replayed}`);
    } else if (button.classList.contains("discard")) {
      await api("DELETE", `/v1/admin/dead-letters/${id}`);
      showMessage(`dead letter ${id} discarded`);
    }
    await loadJobs();
  });
}

// --- consistency ------------------------------------------------------------------------

const DRIFT_CLASSES = ["missing", "stale", "orphaned", "wrong_tenant"];
const DRIFT_COLOURS = { missing: "#d62828", stale: "#f77f00", orphaned: "#7b2cbf", wrong_tenant: "#1d3557" };

function driftChart(runs) {
  const ordered = [...runs].reverse();
  if (!ordered.length) return "<p class='muted'>no reconcile runs yet</p>";
  const width = 640, height = 160, pad = 28;
  const max = Math.max(1, ...ordered.flatMap((r) => DRIFT_CLASSES.map((c) => (r.report.counts || {})[c] || 0)));
  const x = (i) => pad + (ordered.length === 1 ? 0 : (i * (width - 2 * pad)) / (ordered.length - 1));
  const y = (v) => height - pad - (v * (height - 2 * pad)) / max;
  const lines = DRIFT_CLASSES.map((c) => {
    const points = ordered.map((r, i) => `${x(i)},${y((r.report.counts || {})[c] || 0)}`).join(" ");
    const dots = ordered.map((r, i) => `<circle cx="${x(i)}" cy="${y((r.report.counts || {})[c] || 0)}" r="3" fill="${DRIFT_COLOURS[c]}"><title>${c}: ${(r.report.counts || {})[c] || 0}</title></circle>`).join("");
    return `<polyline fill="none" stroke="${DRIFT_COLOURS[c]}" stroke-width="2" points="${points}"><title>${c}</title></polyline>${dots}`;
  }).join("");
  const legend = DRIFT_CLASSES.map((c, i) => `<text x="${pad + i * 110}" y="12" fill="${DRIFT_COLOURS[c]}">${c}</text>`).join("");
  return `<svg width="${width}" height="${height}" role="img" aria-label="drift per class over time">
    <line x1="${pad}" y1="${height - pad}" x2="${width - pad}" y2="${height - pad}" stroke="#999"/>
    <text x="2" y="${y(max) + 4}">${max}</text><text x="2" y="${height - pad + 4}">0</text>
    ${legend}${lines}</svg>`;
}

function reportSummary(report) {
  const counts = DRIFT_CLASSES.map((c) => `${c} ${(report.counts || {})[c] || 0}`).join(", ");
  const inFlight = report.in_flight ?? 0;  // runs recorded before the count existed have none
  return `total drift <strong id="total-drift">${report.total_drift}</strong> (${counts}); in flight <span id="in-flight" title="writes still waiting in the outbox: not drift, not repaired">${inFlight}</span>; buckets differing ${report.buckets_differing} of ${report.buckets_scanned}; ids read ${report.ids_read}; ${report.duration_s} s`;
}

async function loadReconcileRuns() {
  await guarded(async () => {
    const runs = await api("GET", "/v1/admin/reconcile-runs?limit=50");
    $("drift-chart").innerHTML = driftChart(runs);
    table($("reconcile-runs"), [
      { label: "when", value: (r) => r.started_at.replace("T", " ").slice(0, 19) },
      { label: "kind", value: (r) => (r.repair ? "repair" : "dry run") },
      { label: "report", html: (r) => reportSummary(r.report) },
    ], runs.slice(0, 10));
  });
}

async function runReconcile(event) {
  event.preventDefault();
  await guarded(async () => {
    $("reconcile-report").textContent = "running…";
    const report = await api("POST", "/v1/admin/reconcile", { repair: false });
    const samples = Object.entries(report.samples || {}).filter(([, ids]) => ids.length)
      .map(([c, ids]) => `${c}: ${ids.join(", ")}`).join("; ");
    $("reconcile-report").innerHTML = `<p>Dry run: ${reportSummary(report)}</p>${samples ? `<p class="muted">samples: ${escapeHtml(samples)}</p>` : ""}`;
    await loadReconcileRuns();
  });
}

// --- webhooks ---------------------------------------------------------------------------

async function loadWebhooks() {
  await guarded(async () => {
    const endpoints = await api("GET", "/v1/admin/webhooks");
    table($("webhooks"), [
      { label: "url", value: (e) => e.url },
      { label: "events", value: (e) => e.events.join(", ") },
      { label: "created", value: (e) => e.created_at.replace("T", " ").slice(0, 19) },
    ], endpoints, (e) => `<button type="button" class="show-deliveries" data-id="${escapeHtml(e.id)}">Delivery log</button>`);
  });
}

async function loadDeliveries(event) {
  const button = event.target.closest(".show-deliveries");
  if (!button) return;
  await guarded(async () => {
    const id = button.dataset.id;
    const log = await api("GET", `/v1/admin/webhooks/${id}/deliveries?limit=50`);
    $("delivery-endpoint").textContent = `endpoint ${id}: ${log.length} deliveries, newest first`;
    table($("deliveries"), [
      { label: "id", value: (d) => d.id },
      { label: "event", value: (d) => d.event },
      { label: "state", value: (d) => d.state },
      { label: "attempts", value: (d) => d.attempts },
      { label: "last status", value: (d) => d.last_status ?? "" },
      { label: "last error", value: (d) => d.last_error || "" },
      { label: "next attempt", value: (d) => (d.next_attempt_at || "").replace("T", " ").slice(0, 19) },
      { label: "delivered", value: (d) => (d.delivered_at || "").replace("T", " ").slice(0, 19) },
    ], log);
  });
}

// --- stats ------------------------------------------------------------------------------

async function loadStats() {
  await guarded(async () => {
    const stats = await api("GET", "/v1/admin/stats");
    // A figure that is a set of counts (jobs per state, queue depths) is a table of its own,
    // not a JSON string.
    table($("stats"), [
      { label: "figure", value: (row) => row[0].replaceAll("_", " ") },
      { label: "value", html: (row) => statValue(row[1]) },
    ], Object.entries(stats));
  });
}

function statValue(value) {
  if (value === null || value === undefined) return "–";
  if (typeof value !== "object") return escapeHtml(String(value));
  const rows = Object.entries(value);
  if (!rows.length) return "none";
  return `<table class="nested">${rows.map(([k, v]) => `<tr><th>${escapeHtml(k.replaceAll("_", " "))}</th><td>${statValue(v)}</td></tr>`).join("")}</table>`;
}

// --- navigation -------------------------------------------------------------------------

const LOADERS = {
  ingestion: loadJobs, consistency: loadReconcileRuns, webhooks: loadWebhooks, stats: loadStats,
};

function showPage() {
  showMessage("");
  // Without a key nothing can be shown: the first screen says which key and how to make one.
  $("welcome").hidden = Boolean(apiKey());
  const page = (location.hash || "#search").slice(1);
  document.querySelectorAll(".page").forEach((p) => p.classList.toggle("active", p.id === `page-${page}`));
  document.querySelectorAll("nav a").forEach((a) => a.classList.toggle("active", a.dataset.page === page));
  if (apiKey() && LOADERS[page]) LOADERS[page]();
}

function useKey(event) {
  event.preventDefault();
  sessionStorage.setItem("concord-key", $("api-key").value.trim());
  $("api-key").value = "";
  $("key-state").textContent = apiKey() ? "key set" : "";
  showMessage("");
  showPage();
}

$("key-form").addEventListener("submit", useKey);
$("search-form").addEventListener("submit", runSearch);
$("upload-form").addEventListener("submit", upload);
$("refresh-jobs").addEventListener("click", loadJobs);
$("dead-letters").addEventListener("click", deadLetterAction);
$("reconcile-form").addEventListener("submit", runReconcile);
$("refresh-stats").addEventListener("click", loadStats);
$("refresh-webhooks").addEventListener("click", loadWebhooks);
$("webhooks").addEventListener("click", loadDeliveries);
$("results").addEventListener("click", (event) => {
  const button = event.target.closest(".show-trace");
  if (!button) return;
  const box = $(`trace-${button.dataset.index}`);
  box.hidden = !box.hidden;
  button.textContent = box.hidden ? "Show trace" : "Hide trace";
});
window.addEventListener("hashchange", showPage);
$("key-state").textContent = apiKey() ? "key set" : "";
showPage();
