// A small line chart on <canvas>: several named series, linear axes named with their units, a
// legend. No libraries. The canvas names its axes: data-x-label (what a point's step counts:
// env steps, learner updates, policy version) and data-y-label (the value and its unit); in
// wall-time mode the horizontal axis is the time since wallOrigin (epoch seconds), in seconds
// while the points span under 3 minutes, else in minutes.
"use strict";

const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777"];

class LineChart {
  constructor(canvas, maxPoints = 2000) {
    this.canvas = canvas;
    this.maxPoints = maxPoints; // per series; older points are dropped
    this.series = new Map(); // name -> [[step, y, wall], ...] sorted by step
    this.xMode = "step"; // or "wall"
    this.wallOrigin = Infinity;
    this.stepLabel = canvas.dataset.xLabel || "step";
    this.yLabel = canvas.dataset.yLabel || "value";
    this.canvas.dataset.points = "0";
    this.draw();
  }

  add(name, x, y, wall = NaN) {
    if (!Number.isFinite(x) || !Number.isFinite(y)) return;
    let pts = this.series.get(name);
    if (!pts) this.series.set(name, (pts = []));
    if (pts.length && pts[pts.length - 1][0] > x) {
      pts.push([x, y, wall]);
      pts.sort((a, b) => a[0] - b[0]);
    } else pts.push([x, y, wall]);
    if (pts.length > this.maxPoints) pts.splice(0, pts.length - this.maxPoints);
  }

  count() {
    let n = 0;
    for (const pts of this.series.values()) n += pts.length;
    return n;
  }

  // Earliest wall time of any point (Infinity when none has one).
  firstWall() {
    let t = Infinity;
    for (const pts of this.series.values()) for (const p of pts) if (Number.isFinite(p[2])) t = Math.min(t, p[2]);
    return t;
  }

  setXMode(mode) {
    this.xMode = mode;
    this.draw();
  }

  xLabel() {
    if (this.xMode !== "wall") return this.stepLabel;
    return `wall time (${this.wallUnit() === 60 ? "min" : "s"} since the run's first point)`;
  }

  origin() {
    return Number.isFinite(this.wallOrigin) ? this.wallOrigin : this.firstWall();
  }

  // Seconds per unit of the wall-time axis: 1 while the points span under 3 minutes, else 60.
  wallUnit() {
    let last = -Infinity;
    for (const pts of this.series.values()) for (const p of pts) if (Number.isFinite(p[2])) last = Math.max(last, p[2]);
    return last - this.origin() < 180 ? 1 : 60;
  }

  // The series as [x, y] in the current mode, sorted by x.
  points(pts) {
    if (this.xMode === "step") return pts.map(([s, y]) => [s, y]);
    const origin = this.origin(), unit = this.wallUnit();
    return pts.filter((p) => Number.isFinite(p[2])).map(([, y, w]) => [(w - origin) / unit, y]).sort((a, b) => a[0] - b[0]);
  }

  draw() {
    const c = this.canvas;
    const ctx = c.getContext("2d");
    const W = c.width, H = c.height, L = 64, R = 12, T = 12, B = 58;
    ctx.clearRect(0, 0, W, H);
    ctx.font = "11px system-ui, sans-serif";
    ctx.fillStyle = "#6b7280";
    c.dataset.points = String(this.count());
    c.dataset.series = [...this.series.keys()].join(" ");
    c.dataset.xAxis = this.xLabel();
    c.dataset.yAxis = this.yLabel;
    this.axisTitles(ctx, W, H, L, B);
    const series = [...this.series].map(([name, pts]) => [name, this.points(pts)]);
    if (!series.some(([, pts]) => pts.length)) {
      ctx.fillText("no data yet", W / 2 - 28, H / 2);
      return;
    }
    let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
    for (const [, pts] of series) for (const [x, y] of pts) {
      x0 = Math.min(x0, x); x1 = Math.max(x1, x); y0 = Math.min(y0, y); y1 = Math.max(y1, y);
    }
    if (x1 === x0) { x0 -= 1; x1 += 1; }
    if (y1 === y0) { const d = Math.abs(y0) * 0.1 || 1; y0 -= d; y1 += d; }
    const sx = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
    const sy = (y) => H - B - ((y - y0) / (y1 - y0)) * (H - T - B);
    // axes and 5 ticks each
    ctx.strokeStyle = "#d1d5db";
    ctx.beginPath();
    for (let i = 0; i <= 4; i++) {
      const y = y0 + ((y1 - y0) * i) / 4, py = sy(y);
      ctx.moveTo(L, py); ctx.lineTo(W - R, py);
      ctx.fillText(fmt(y), 16, py + 4);
      const x = x0 + ((x1 - x0) * i) / 4;
      ctx.textAlign = i === 0 ? "left" : i === 4 ? "right" : "center";
      ctx.fillText(fmt(x), sx(x), H - B + 14);
    }
    ctx.textAlign = "left";
    ctx.stroke();
    let i = 0, legendX = L;
    for (const [name, pts] of series) {
      const color = PALETTE[i++ % PALETTE.length];
      ctx.strokeStyle = color;
      ctx.lineWidth = 1.5;
      ctx.beginPath();
      pts.forEach(([x, y], k) => (k ? ctx.lineTo(sx(x), sy(y)) : ctx.moveTo(sx(x), sy(y))));
      ctx.stroke();
      if (pts.length === 1) ctx.fillRect(sx(pts[0][0]) - 2, sy(pts[0][1]) - 2, 4, 4);
      ctx.fillStyle = color;
      ctx.fillRect(legendX, H - 10, 10, 3);
      ctx.fillText(name, legendX + 14, H - 5);
      legendX += 24 + ctx.measureText(name).width;
      ctx.fillStyle = "#6b7280";
    }
    ctx.lineWidth = 1;
  }

  // The horizontal axis's name under its ticks, the vertical one's along the left edge.
  axisTitles(ctx, W, H, L, B) {
    ctx.save();
    ctx.fillStyle = "#374151";
    ctx.textAlign = "center";
    ctx.fillText(this.xLabel(), L + (W - L) / 2, H - B + 30);
    ctx.translate(10, (H - B) / 2);
    ctx.rotate(-Math.PI / 2);
    ctx.fillText(this.yLabel, 0, 0);
    ctx.restore();
  }
}

function fmt(v) {
  const a = Math.abs(v);
  if (a >= 1e6) return (v / 1e6).toFixed(1) + "M";
  if (a >= 1e3) return (v / 1e3).toFixed(1) + "k";
  if (a >= 10 || a === 0) return v.toFixed(0);
  if (a < 0.01) return v.toExponential(1);
  return v.toPrecision(2);
}

window.LineChart = LineChart;
