// The operator station (/station): robots' frames and states; a takeover from the keyboard or
// a gamepad, sent at 20 Hz through /api/station (see dashboard/api/station.py).
"use strict";

pages.station = () => {
  const TICK_MS = 50; // 20 Hz: the commands are also the robot's heartbeat
  const ECHO_WAIT_MS = 250;
  const MAX_IN_FLIGHT = 3;
  const KEYS = { KeyD: [0, 1], KeyA: [0, -1], KeyW: [1, 1], KeyS: [1, -1], KeyQ: [2, 1], KeyE: [2, -1] };
  const grid = document.getElementById("station-grid");
  const cards = new Map(); // robot id -> {card, img, badge, success}
  let robots = [];
  let selected = null;
  const held = new Set();
  let keyDeadman = false;
  let gripper = null; // null: the robot keeps its gripper as it was; G sets closed / open
  let wasDriving = false;
  let counter = 0;
  const idBase = Date.now() * 1000; // ids grow across pages: the robot drops older ones
  let inFlight = 0;
  const rtts = [];

  const $ = (id) => document.getElementById(id);

  function card(robot) {
    let c = cards.get(robot.id);
    if (c) return c;
    const img = el("img", { alt: `${robot.name} camera`, "data-robot": robot.name, hidden: true });
    const badge = el("span", { class: "badge" });
    const success = el("span", { class: "muted" });
    const node = el("div", { class: "station-robot", "data-robot-id": String(robot.id),
      onclick: () => select(robot.id) },
    img, el("div", { class: "name" }, robot.name), badge, " ", success);
    grid.append(node);
    c = { card: node, img, badge, success };
    cards.set(robot.id, c);
    return c;
  }

  async function refresh() {
    const r = await api("GET", "/api/station/robots");
    if (!r.ok) { flash(errorText(r.data), "error"); return; }
    robots = r.data;
    $("station-empty").hidden = robots.length > 0;
    for (const robot of robots) {
      const c = card(robot);
      c.badge.textContent = robot.state.replaceAll("_", " ");
      c.badge.className = "badge " + robot.state;
      c.card.dataset.state = robot.state;
      c.success.textContent = robot.autonomous_episodes
        ? `${robot.autonomous_successes}/${robot.autonomous_episodes} autonomous successes` : "";
      if (robot.frame_age_s !== null) {
        c.img.src = `/api/station/robots/${robot.id}/frame?t=${Date.now()}`;
        c.img.hidden = false; // no frame yet: no broken image
      }
      if (robot.id === selected) {
        $("drive-state").textContent = robot.state.replaceAll("_", " ");
        $("drive-state").className = "badge " + robot.state;
        $("drive-note").textContent = robot.note ? `last takeover ended: ${robot.note}` : "";
      }
    }
  }

  function select(id) {
    if (selected !== null && selected !== id) release();
    selected = id;
    for (const [rid, c] of cards) c.card.classList.toggle("selected", rid === id);
    const robot = robots.find((r) => r.id === id);
    $("drive-name").textContent = robot ? robot.name : String(id);
    $("station-drive").hidden = false;
  }

  function pad() {
    const pads = navigator.getGamepads ? navigator.getGamepads() : [];
    return Array.from(pads || []).find((p) => p && p.connected) || null;
  }

  function readInput() {
    const axes = [0, 0, 0];
    for (const code of held) {
      const [dim, sign] = KEYS[code];
      axes[dim] += sign;
    }
    let deadman = keyDeadman;
    const gp = pad();
    if (gp) {
      const dz = (v) => (Math.abs(v) < 0.1 ? 0 : v);
      if (gp.buttons[4] && gp.buttons[4].pressed) deadman = true;
      axes[0] += dz(gp.axes[0] || 0);
      axes[1] -= dz(gp.axes[1] || 0);
      axes[2] -= dz(gp.axes[3] || 0);
      if (gp.buttons[5] && gp.buttons[5].pressed) gripper = 1;
    }
    if (gripper !== null) axes.push(gripper);
    return { axes: axes.map((v) => Math.max(-1, Math.min(1, v))), deadman };
  }

  function showRtt() {
    if (!rtts.length) return;
    const sorted = [...rtts].sort((a, b) => a - b);
    $("drive-rtt").textContent = `${sorted[Math.floor(sorted.length / 2)].toFixed(1)} ms`;
    $("drive-rtt-n").textContent = String(rtts.length);
  }

  async function send(extra, force) {
    if (selected === null) return;
    if (inFlight >= MAX_IN_FLIGHT && !force) return; // the next tick carries the newest state
    const input = readInput();
    const body = { id: idBase + ++counter, axes: input.axes, deadman: input.deadman,
      wait_echo_ms: input.deadman ? ECHO_WAIT_MS : 0, ...extra };
    $("drive-deadman").textContent = input.deadman ? "held" : "released";
    $("drive-deadman").className = "badge" + (input.deadman ? " held-on" : "");
    const t0 = performance.now();
    inFlight++;
    try {
      const r = await api("POST", `/api/station/robots/${selected}/command`, body);
      if (!r.ok) { flash(errorText(r.data), "error"); return; }
      if (r.data.echoed && input.deadman) {
        rtts.push(performance.now() - t0);
        if (rtts.length > 50) rtts.shift();
        showRtt();
      }
    } finally {
      inFlight--;
    }
  }

  function tick() {
    if (selected === null) return;
    const driving = readInput().deadman;
    if (driving || wasDriving) send({}, !driving); // the release itself is always sent
    wasDriving = driving;
  }

  function release() {
    held.clear();
    keyDeadman = false;
    if (selected !== null && wasDriving) send({}, true);
    wasDriving = false;
  }

  function onKey(down) {
    return (e) => {
      if (selected === null || e.target.closest("input, select, textarea")) return;
      if (e.key === "Shift") keyDeadman = down;
      else if (KEYS[e.code]) { if (down) held.add(e.code); else held.delete(e.code); }
      else if (e.code === "KeyG" && down && !e.repeat) gripper = gripper === 1 ? -1 : 1;
      else return;
      e.preventDefault();
      if (e.repeat) return;
      send({}, true); // a key change goes out now, not at the next tick
      wasDriving = readInput().deadman;
    };
  }
  document.addEventListener("keydown", onKey(true));
  document.addEventListener("keyup", onKey(false));
  window.addEventListener("blur", release);
  // The page goes away: the deadman is released (the robot also holds on its own when the
  // commands stop). keepalive lets the request outlive the page.
  window.addEventListener("pagehide", () => {
    if (selected === null) return;
    fetch(`/api/station/robots/${selected}/command`, {
      method: "POST", keepalive: true, credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-CSRF-Token": cookie("robofleet_csrf") },
      body: JSON.stringify({ id: idBase + ++counter, axes: [], deadman: false }),
    });
  });

  async function robotAction(path, what) {
    if (selected === null) return;
    const r = await api("POST", path);
    flash(r.ok ? `${what}: sent` : errorText(r.data), r.ok ? "info" : "error");
    refresh();
  }
  $("drive-success").addEventListener("click", () => send({ label: "success" }, true));
  $("drive-failure").addEventListener("click", () => send({ label: "failure" }, true));
  $("drive-rerecord").addEventListener("click", () => robotAction(`/api/robots/${selected}/rerecord`, "rerecord"));
  $("drive-discard").addEventListener("click", () => robotAction(`/api/robots/${selected}/discard`, "discard"));
  $("drive-ready").addEventListener("click", () => robotAction(`/api/robots/${selected}/ready`, "reset done"));
  $("drive-resume").addEventListener("click", () => robotAction(`/api/station/robots/${selected}/resume`, "resume"));
  $("drive-close").addEventListener("click", () => {
    release();
    selected = null;
    for (const c of cards.values()) c.card.classList.remove("selected");
    $("station-drive").hidden = true;
  });

  // Help requests: every leased run's queue (GET /api/runs/{run}/help/queue), merged by risk.
  let myHelp = null; // {run_id, id} of the request assigned to this person
  async function helpQueue() {
    const runs = [...new Set(robots.map((r) => r.run_id).filter(Boolean))];
    const rows = [];
    for (const run of runs) {
      const r = await api("GET", `/api/runs/${run}/help/queue`);
      if (r.ok) rows.push(...r.data.queue);
    }
    rows.sort((a, b) => b.risk - a.risk || a.requested_at.localeCompare(b.requested_at));
    const me = `user:${document.body.dataset.user || ""}`; // the actor the API records (dashboard.accounts)
    myHelp = rows.find((q) => q.assigned_to && q.assigned_to === me) || myHelp;
    if (myHelp && !rows.some((q) => q.id === myHelp.id)) myHelp = null;
    $("drive-help-done").hidden = !myHelp;
    const firstOpen = new Set();
    $("station-help-empty").hidden = rows.length > 0;
    $("station-help-table").hidden = rows.length === 0;
    fillTable("station-help-table", rows, (q) => {
      const takeable = !q.assigned_to && !myHelp && !firstOpen.has(q.run_id);
      if (!q.assigned_to) firstOpen.add(q.run_id); // take gives a run's top waiting request
      const waited = Math.max(0, (Date.now() - Date.parse(q.requested_at)) / 1000);
      return [
        el("td", {}, q.robot_name || String(q.robot_id)), el("td", {}, q.run_id),
        el("td", {}, q.risk.toFixed(2)), el("td", {}, `${waited.toFixed(0)} s`),
        el("td", {}, q.assigned_to || "waiting"),
        el("td", { class: "actions" }, [
          takeable ? el("button", { onclick: () => takeHelp(q.run_id) }, "Take") : null,
          !q.answered_at && (!q.assigned_to || q.assigned_to === me)
            ? el("button", { class: "secondary", onclick: () => answerHelp(q, "dismissed") }, "Dismiss") : null,
        ]),
      ];
    });
  }
  async function answerHelp(q, outcome) {
    const r = await api("POST", `/api/runs/${q.run_id}/help/${q.id}/answer`, { outcome });
    if (!r.ok) flash(errorText(r.data), "error");
    helpQueue();
  }
  async function takeHelp(run) {
    const r = await api("POST", `/api/runs/${run}/help/take`);
    if (!r.ok) { flash(errorText(r.data), "error"); return; }
    const q = r.data.request;
    if (!q) { flash("no request waits", "info"); helpQueue(); return; }
    myHelp = { run_id: run, id: q.id };
    await answerHelp(q, "took_over"); // the robot stops waiting: the person drives it now
    select(q.robot_id);
  }
  $("drive-help-done").addEventListener("click", async () => {
    if (!myHelp) return;
    const r = await api("POST", `/api/runs/${myHelp.run_id}/help/done`);
    if (!r.ok) flash(errorText(r.data), "error");
    myHelp = null;
    helpQueue();
  });

  setInterval(helpQueue, 1000);
  setInterval(tick, TICK_MS);
  setInterval(refresh, 500);
  refresh();
};
