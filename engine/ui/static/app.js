// The Turnstile dashboard: a page per hash route, drawn from the JSON API. Every value is
// put in the page as text (never as HTML), so payloads cannot inject markup.
"use strict";

const main = document.getElementById("main");
let config = { actions: false, token_required: false, namespace: "", statuses: [] };

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null && v !== false) node.setAttribute(k, v === true ? "" : v);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function when(ms) { return ms ? new Date(ms).toISOString().replace("T", " ").slice(0, 23) : ""; }
function json(value) { return JSON.stringify(value, null, 2); }
function statusCell(s) { return el("span", { class: `status status-${s}`, "data-status": s }, s); }
function instanceLink(id) { return el("a", { href: `#/instance/${encodeURIComponent(id)}` }, id); }

async function api(path, options) {
  const response = await fetch(path, options);
  const body = await response.json().catch(() => ({ error: `HTTP ${response.status}` }));
  if (!response.ok) throw new Error(body.error || `HTTP ${response.status}`);
  return body;
}

function show(...nodes) { main.replaceChildren(...nodes.filter((n) => n !== null && n !== undefined)); }
function fail(error) { show(el("p", { class: "error", id: "error" }, error.message)); }

// --- the instance list ------------------------------------------------------------------

const FILTERS = ["status", "name", "version", "tag", "created_after", "created_before"];

async function listPage(params) {
  const form = el("form", { class: "filters", id: "filters" },
    ...FILTERS.map((f) => el("label", {}, f.replace("_", " "),
      el("input", { name: f, value: params.get(f) || "", placeholder: f === "tag" ? "key=value" : "", list: f === "status" ? "statuses" : null }))),
    el("datalist", { id: "statuses" }, config.statuses.map((s) => el("option", { value: s }))),
    el("button", { type: "submit" }, "Filter"));
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const q = new URLSearchParams();
    for (const f of FILTERS) { const v = form.elements[f].value.trim(); if (v) q.set(f, v); }
    location.hash = `#/?${q}`;
  });
  show(el("h1", {}, "Instances"), form, el("p", {}, "Loading…"));
  const page = await api(`/api/instances?${params}`);
  const rows = page.items.map((i) => el("tr", { "data-instance": i.instance_id },
    el("td", {}, instanceLink(i.instance_id)), el("td", {}, i.name), el("td", {}, i.version),
    el("td", {}, statusCell(i.status)), el("td", {}, when(i.created_ms)),
    el("td", {}, when(i.last_updated_ms)),
    el("td", {}, Object.entries(i.tags).map(([k, v]) => `${k}=${v}`).join(", "))));
  // Pages follow tokens: "Next page" starts after this page's last instance, so instances
  // started meanwhile (which sort first) do not shift the pages that follow.
  const to = (token) => { const q = new URLSearchParams(params); if (token) q.set("page_token", token); else q.delete("page_token"); return `#/?${q}`; };
  const pager = el("div", { class: "pager" },
    params.get("page_token") ? el("a", { href: to(null), id: "first-page" }, "First page") : null,
    el("span", { id: "count" }, `${page.items.length} shown of ${page.total}`),
    page.next_page_token ? el("a", { href: to(page.next_page_token), id: "next-page" }, "Next page") : null);
  const counts = el("div", { class: "pager", id: "by-status" }, Object.entries(page.by_status).sort().map(([s, n]) => {
    const q = new URLSearchParams(params); q.set("status", s); q.delete("page_token");
    return el("a", { href: `#/?${q}`, "data-count": s }, statusCell(s), ` ${n}`);
  }));
  show(el("h1", {}, "Instances"), form, counts, pager,
    el("table", { id: "instances" },
      el("thead", {}, el("tr", {}, ["Instance", "Name", "Version", "Status", "Created", "Updated", "Tags"].map((h) => el("th", {}, h)))),
      el("tbody", {}, rows)));
}

// --- one instance ------------------------------------------------------------------------

function actionForms(id, refresh) {
  if (!config.actions) return el("p", {}, "Actions are off (start the dashboard with --allow-actions).");
  const outcome = el("div", { class: "outcome", id: "outcome" });
  async function send(action, body) {
    if (!confirm(`${action} ${id}?`)) return;
    outcome.replaceChildren(`${action}: sent, waiting for the processor's answer…`);
    const headers = { "Content-Type": "application/json" };
    const token = document.getElementById("token").value;
    if (token) headers["X-Turnstile-Token"] = token;
    try {
      const answer = await api(`/api/instances/${encodeURIComponent(id)}/actions/${action}`,
        { method: "POST", headers, body: JSON.stringify(body) });
      outcome.replaceChildren(el("span", { "data-outcome": answer.outcome }, `${action}: ${answer.outcome} - ${answer.message}`));
      setTimeout(refresh, 300);
    } catch (error) {
      outcome.replaceChildren(el("span", { class: "error" }, `${action}: ${error.message}`));
    }
  }
  const ev = el("form", { class: "action", id: "raise-event" },
    el("label", {}, "event name", el("input", { name: "name", required: true })),
    el("label", {}, "data (JSON)", el("input", { name: "data", placeholder: "{\"ok\": true}" })),
    el("button", { type: "submit" }, "Raise event"));
  ev.addEventListener("submit", (e) => { e.preventDefault(); send("raise-event", { name: ev.elements.name.value, data: ev.elements.data.value }); });
  const reason = el("input", { name: "reason", id: "reason" });
  const recursive = el("input", { type: "checkbox", id: "recursive" });
  const buttons = el("form", { class: "action", id: "commands", onsubmit: (e) => e.preventDefault() },
    el("label", {}, "reason", reason), el("label", {}, "recursive", recursive),
    ...["terminate", "cancel", "suspend", "resume", "purge"].map((a) => el("button", { type: "button", "data-action": a,
      onclick: () => send(a, { reason: reason.value, recursive: recursive.checked }) }, a)));
  return el("section", {}, el("h2", {}, "Actions"), ev, buttons, outcome);
}

function queryForm(id) {
  const answer = el("pre", { class: "outcome", id: "query-answer" });
  const form = el("form", { class: "action", id: "query" },
    el("label", {}, "query name", el("input", { name: "name", required: true })),
    el("label", {}, "arguments (JSON list)", el("input", { name: "args", placeholder: "[\"pen\"]" })),
    el("button", { type: "submit" }, "Query"));
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    answer.replaceChildren("asking…");
    try {
      const r = await api(`/api/instances/${encodeURIComponent(id)}/query`, { method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ name: form.elements.name.value, args: form.elements.args.value }) });
      answer.replaceChildren(el("span", { "data-query": "answered" }, json(r.result)));
    } catch (error) {
      answer.replaceChildren(el("span", { class: "error", "data-query": "refused" }, error.message));
    }
  });
  return el("section", {}, el("h2", {}, "Query"), form, answer);
}

// An update changes the instance, so it is an action (allowed actions, and the token), shown
// next to the query box: the handler's result, or why the update was refused or rejected.
function updateForm(id) {
  if (!config.actions) return el("section", {}, el("h2", {}, "Update"), el("p", { id: "update-off" }, "Updates are actions (start the dashboard with --allow-actions)."));
  const answer = el("pre", { class: "outcome", id: "update-answer" });
  const form = el("form", { class: "action", id: "update" },
    el("label", {}, "update name", el("input", { name: "name", required: true })),
    el("label", {}, "argument (JSON)", el("input", { name: "arg", placeholder: "5" })),
    el("button", { type: "submit" }, "Update"));
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const name = form.elements.name.value;
    if (!confirm(`update ${name} of ${id}?`)) return;
    answer.replaceChildren("sent, waiting for the handler's result…");
    const headers = { "Content-Type": "application/json" };
    const token = document.getElementById("token").value;
    if (token) headers["X-Turnstile-Token"] = token;
    try {
      const r = await api(`/api/instances/${encodeURIComponent(id)}/update`, { method: "POST",
        headers, body: JSON.stringify({ name, arg: form.elements.arg.value }) });
      answer.replaceChildren(el("span", { "data-update": "answered" }, json(r.result)));
    } catch (error) {
      answer.replaceChildren(el("span", { class: "error", "data-update": "refused" }, error.message));
    }
  });
  return el("section", {}, el("h2", {}, "Update"), form, answer);
}

function failureView(f) {
  const parts = [];
  for (let cause = f, depth = 0; cause; cause = cause.cause, depth++) {
    parts.push(el("p", {}, depth ? "caused by " : "", el("strong", { class: "failure-type" }, cause.type), `: ${cause.message}`,
      cause.retryable ? "" : " (not retryable)"));
    if (cause.stack) parts.push(el("pre", { class: "stack" }, cause.stack));
  }
  return el("div", {}, parts);
}

function table(id, headers, rows) {
  if (!rows.length) return el("p", { id }, "none");
  return el("table", { id }, el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))),
    el("tbody", {}, rows.map((r) => el("tr", {}, r.map((c) => el("td", {}, c))))));
}

async function instancePage(id) {
  show(el("p", {}, "Loading…"));
  const i = await api(`/api/instances/${encodeURIComponent(id)}`);
  const refresh = () => route();
  const failure = i.failure ? el("section", { id: "failure" }, el("h2", {}, "Failure"), failureView(i.failure)) : null;
  show(
    el("h1", {}, i.instance_id),
    el("p", {}, statusCell(i.status), ` ${i.name} ${i.version} · generation ${i.generation} · created ${i.created} · updated ${i.last_updated}`,
      i.parent_instance_id ? el("span", {}, " · parent ", instanceLink(i.parent_instance_id)) : null,
      " ", el("button", { id: "refresh", onclick: refresh }, "Refresh")),
    i.pending_reason ? el("p", { id: "waiting" }, `${i.status === "PARKED" ? "Parked" : "Pending"}: ${i.pending_reason}`) : null,
    el("section", {}, el("h2", {}, "Input"), el("pre", { id: "input" }, json(i.input))),
    el("section", {}, el("h2", {}, "Output"), el("pre", { id: "output" }, json(i.output))),
    failure,
    el("section", {}, el("h2", {}, "Custom status"), el("pre", {}, json(i.custom_status))),
    el("section", {}, el("h2", {}, "Pending activities"),
      table("activities", ["Task", "Activity", "Attempt", "Scheduled"], i.activities.map((a) => [a.task_id, a.name, a.attempt, when(a.scheduled_ms)]))),
    el("section", {}, el("h2", {}, "Timers"),
      table("timers", ["Task", "Fires at"], i.timers.map((t) => [t.task_id, when(t.fire_at_ms)]))),
    el("section", {}, el("h2", {}, "Children"),
      table("children", ["Task", "Workflow", "Instance", "State"], i.children.map((c) => [c.task_id, c.name, instanceLink(c.instance_id), c.state]))),
    queryForm(i.instance_id),
    updateForm(i.instance_id),
    actionForms(i.instance_id, refresh),
    el("section", {}, el("h2", {}, "Timeline"),
      table("timeline", ["#", "Time", "Generation", "Event", "Details"], i.timeline.map((e) => [
        e.sequence, when(e.timestamp_ms), e.generation, el("span", { "data-kind": e.kind }, e.kind), el("pre", {}, json(e.body))]))),
  );
}

// --- replicas and dead letters -------------------------------------------------------------

function groupSection(title, group) {
  return el("section", {}, el("h2", {}, `${title}: ${group.group} (${group.state})`),
    table(`members-${title.toLowerCase()}`, ["Member", "Host", "Partitions"], group.members.map((m) => [
      m.client_id, m.host, m.partitions.map((p) => `${p.topic}[${p.partition}]`).join(", ")])),
    table(`lag-${title.toLowerCase()}`, ["Topic", "Partition", "Owner", "Committed", "End", "Lag"], group.partitions.map((p) => [
      p.topic, p.partition, p.owner, p.committed ?? "-", p.end, p.lag])));
}

async function replicasPage() {
  show(el("p", {}, "Loading…"));
  const r = await api("/api/replicas");
  show(el("h1", {}, "Replicas and lag"), groupSection("Processors", r.processors), groupSection("Workers", r.workers));
}

async function deadLettersPage() {
  show(el("p", {}, "Loading…"));
  const d = await api("/api/dead-letters");
  show(el("h1", {}, `Dead letters (${d.total})`),
    table("dead-letters", ["Time", "Reason", "Instance", "Source", "Size"], d.items.map((x) => [
      when(x.timestamp_ms), x.reason, x.instance_id ? instanceLink(x.instance_id) : "",
      `${x.source_topic || ""}[${x.source_partition ?? ""}]@${x.source_offset ?? ""}`, x.size ?? ""])));
}

// --- routing ------------------------------------------------------------------------------

async function route() {
  const hash = location.hash.slice(1) || "/";
  const [path, query] = hash.split("?");
  try {
    if (path.startsWith("/instance/")) await instancePage(decodeURIComponent(path.slice(10)));
    else if (path === "/replicas") await replicasPage();
    else if (path === "/dead-letters") await deadLettersPage();
    else await listPage(new URLSearchParams(query || ""));
  } catch (error) { fail(error); }
}

async function start() {
  try { config = await api("/api/config"); } catch (error) { fail(error); return; }
  document.getElementById("namespace").textContent = `namespace ${config.namespace}`;
  document.getElementById("token-box").hidden = !config.token_required;
  window.addEventListener("hashchange", route);
  await route();
}

start();
