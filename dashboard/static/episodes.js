// The run page's episode viewer: the run's episodes (/api/runs/<id>/episodes), one episode's
// frames on a scrubber or played at the robot's rate, its state and action traces with the
// intervention steps shaded and help requests marked, and its label buttons.
"use strict";

const TRACE_COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777"];
const MAX_ACTION_CHARTS = 8; // more action dims share the last chart

// One small trace chart: lines over frame indices, intervention segments shaded, help
// requests as dashed verticals, the selected step as a cursor. Data attributes say what it drew.
function drawTrace(canvas, ep, names, values, cursor) {
  const ctx = canvas.getContext("2d");
  const W = canvas.width, H = canvas.height, L = 48, R = 8, T = 8, B = 22;
  const xs = ep.frame_index;
  ctx.clearRect(0, 0, W, H);
  ctx.font = "10px system-ui, sans-serif";
  if (!xs.length) return;
  let y0 = Infinity, y1 = -Infinity;
  for (const row of values) for (const v of row) { y0 = Math.min(y0, v); y1 = Math.max(y1, v); }
  if (y1 === y0) { const d = Math.abs(y0) * 0.1 || 1; y0 -= d; y1 += d; }
  const x0 = xs[0], x1 = Math.max(xs[xs.length - 1], x0 + 1);
  const sx = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const sy = (y) => H - B - ((y - y0) / (y1 - y0)) * (H - T - B);
  ctx.fillStyle = "rgba(234, 88, 12, 0.18)";
  for (const [a, b] of ep.intervention_segments) ctx.fillRect(sx(a - 0.5), T, Math.max(sx(b + 0.5) - sx(a - 0.5), 2), H - T - B);
  ctx.strokeStyle = "#dc2626";
  ctx.setLineDash([3, 3]);
  ctx.beginPath();
  for (const h of ep.help_requests) { ctx.moveTo(sx(h.step), T); ctx.lineTo(sx(h.step), H - B); }
  ctx.stroke();
  ctx.setLineDash([]);
  ctx.fillStyle = "#6b7280";
  ctx.fillText(fmt(y1), 2, T + 8);
  ctx.fillText(fmt(y0), 2, H - B);
  ctx.fillText(String(x0), L, H - 6);
  ctx.textAlign = "right";
  ctx.fillText(String(xs[xs.length - 1]), W - R, H - 6);
  ctx.textAlign = "left";
  names.forEach((name, d) => {
    ctx.strokeStyle = TRACE_COLORS[d % TRACE_COLORS.length];
    ctx.beginPath();
    xs.forEach((x, i) => (i ? ctx.lineTo(sx(x), sy(values[i][d])) : ctx.moveTo(sx(x), sy(values[i][d]))));
    ctx.stroke();
  });
  ctx.strokeStyle = "#111827";
  ctx.beginPath();
  ctx.moveTo(sx(cursor), T); ctx.lineTo(sx(cursor), H - B);
  ctx.stroke();
  canvas.dataset.segments = String(ep.intervention_segments.length);
  canvas.dataset.helps = String(ep.help_requests.length);
  canvas.dataset.points = String(xs.length);
}

function episodeViewer() {
  const runId = document.body.dataset.runId;
  const LIMIT = 20;
  let offset = 0;
  let current = null; // the episode shown
  let timer = null;
  const traces = []; // [canvas, names, values]
  const $ = (id) => document.getElementById(id);
  const scrub = $("episode-scrubber"), img = $("episode-frame"), camera = $("episode-camera");

  async function loadList() {
    const r = await api("GET", `/api/runs/${runId}/episodes?offset=${offset}&limit=${LIMIT}`);
    const body = document.querySelector("#episodes tbody");
    if (!r.ok) { body.replaceChildren(el("tr", {}, el("td", { colspan: 8 }, errorText(r.data)))); return; }
    const total = Number(r.headers.get("X-Total-Count") || 0);
    body.replaceChildren(...r.data.map((e) => {
      const key = `${e.robot_id}/${e.episode_index}`;
      const selected = current && key === `${current.robot_id}/${current.episode_index}`;
      return el("tr", { dataset: { key }, class: selected ? "selected" : null },
        el("td", {}, e.robot), el("td", {}, e.episode_index, e.deleted_steps ? " (partly deleted)" : ""),
        el("td", {}, e.task), el("td", {}, e.steps), el("td", {}, e.interventions), el("td", {}, e.help_requests),
        el("td", {}, e.label || "—", e.label_by ? ` (${e.label_by})` : ""),
        el("td", {}, el("button", { class: "secondary", onclick: () => open(e.robot_id, e.episode_index) }, "Open")));
    }));
    $("episodes-page").textContent = total ? `${offset + 1}–${offset + r.data.length} of ${total}` : "no episodes stored yet";
    $("episodes-newer").disabled = offset === 0;
    $("episodes-older").disabled = offset + LIMIT >= total;
  }

  function frameUrl(i) {
    return current.frame_url.replace("{frame_index}", String(current.frame_index[i])).replace("{camera}", encodeURIComponent(camera.value));
  }

  function show(i) {
    scrub.value = String(i);
    const f = current.frame_index[i];
    $("episode-step").textContent = `${f} (t = ${current.timestamp[i].toFixed(2)} s)`;
    const marks = [];
    if (current.is_intervention[i]) marks.push("a person acted");
    const help = current.help_requests.filter((h) => h.step === f);
    for (const h of help) marks.push(`help requested (risk ${h.risk.toFixed(2)}, ${h.outcome || "open"})`);
    $("episode-status").textContent = marks.join(" · ") || "policy acted";
    if (camera.value) { img.src = frameUrl(i); img.dataset.frame = String(f); img.hidden = false; }
    for (const [canvas, names, values] of traces) drawTrace(canvas, current, names, values, f);
  }

  function stop() {
    if (timer) clearTimeout(timer);
    timer = null;
    $("episode-play").textContent = "Play";
  }

  function play() {
    if (timer) return stop();
    $("episode-play").textContent = "Pause";
    const tick = () => {
      const i = Number(scrub.value);
      if (i + 1 >= current.frame_index.length) return stop();
      show(i + 1);
      const dt = current.timestamp[i + 1] - current.timestamp[i];
      timer = setTimeout(tick, Math.min(Math.max(Number.isFinite(dt) ? dt * 1000 : 100, 10), 1000));
    };
    tick();
  }

  function chart(title, names, values) {
    const canvas = el("canvas", { width: 420, height: 140, dataset: { trace: title } });
    traces.push([canvas, names, values]);
    return el("figure", {}, el("figcaption", {}, title), canvas);
  }

  async function open(robotId, episode) {
    stop();
    const r = await api("GET", `/api/runs/${runId}/episodes/${encodeURIComponent(robotId)}/${episode}`);
    if (!r.ok) return flash(errorText(r.data), "error");
    current = r.data;
    const view = $("episode-view");
    view.hidden = false;
    view.dataset.key = `${current.robot_id}/${current.episode_index}`;
    $("episode-title").textContent = `${current.robot} · episode ${current.episode_index} · ${current.task} · ${current.steps} steps`;
    $("episode-note").textContent = current.note;
    $("episode-note").hidden = !current.note;
    showLabel(current.label, current.label_by);
    camera.replaceChildren(...current.cameras.map((c) => el("option", { value: c }, c.replace("observation.images.", ""))));
    img.hidden = !current.cameras.length;
    scrub.max = String(Math.max(current.frame_index.length - 1, 0));
    traces.length = 0;
    const figs = [chart(`state (${current.state_features.join(", ")})`, (current.state[0] || []).map((_, d) => `s${d}`), current.state)];
    const dims = (current.action[0] || []).length;
    for (let d = 0; d < Math.min(dims, MAX_ACTION_CHARTS); d++) {
      const rest = d === MAX_ACTION_CHARTS - 1 ? Array.from({ length: dims - d }, (_, k) => d + k) : [d];
      figs.push(chart(`action ${rest.join(", ")}`, rest.map((k) => `a${k}`), current.action.map((row) => rest.map((k) => row[k]))));
    }
    $("episode-traces").replaceChildren(...figs);
    show(0);
    for (const tr of document.querySelectorAll("#episodes tbody tr")) tr.classList.toggle("selected", tr.dataset.key === view.dataset.key);
  }

  function showLabel(label, by) {
    const badge = $("episode-label");
    badge.textContent = label || "none";
    badge.className = `badge ${label || ""}`;
    $("episode-label-by").textContent = by ? `by ${by}` : "";
  }

  for (const button of document.querySelectorAll("#episode-view button[data-label]")) {
    button.addEventListener("click", async () => {
      if (!current) return;
      const r = await api("POST", `/api/runs/${runId}/episodes/${encodeURIComponent(current.robot_id)}/${current.episode_index}/label`, { label: button.dataset.label });
      if (!r.ok) return flash(errorText(r.data), "error");
      current.label = r.data.label;
      current.label_by = r.data.label_by;
      showLabel(current.label, current.label_by);
      flash(`episode ${current.episode_index} labelled ${r.data.label}`, "info");
      loadList();
    });
  }
  scrub.addEventListener("input", () => { stop(); show(Number(scrub.value)); });
  camera.addEventListener("change", () => show(Number(scrub.value)));
  $("episode-play").addEventListener("click", play);
  $("episodes-newer").addEventListener("click", () => { offset = Math.max(0, offset - LIMIT); loadList(); });
  $("episodes-older").addEventListener("click", () => { offset += LIMIT; loadList(); });
  loadList();
}

document.addEventListener("DOMContentLoaded", () => {
  if (document.body.dataset.page === "run" && document.getElementById("episodes")) episodeViewer();
});
