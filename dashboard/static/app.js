// robofleet dashboard: plain JavaScript, no libraries. Every page reads the REST API.
"use strict";

const ROLE_RANK = { viewer: 0, operator: 1, admin: 2 };

function cookie(name) {
  const hit = document.cookie.split("; ").find((c) => c.startsWith(name + "="));
  return hit ? decodeURIComponent(hit.slice(name.length + 1)) : "";
}

async function api(method, path, body) {
  const opts = { method, credentials: "same-origin", headers: { Accept: "application/json" } };
  if (method !== "GET") opts.headers["X-CSRF-Token"] = cookie("robofleet_csrf");
  if (body !== undefined) {
    opts.headers["Content-Type"] = "application/json";
    opts.body = JSON.stringify(body);
  }
  const res = await fetch(path, opts);
  if (res.status === 401 && document.body.dataset.page !== "login") {
    location.href = "/login?next=" + encodeURIComponent(location.pathname + location.search);
  }
  let data = null;
  const text = await res.text();
  try { data = text ? JSON.parse(text) : null; } catch (e) { data = { detail: text }; }
  return { ok: res.ok, status: res.status, data, headers: res.headers };
}

// Build DOM nodes without innerHTML: text is always text.
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(node.dataset, v);
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function flash(message, kind) {
  const box = document.getElementById("flash");
  box.textContent = message;
  box.className = "flash " + (kind || "info");
  box.hidden = !message;
}

function errorText(data) {
  if (!data) return "request failed";
  if (typeof data.detail === "string") return data.detail;
  if (Array.isArray(data.detail)) return data.detail.map((e) => e.msg).join("; ");
  return JSON.stringify(data);
}

const when = (s) => (s ? new Date(s).toLocaleString() : "—");
const canAct = (role) => ROLE_RANK[document.body.dataset.role || "viewer"] >= ROLE_RANK[role];

function fillTable(id, rows, render) {
  const body = document.querySelector(`#${id} tbody`);
  body.replaceChildren(...rows.map((r) => el("tr", {}, render(r))));
}

// A newest-first list API read a page at a time (?limit=&before_id=, X-Total-Count): Newer and
// Older buttons and "a–b of N" in the <nav class="pager" data-for=TABLE> under the table.
function pager(tableId, render, limit = 50) {
  const nav = document.querySelector(`nav.pager[data-for="${tableId}"]`);
  const status = el("span", { class: "muted" });
  let source = null, stack = [], current = null, page = [];
  async function show(before) {
    const q = new URLSearchParams(source.params);
    q.set("limit", String(limit));
    if (before !== null) q.set("before_id", String(before));
    const r = await api("GET", `${source.path}?${q}`);
    if (!r.ok) return flash(errorText(r.data), "error");
    page = r.data;
    fillTable(tableId, page, render);
    const total = Number(r.headers.get("X-Total-Count") ?? page.length);
    const above = stack.length * limit;
    status.textContent = page.length ? `${above + 1}–${above + page.length} of ${total}` : `none of ${total}`;
    newer.disabled = stack.length === 0;
    older.disabled = above + page.length >= total;
  }
  const newer = el("button", { class: "secondary", type: "button", onclick: () => { current = stack.pop() ?? null; show(current); } }, "Newer");
  const older = el("button", { class: "secondary", type: "button", onclick: () => { stack.push(current); current = page[page.length - 1].id; show(current); } }, "Older");
  nav.replaceChildren(newer, older, status);
  return {
    load(path, params) { source = { path, params }; stack = []; current = null; return show(null); },
    refresh() { return source ? show(current) : undefined; },
    onFirstPage: () => stack.length === 0,
  };
}

// --- robots: what each does now and what it is (RobotOut.activity, RobotOut.spec_summary) ----

function activityCell(a) {
  const run = a.run_id ? el("a", { href: `/runs/${a.run_id}` }, a.run_id) : null;
  const badge = el("span", { class: `badge ${a.state}` }, a.state);
  if (a.state === "assigned") return [badge, " run ", run, ` (${a.run_state})`];
  if (a.state === "leased") return [badge, " to run ", run, ", not acting yet"];
  if (a.state === "refused") return [badge, " run ", run, ": ", a.reason || "no reason given"];
  if (run) return [badge, a.run_state ? " in run " : " leased to ", run];
  return [badge];
}

function specCell(spec) {
  const shape = (s) => `(${s.join(", ")})`;
  const parts = [];
  const obs = Object.entries(spec.observation).filter(([k]) => !k.startsWith("observation.images."));
  if (obs.length) parts.push("obs " + obs.map(([k, s]) => `${k.replace(/^observation\./, "")} ${shape(s)}`).join(", "));
  if (spec.action) parts.push(`action ${shape(spec.action)}`);
  if (spec.cameras.length) parts.push("cameras " + spec.cameras.map((c) => `${c.name} ${c.height}×${c.width}`).join(", "));
  if (spec.control_hz !== null) parts.push(`${spec.control_hz} Hz`);
  return parts.length ? parts.join(" · ") : "—";
}

const computerCell = (spec) => [spec.driver || "—", " · ", spec.operator || "—"];
const heartbeatAge = (b) => (b.heartbeat_age_s === null ? "never" : `${b.heartbeat_age_s.toFixed(1)} s`);

// --- forms: nested names ("robots.count"), numbers, lists; errors next to the fields ---------

// mapFields: "k=v, k2=v2" (a textarea: one KEY=VALUE a line) -> {k: "v"}; jsonMapFields the
// same with each VALUE taken as JSON when it parses (as `robofleet edge --driver-option` does).
function readForm(form, listFields, mapFields, jsonMapFields = []) {
  const out = {};
  for (const input of form.querySelectorAll("input[name], select[name], textarea[name]")) {
    const raw = input.value.trim();
    if (raw === "") continue;
    let value = raw;
    if (listFields.includes(input.name)) value = raw.split(",").map((s) => s.trim()).filter(Boolean);
    else if (mapFields.includes(input.name) || jsonMapFields.includes(input.name)) {
      value = {};
      for (const pair of raw.split(input.tagName === "TEXTAREA" ? "\n" : ",")) {
        const [k, ...rest] = pair.split("=");
        if (!k.trim()) continue;
        let v = rest.join("=").trim();
        if (jsonMapFields.includes(input.name)) { try { v = JSON.parse(v); } catch (e) { /* a string */ } }
        value[k.trim()] = v;
      }
    } else if (input.type === "number") value = Number(raw);
    const parts = input.name.split(".");
    let target = out;
    for (const p of parts.slice(0, -1)) target = target[p] = target[p] || {};
    target[parts[parts.length - 1]] = value;
  }
  return out;
}

function clearErrors(form) {
  for (const span of form.querySelectorAll(".field-error")) span.textContent = "";
  for (const input of form.querySelectorAll(".invalid")) input.classList.remove("invalid");
  const formError = form.querySelector(".form-error");
  if (formError) formError.textContent = "";
}

// FastAPI's 422 body: detail = [{loc: ["body", "robots", "count"], msg}]
function showErrors(form, data) {
  const general = [];
  const details = Array.isArray(data && data.detail) ? data.detail : [{ loc: [], msg: errorText(data) }];
  for (const err of details) {
    const path = (err.loc || []).filter((p, i) => !(i === 0 && p === "body") && typeof p !== "number");
    const field = path.join(".");
    // The field's own slot, else the nearest enclosing one (e.g. an unknown hyper-parameter
    // goes next to the hyper-parameters, named).
    let span = null;
    let at = path.length;
    for (; at > 0 && !span; at--) {
      span = form.querySelector(`.field-error[data-field="${CSS.escape(path.slice(0, at).join("."))}"]`);
    }
    if (span) {
      const msg = at + 1 < path.length ? `${path.slice(at + 1).join(".")}: ${err.msg}` : err.msg;
      span.textContent = span.textContent ? span.textContent + "; " + msg : msg;
      const input = form.querySelector(`[name="${CSS.escape(field)}"]`);
      if (input) input.classList.add("invalid");
    } else general.push((field ? field + ": " : "") + err.msg);
  }
  const formError = form.querySelector(".form-error");
  if (general.length) {
    if (formError) formError.textContent = general.join("; ");
    else flash(general.join("; "), "error");
  }
}

function onSubmit(form, handler) {
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    clearErrors(form);
    const button = form.querySelector("button[type=submit]");
    if (button) button.disabled = true;
    try { await handler(); } finally { if (button) button.disabled = false; }
  });
}

// --- pages -------------------------------------------------------------------------------------

const pages = {};

pages.login = () => {
  const form = document.getElementById("login-form");
  onSubmit(form, async () => {
    const r = await api("POST", "/api/auth/login", {
      username: form.username.value, password: form.password.value,
    });
    if (!r.ok) { document.getElementById("login-error").textContent = errorText(r.data); return; }
    const next = new URLSearchParams(location.search).get("next") || "/";
    // Only same-site paths: never follow "//host" or an absolute URL from the query string.
    location.href = next.startsWith("/") && !next.startsWith("//") ? next : "/";
  });
};

pages.fleet = () => {
  const filter = document.getElementById("fleet-filter");
  async function robotAction(robot, action, label) {
    const r = await api("POST", `/api/robots/${robot.id}/${action}`);
    flash(r.ok ? `${robot.name}: ${label}` : errorText(r.data), r.ok ? "info" : "error");
    await load();
  }
  async function load() {
    const q = new URLSearchParams();
    for (const name of ["state", "run_id", "robot_type"]) if (filter[name].value.trim()) q.set(name, filter[name].value.trim());
    const r = await api("GET", `/api/robots?${q}`);
    if (!r.ok) return flash(errorText(r.data), "error");
    document.getElementById("robots-empty").hidden = r.data.length > 0;
    fillTable("robots", r.data, (b) => [
      el("td", {}, b.name),
      el("td", { class: "activity", title: `status: ${b.status}` }, activityCell(b.activity)),
      el("td", {}, b.robot_type),
      el("td", {}, b.site || "—"),
      el("td", {}, computerCell(b.spec_summary)),
      el("td", { class: "spec" }, specCell(b.spec_summary)),
      el("td", {}, heartbeatAge(b)),
      el("td", {}, b.applied_policy_version ?? "—"),
      el("td", {}, b.control_loop_p99_ms === null ? "—" : `${b.control_loop_p99_ms.toFixed(1)} ms`),
      el("td", { class: "actions" }, canAct("operator") ? [
        b.status === "estopped"
          ? el("button", { class: "secondary", onclick: () => robotAction(b, "clear-estop", "e-stop cleared") }, "Clear e-stop")
          : el("button", { class: "danger", onclick: () => robotAction(b, "estop", "e-stopped") }, "E-stop"),
        b.activity.run_state === "resetting" || b.stats.reset_paused
          ? el("button", { onclick: () => robotAction(b, "ready", "ready") }, "Ready") : null,
        b.leased_run_id ? el("button", { class: "secondary", onclick: () => robotAction(b, "release", "released") }, "Release") : null,
      ] : []),
    ]);
  }
  filter.addEventListener("submit", (ev) => { ev.preventDefault(); load(); });
  load();
  setInterval(load, 5000);
};

pages.enroll = () => {
  const form = document.getElementById("enroll-form");
  async function loadTokens() {
    const r = await api("GET", "/api/enrollment-tokens");
    if (r.ok) fillTable("tokens", r.data, (t) => [
      el("td", {}, when(t.created_at)), el("td", {}, t.robot_name || "—"),
      el("td", {}, t.robot_type || "—"),
      el("td", {}, Object.entries(t.tags).map(([k, v]) => `${k}=${v}`).join(", ") || "—"),
      el("td", {}, when(t.expires_at)),
      el("td", {}, t.used_by_robot_id ?? (t.used_at ? "yes" : "not yet")),
    ]);
  }
  onSubmit(form, async () => {
    const body = readForm(form, [], ["tags"], ["driver_options", "operator_options"]);
    if (body.ttl_minutes !== undefined) body.ttl_s = Math.round(body.ttl_minutes * 60);
    delete body.ttl_minutes;
    const r = await api("POST", "/api/enrollment-tokens", body);
    if (!r.ok) return showErrors(form, r.data);
    document.getElementById("enroll-command").textContent = r.data.command;
    document.getElementById("enroll-expires").textContent = when(r.data.expires_at);
    document.getElementById("enroll-result").hidden = false;
    loadTokens();
  });
  document.getElementById("copy-command").addEventListener("click", () =>
    navigator.clipboard && navigator.clipboard.writeText(document.getElementById("enroll-command").textContent));
  loadTokens();
};

pages.runs = () => {
  async function load() {
    const r = await api("GET", "/api/runs");
    if (r.ok) fillTable("runs", r.data, (run) => [
      el("td", {}, el("a", { href: `/runs/${run.id}` }, run.id)), el("td", {}, run.name),
      el("td", {}, run.algorithm), el("td", {}, el("span", { class: `badge ${run.state}` }, run.state)),
      el("td", {}, when(run.created_at)),
    ]);
  }
  const form = document.getElementById("launch-form");
  if (form) onSubmit(form, async () => {
    const lists = ["tasks", "policy.hidden_sizes", "buffer.offline_data"];
    const r = await api("POST", "/api/runs", readForm(form, lists, ["robots.tags"]));
    if (!r.ok) return showErrors(form, r.data);
    location.href = `/runs/${r.data.id}`;
  });
  if (form) loadOfflineSources();
  load();
};

// What a launch can mount (GET /api/offline-sources): the launch form's suggestions and table.
async function loadOfflineSources() {
  const r = await api("GET", "/api/offline-sources");
  if (!r.ok) return;
  const sources = document.getElementById("offline-sources");
  const promoted = document.getElementById("promoted-runs");
  for (const s of r.data) {
    sources.append(el("option", { value: s.name }, `${s.kind}: ${(s.tasks || []).join(", ")}`));
    if (s.kind === "run" && s.promoted) promoted.append(el("option", { value: s.name }));
  }
  fillTable("offline-sources-table", r.data, (s) => [
    el("td", {}, s.name), el("td", {}, s.kind === "run" ? `run (${s.state || "?"})` : `dataset (${s.format || "?"})`),
    el("td", {}, s.rows ?? ""), el("td", {}, s.episodes ?? ""),
    el("td", {}, (s.tasks || []).join(", ")),
  ]);
}

pages.run = () => {
  const runId = document.body.dataset.runId;
  // metric name -> its chart: a canvas plots the metric of its id, or those of data-metrics
  const charts = {};
  for (const canvas of document.querySelectorAll("canvas[id^=chart-]")) {
    const chart = new LineChart(canvas);
    for (const name of (canvas.dataset.metrics || canvas.id.slice(6)).split(" ")) charts[name] = chart;
  }
  const axis = document.getElementById("x-axis");
  axis.addEventListener("change", () => {
    for (const c of Object.values(charts)) c.setXMode(axis.value);
  });
  function showState(state, reason) {
    const badge = document.getElementById("run-state");
    badge.textContent = state;
    badge.className = `badge ${state}`;
    document.getElementById("run-reason").textContent = reason || "";
  }
  async function load() {
    const r = await api("GET", `/api/runs/${runId}`);
    if (!r.ok) return flash(errorText(r.data), "error");
    showState(r.data.state, r.data.reason);
    document.getElementById("run-algorithm").textContent = r.data.algorithm;
    document.getElementById("run-tasks").textContent = (r.data.spec.tasks || []).join(", ");
    document.getElementById("run-robots").textContent = r.data.leased_robots.join(", ") || "none leased";
    document.getElementById("run-spec").textContent = JSON.stringify(r.data.spec, null, 2);
    document.getElementById("run-reward").textContent = (r.data.spec.reward || {}).source || "robot";
    loadPromotion();
  }
  // Who scored each evaluation point (run.evaluated events) and what the run promoted on them.
  const scorers = (by) => Object.entries(by || {}).map(([k, n]) => `${k} ${n}`).join(", ") || "—";
  const evalEvents = pager("eval-events", (e) => [
    el("td", {}, when(e.created_at)), el("td", {}, e.data.policy_version ?? ""),
    el("td", {}, typeof e.data.success_mean === "number" ? e.data.success_mean.toFixed(2) : ""),
    el("td", { class: "scored-by" }, scorers(e.data.scored_by)),
  ]);
  async function loadPromotion() {
    const shown = document.getElementById("run-promotion");
    for (const kind of ["run.promoted", "run.not_promoted"]) {
      const r = await api("GET", `/api/events?${new URLSearchParams({ run_id: runId, kind, limit: "1" })}`);
      if (!r.ok || !r.data.length) continue;
      const d = r.data[0].data;
      const ev = d.evidence;
      shown.textContent = kind === "run.not_promoted" ? `none: ${d.why}`
        : `version ${d.version}` + (ev ? ` (success ${ev.success.toFixed(2)} over ${ev.episodes} episodes, scored by ${scorers(ev.scored_by)})` : ` (${d.by || "manual"})`);
      return;
    }
  }
  // The run's robots now, and the events of robots joining, leaving, assigned or refusing it.
  const robotEvents = pager("robot-events", (e) => [
    el("td", {}, when(e.created_at)), el("td", {}, e.kind),
    el("td", {}, e.data.robot || (e.robot_id ?? "")),
    el("td", { class: "mono" }, e.data.reason || ""),
  ]);
  async function loadRobots() {
    const r = await api("GET", `/api/robots?run_id=${encodeURIComponent(runId)}`);
    if (r.ok) {
      document.getElementById("run-robots-empty").hidden = r.data.length > 0;
      fillTable("run-robot-table", r.data, (b) => [
        el("td", {}, b.name), el("td", { class: "activity" }, activityCell(b.activity)),
        el("td", {}, computerCell(b.spec_summary)), el("td", {}, heartbeatAge(b)),
        el("td", {}, b.applied_policy_version ?? "—"),
        // A robot holding for a reset by hand (or paused by its reset timeout) waits for this.
        el("td", { class: "actions" }, canAct("operator") && (b.activity.run_state === "resetting" || b.stats.reset_paused)
          ? el("button", { onclick: () => robotReady(b) }, "Ready") : null),
      ]);
    }
    if (robotEvents.onFirstPage()) robotEvents.refresh();
    loadHumanCost();
    loadHelp();
  }
  // Help requests: figures, then open requests by risk, then the rest newest first; a bar
  // (<progress>, no inline style under the CSP) beside each wait draws it against the longest.
  async function loadHelp() {
    const r = await api("GET", `/api/runs/${runId}/help/summary`);
    if (!r.ok) return;
    const f = r.data.figures;
    const secs = (v) => (v === null || v === undefined ? "—" : `${Number(v).toFixed(1)} s`);
    document.getElementById("help-figures").textContent =
      `${f.requests} requests: ${f.open} open, ${f.answered} answered (${f.took_over} taken over), ` +
      `${f.expired} expired; median wait ${secs(f.median_wait_s)}, longest ${secs(f.max_wait_s)}.`;
    const rows = [...r.data.recent].sort((a, b) =>
      (a.outcome === null) !== (b.outcome === null) ? (a.outcome === null ? -1 : 1)
        : a.outcome === null ? b.risk - a.risk : 0);
    const longest = Math.max(1e-9, ...rows.map((q) => q.wait_s ?? 0));
    fillTable("help-requests", rows, (q) => [
      el("td", {}, q.robot_name || `robot ${q.robot_id}`), el("td", {}, `${q.episode_index} · ${q.step}`),
      el("td", {}, Number(q.risk).toFixed(2)), el("td", {}, new Date(q.requested_at).toLocaleTimeString()),
      el("td", {}, q.outcome ?? "waiting"),
      el("td", {}, q.wait_s === null ? "—" : [Number(q.wait_s).toFixed(1), " ",
        el("progress", { max: String(longest), value: String(q.wait_s), title: "wait against the longest" })]),
      el("td", {}, q.answered_by || "—"), el("td", {}, q.takeover_steps), el("td", {}, q.label || "—"),
      el("td", { class: "actions" }, canAct("operator") && q.outcome === null
        ? el("button", { onclick: () => answerHelp(q) }, "Dismiss") : null),
    ]);
  }
  async function answerHelp(q) {
    const r = await api("POST", `/api/runs/${runId}/help/${q.id}/answer`, { outcome: "dismissed" });
    flash(r.ok ? `help request ${q.id}: dismissed` : errorText(r.data), r.ok ? "info" : "error");
    loadHelp();
  }
  async function robotReady(robot) {
    const r = await api("POST", `/api/robots/${robot.id}/ready`);
    flash(r.ok ? `${robot.name}: ready` : errorText(r.data), r.ok ? "info" : "error");
  }
  async function loadHumanCost() {
    const r = await api("GET", `/api/runs/${runId}/human-cost`);
    if (!r.ok) return;
    document.getElementById("human-cost-source").textContent =
      r.data.source === "report" ? "from the run's report" : "live, from the robots' heartbeats";
    const num = (v, digits) => (v === null || v === undefined ? "—" : Number(v).toFixed(digits));
    const rows = [];
    for (const [robot, tasks] of Object.entries(r.data.robots)) for (const [task, c] of Object.entries(tasks)) rows.push([robot, task, c]);
    for (const [task, c] of Object.entries(r.data.tasks)) rows.push(["all robots", task, c]);
    if (rows.length) rows.push(["all robots", "all tasks", r.data.total]);
    fillTable("human-cost", rows, ([robot, task, c]) => [
      el("td", {}, robot), el("td", {}, task), el("td", {}, num(c.takeover_s, 1)),
      el("td", {}, num(c.labels, 0)), el("td", {}, num(c.resets, 0)), el("td", {}, num(c.reset_s, 1)),
      el("td", {}, num(c.episode_s, 1)), el("td", {}, num(c.autonomous_successes, 0)),
      el("td", {}, num(c.successes_per_hour_excl_resets, 1)),
      el("td", {}, num(c.successes_per_hour_incl_resets, 1)),
    ]);
  }
  robotEvents.load("/api/events", { run_id: runId, kind: "robot." });
  evalEvents.load("/api/events", { run_id: runId, kind: "run.evaluated" });
  for (const button of document.querySelectorAll("button[data-action]")) {
    button.addEventListener("click", async () => {
      const r = await api("POST", `/api/runs/${runId}/${button.dataset.action}`);
      flash(r.ok ? `${button.textContent}: done` : errorText(r.data), r.ok ? "info" : "error");
      if (r.ok) showState(r.data.state, r.data.reason);
    });
  }
  const status = document.getElementById("stream-status");
  const source = new EventSource(`/api/runs/${runId}/stream`);
  source.addEventListener("open", () => { status.textContent = "connected"; });
  source.addEventListener("error", () => { status.textContent = "reconnecting…"; });
  source.addEventListener("run", (ev) => { const d = JSON.parse(ev.data); showState(d.state, d.reason); });
  source.addEventListener("metrics", (ev) => {
    const touched = new Set();
    for (const p of JSON.parse(ev.data)) {
      const chart = charts[p.name];
      if (!chart) continue;
      const series = p.task || (p.robot_id !== null ? `robot ${p.robot_id}` : p.name);
      chart.add(series, p.step, p.value, p.wall_time);
      touched.add(chart);
    }
    // One wall-time origin for every chart: the run's first point.
    const origin = Math.min(...Object.values(charts).map((c) => c.firstWall()));
    for (const c of Object.values(charts)) c.wallOrigin = origin;
    for (const c of touched) c.draw();
  });
  load();
  loadRobots();
  setInterval(loadRobots, 5000);
};

pages.policies = () => {
  const form = document.getElementById("policy-filter");
  const params = new URLSearchParams(location.search);
  form.run_id.value = params.get("run_id") || "";
  const versions = pager("versions", (v) => [
    el("td", {}, el("a", { href: `/runs/${v.run_id}` }, v.run_id)), el("td", {}, v.version),
    el("td", {}, v.learner_step), el("td", {}, `${(v.num_bytes / 1e6).toFixed(2)} MB`),
    el("td", { class: "mono" }, v.sha256.slice(0, 12)), el("td", {}, when(v.created_at)),
    el("td", {}, v.promoted ? "promoted" : ""),
    el("td", {}, canAct("operator") && !v.promoted
      ? el("button", { class: "secondary", onclick: async () => {
          const r = await api("POST", `/api/policy-versions/${v.id}/promote`);
          flash(r.ok ? `version ${v.version} promoted` : errorText(r.data), r.ok ? "info" : "error");
          versions.refresh();
        } }, "Promote") : null),
  ]);
  const checkpoints = pager("checkpoints", (c) => [
    el("td", {}, c.run_id), el("td", {}, c.learner_step), el("td", {}, c.policy_version),
    el("td", {}, when(c.created_at)),
    el("td", {}, el("a", { href: `/api/checkpoints/${c.id}/download` }, "Download")),
  ]);
  function load() {
    const filters = {};
    for (const name of ["run_id", "min_version", "max_version", "promoted"]) {
      if (form[name].value.trim()) filters[name] = form[name].value.trim();
    }
    versions.load("/api/policy-versions", filters);
    checkpoints.load("/api/checkpoints", filters.run_id ? { run_id: filters.run_id } : {});
  }
  form.addEventListener("submit", (ev) => { ev.preventDefault(); load(); });
  load();
};

pages.audit = () => {
  const form = document.getElementById("audit-filter");
  const params = new URLSearchParams(location.search);
  form.run_id.value = params.get("run_id") || "";
  const events = pager("events", (e) => [
    el("td", {}, when(e.created_at)), el("td", {}, e.kind), el("td", {}, e.actor),
    el("td", {}, e.run_id || ""), el("td", {}, e.robot_id ?? ""),
    el("td", { class: "mono" }, Object.keys(e.data).length ? JSON.stringify(e.data) : ""),
  ], 100);
  function load() {
    const q = {};
    if (form.run_id.value.trim()) q.run_id = form.run_id.value.trim();
    if (form.kind.value.trim()) q.kind = form.kind.value.trim();
    events.load("/api/events", q);
  }
  form.addEventListener("submit", (ev) => { ev.preventDefault(); load(); });
  load();
};

pages.account = () => {
  const form = document.getElementById("token-form");
  async function load() {
    const r = await api("GET", "/api/tokens");
    if (r.ok) fillTable("api-tokens", r.data, (t) => [
      el("td", {}, t.name), el("td", {}, when(t.created_at)), el("td", {}, when(t.expires_at)),
      el("td", {}, when(t.last_used_at)), el("td", {}, when(t.revoked_at)),
      el("td", {}, t.revoked_at ? null : el("button", { class: "danger", onclick: async () => {
        await api("DELETE", `/api/tokens/${t.id}`); load();
      } }, "Revoke")),
    ]);
  }
  onSubmit(form, async () => {
    const r = await api("POST", "/api/tokens", readForm(form, [], []));
    if (!r.ok) return showErrors(form, r.data);
    const out = document.getElementById("new-token");
    out.textContent = `New token (shown once): ${r.data.token}`;
    out.hidden = false;
    load();
  });
  const pw = document.getElementById("password-form");
  onSubmit(pw, async () => {
    const r = await api("POST", "/api/auth/password", readForm(pw, [], []));
    if (!r.ok) return showErrors(pw, r.data);
    pw.reset();
    flash("password changed", "info");
  });
  load();
};

pages.users = () => {
  const form = document.getElementById("user-form");
  async function load() {
    const r = await api("GET", "/api/users");
    if (r.ok) fillTable("users", r.data, (u) => [
      el("td", {}, u.username), el("td", {}, u.role), el("td", {}, u.disabled ? "yes" : "no"),
      el("td", {}, when(u.created_at)),
      el("td", {}, el("button", { class: "secondary", onclick: async () => {
        const r2 = await api("PATCH", `/api/users/${u.id}`, { disabled: !u.disabled });
        if (!r2.ok) flash(errorText(r2.data), "error");
        load();
      } }, u.disabled ? "Enable" : "Disable")),
    ]);
  }
  onSubmit(form, async () => {
    const r = await api("POST", "/api/users", readForm(form, [], []));
    if (!r.ok) return showErrors(form, r.data);
    form.reset();
    load();
  });
  load();
};

document.addEventListener("DOMContentLoaded", () => {
  const logout = document.getElementById("logout");
  if (logout) logout.addEventListener("click", async () => {
    await api("POST", "/api/auth/logout");
    location.href = "/login";
  });
  const page = pages[document.body.dataset.page];
  if (page) page();
});
