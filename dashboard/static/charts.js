// A small line chart on <canvas>: several named series, linear axes, a legend. No libraries.
"use strict";

const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777"];

class LineChart {
  constructor(canvas, maxPoints = 2000) {
    this.canvas = canvas;
    this.maxPoints = maxPoints; // per series; older points are dropped
    this.series = new Map(); // name -> [[x, y], ...] sorted by x
    this.canvas.dataset.points = "0";
    this.draw();
  }

  add(name, x, y) {
    if (!Number.isFinite(x) || !Number.isFinite(y)) return;
    let pts = this.series.get(name);
    if (!pts) this.series.set(name, (pts = []));
    if (pts.length && pts[pts.length - 1][0] > x) {
      pts.push([x, y]);
      pts.sort((a, b) => a[0] - b[0]);
    } else pts.push([x, y]);
    if (pts.length > this.maxPoints) pts.splice(0, pts.length - this.maxPoints);
  }

  count() {
    let n = 0;
    for (const pts of this.series.values()) n += pts.length;
    return n;
  }

  draw() {
    const c = this.canvas;
    const ctx = c.getContext("2d");
    const W = c.width, H = c.height, L = 56, R = 12, T = 12, B = 40;
    ctx.clearRect(0, 0, W, H);
    ctx.font = "11px system-ui, sans-serif";
    ctx.fillStyle = "#6b7280";
    c.dataset.points = String(this.count());
    c.dataset.series = [...this.series.keys()].join(" ");
    if (!this.count()) {
      ctx.fillText("no data yet", W / 2 - 28, H / 2);
      return;
    }
    let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
    for (const pts of this.series.values()) for (const [x, y] of pts) {
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
      ctx.fillText(fmt(y), 4, py + 4);
      const x = x0 + ((x1 - x0) * i) / 4;
      ctx.fillText(fmt(x), sx(x) - 10, H - B + 14);
    }
    ctx.stroke();
    let i = 0, legendX = L;
    for (const [name, pts] of this.series) {
      const color = PALETTE[i++ % PALETTE.length];
      ctx.strokeStyle = color;
      ctx.lineWidth = 1.5;
      ctx.beginPath();
      pts.forEach(([x, y], k) => (k ? ctx.lineTo(sx(x), sy(y)) : ctx.moveTo(sx(x), sy(y))));
      ctx.stroke();
      if (pts.length === 1) ctx.fillRect(sx(pts[0][0]) - 2, sy(pts[0][1]) - 2, 4, 4);
      ctx.fillStyle = color;
      ctx.fillRect(legendX, H - 14, 10, 3);
      ctx.fillText(name, legendX + 14, H - 9);
      legendX += 24 + ctx.measureText(name).width;
      ctx.fillStyle = "#6b7280";
    }
    ctx.lineWidth = 1;
  }
}

function fmt(v) {
  const a = Math.abs(v);
  if (a >= 1e6) return (v / 1e6).toFixed(1) + "M";
  if (a >= 1e3) return (v / 1e3).toFixed(1) + "k";
  if (a >= 10 || a === 0) return v.toFixed(0);
  return v.toPrecision(2);
}

window.LineChart = LineChart;
