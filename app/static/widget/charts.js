// The window's Metrics section: one chart per metric, with the controls TensorBoard users expect
// (smoothing, log scale, round or time axis, hover values, drag to zoom).
// Methods of the window's Widget class (mixed into it by window.js): `this` is the Widget.

import { h, svg, fmtNum, announce } from './dom.js';

export class Metrics {
  /** The controls stay the same elements across renders (a rebuild would swallow a drag or a click). */
  buildMetrics() {
    const m = (this.m = { smoothing: 0, log: false, axis: 'round', zoom: {} });
    const redraw = () => this.renderMetrics(this.state, this.state ? this.state.job || null : null);
    m.smooth = h('input', { type: 'range', min: '0', max: '0.99', step: '0.01', value: '0', 'aria-label': 'Smoothing' });
    m.smoothOut = h('output', { class: 'mono', text: '0.00' });
    m.smooth.addEventListener('input', () => {
      m.smoothing = Number(m.smooth.value);
      m.smoothOut.textContent = m.smoothing.toFixed(2);
      redraw();
    });
    m.logBox = h('input', { type: 'checkbox' });
    m.logBox.addEventListener('change', () => { m.log = m.logBox.checked; redraw(); });
    m.axisSel = h('select', { 'aria-label': 'Horizontal axis' },
      h('option', { value: 'round', text: 'Round' }), h('option', { value: 'time', text: 'Time since start' }));
    m.axisSel.addEventListener('change', () => { m.axis = m.axisSel.value; redraw(); });
    m.reset = h('button', { type: 'button', text: 'Reset zoom', disabled: true });
    m.reset.addEventListener('click', () => { m.zoom = {}; redraw(); });
    m.toolbar = h('div', { class: 'row chartbar' },
      h('label', { class: 'inline' }, 'Smoothing ', m.smooth, m.smoothOut),
      h('label', { class: 'inline' }, m.logBox, 'Log scale'),
      h('label', { class: 'inline' }, 'X axis ', m.axisSel), m.reset,
      h('span', { class: 'small muted', text: 'Drag across a chart to zoom; double-click resets.' }));
    m.charts = h('div', { class: 'charts' });
    this.sections.metrics.content.replaceChildren(m.toolbar, m.charts);
    // Charts are drawn at their width (text stays legible in a narrow window): redraw when it changes.
    m.width = 0;
    new ResizeObserver(() => { if (chartWidth(m.charts) !== m.width) redraw(); }).observe(m.charts);
  }

  renderMetrics(state, job) {
    if (!this.m) this.buildMetrics();
    const m = this.m;
    // A continued job's history (the rounds before its checkpoint, from the saved job it continued) comes first.
    const cps = job ? [...(job.history || []), ...job.checkpoints] : [];
    const metrics = (job && job.info && job.info.metrics) || [];
    if ((job && job.id) !== m.jobId) { m.jobId = job && job.id; m.zoom = {}; } // another job: its own ranges
    m.toolbar.classList.toggle('hidden', !metrics.length);
    m.reset.disabled = !Object.keys(m.zoom).length;
    m.width = chartWidth(m.charts);
    const key = job ? [m.width, job.id, cps.length, cps.map((c) => c.validationMetrics ? 1 : 0).join(''), job.info && job.info.metrics,
      m.smoothing, m.log, m.axis, m.zoom] : null;
    this.section('metrics', key, () => {
      if (!job) return h('p', { class: 'muted', text: 'No job.' });
      if (!metrics.length) return h('p', { class: 'muted', text: 'The model declares no metrics.' });
      const t0 = cps.length && typeof cps[0].createdAt === 'number' ? cps[0].createdAt : null;
      return metrics.map((metric, index) => {
        const train = [];
        const val = [];
        for (const c of cps) {
          const p = { round: c.artifact.round, time: t0 !== null && typeof c.createdAt === 'number' ? (c.createdAt - t0) / 1000 : null };
          const t = c.metrics && c.metrics.values ? c.metrics.values[metric.id] : undefined;
          const v = c.validationMetrics && c.validationMetrics.values ? c.validationMetrics.values[metric.id] : undefined;
          if (typeof t === 'number' && Number.isFinite(t)) train.push({ ...p, y: t });
          if (typeof v === 'number' && Number.isFinite(v)) val.push({ ...p, y: v });
        }
        const zoomKey = `${m.axis}:${metric.id}`;
        const onZoom = (range) => {
          if (range) m.zoom = { ...m.zoom, [zoomKey]: range };
          else { const { [zoomKey]: _, ...rest } = m.zoom; m.zoom = rest; }
          const focused = this.root.activeElement && this.root.activeElement.closest('.chart');
          this.renderMetrics(this.state, this.state ? this.state.job || null : null);
          if (focused) m.charts.children[index].focus(); // a keyboard zoom keeps the focus on its chart
        };
        return chart(metric, train, val, { index, width: m.width, smoothing: m.smoothing, log: m.log, axis: m.axis, zoom: m.zoom[zoomKey], onZoom });
      });
    }, m.charts);
  }
}

/** The drawing width in SVG units: the box's width in 40 px steps (600 while it is hidden). */
function chartWidth(el) {
  const w = el.clientWidth - 14;
  return w > 0 ? Math.min(900, Math.max(280, Math.round(w / 40) * 40)) : 600;
}

// ---- numbers -------------------------------------------------------------------------------

/** TensorBoard's smoothing: an exponential moving average, debiased so the first values are not pulled to 0. */
export function smooth(ys, weight) {
  if (!(weight > 0)) return ys.slice();
  let last = 0;
  let norm = 0;
  return ys.map((y) => {
    last = last * weight + (1 - weight) * y;
    norm = norm * weight + (1 - weight);
    return last / norm;
  });
}

/** The values a metric can take, as far as its name and values say: [0, 1] for a share (accuracy…) whose values
 * are all in it, [0, ∞) for a loss or error and for values never below 0; the padded axis stays inside. */
export function metricRange(metric, ys) {
  const id = `${metric && metric.id} ${metric && metric.label}`.toLowerCase();
  const inUnit = ys.every((y) => y >= 0 && y <= 1);
  if (inUnit && /accuracy|precision|recall|\bf1\b|\bauc\b|rate|share|fraction/.test(id)) return [0, 1];
  if (/loss|error|mse|mae|perplexity/.test(id) || ys.every((y) => y >= 0)) return [0, Infinity];
  return [-Infinity, Infinity];
}

function clampTicks(t, [lo, hi]) {
  const out = { lo: Math.max(t.lo, lo), hi: Math.min(t.hi, hi) };
  out.ticks = t.ticks.filter((v) => v >= out.lo - 1e-12 && v <= out.hi + 1e-12);
  if (!(out.hi > out.lo)) return t;
  return out;
}

function niceTicks(min, max, count = 4) {
  if (!(max > min)) { const d = Math.abs(min) || 1; min -= d / 2; max += d / 2; }
  const raw = (max - min) / Math.max(1, count);
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => s >= raw) || raw;
  const lo = Math.floor(min / step) * step;
  const hi = Math.ceil(max / step) * step;
  const ticks = [];
  for (let v = lo; v <= hi + step / 2; v += step) ticks.push(Number(v.toPrecision(12)));
  return { lo, hi, ticks };
}

/** Decades (and 2×, 5× within them when there are few) of a log axis; lo/hi in log10 units. */
function logTicks(min, max) {
  let lo = Math.floor(Math.log10(min));
  let hi = Math.ceil(Math.log10(max));
  if (hi === lo) hi += 1;
  const ticks = [];
  for (let e = lo; e <= hi; e += 1) {
    for (const f of hi - lo <= 2 ? [1, 2, 5] : [1]) {
      const v = Number((f * 10 ** e).toPrecision(12));
      if (e === hi && f > 1) break;
      ticks.push(v);
    }
  }
  return { lo, hi, ticks };
}

/** Seconds as 42s, 3:05 or 1:02:03. */
export function fmtClock(s) {
  const t = Math.round(s);
  if (Math.abs(t) < 60) return `${t}s`;
  const hh = Math.floor(t / 3600);
  const mm = Math.floor((t % 3600) / 60);
  const ss = String(t % 60).padStart(2, '0');
  return hh ? `${hh}:${String(mm).padStart(2, '0')}:${ss}` : `${mm}:${ss}`;
}

// ---- chart -------------------------------------------------------------------------------

const H = 190;
const M = { l: 56, r: 12, t: 10, b: 30 };

/** One metric: training and validation values (points with round, time, y) against round or time. */
function chart(metric, train, val, opts) {
  const W = opts.width;
  const name = metric.label || metric.id;
  const dir = metric.direction === 'maximize' ? '↑ better' : metric.direction === 'minimize' ? '↓ better' : '';
  const xOf = (p) => (opts.axis === 'time' ? p.time : p.round);
  const fmtX = (x) => (opts.axis === 'time' ? fmtClock(x) : String(x));
  const keep = (p) => xOf(p) !== null && (!opts.log || p.y > 0);
  const series = [['train', 'training', train.filter(keep)], ['validation', 'validation', val.filter(keep)]]
    .map(([cls, label, pts]) => ({ cls, label, pts, sm: smooth(pts.map((p) => p.y), opts.smoothing) }));
  const hiddenByLog = opts.log ? train.length + val.length - series[0].pts.length - series[1].pts.length : 0;
  const tip = h('div', { class: 'tip hidden' });
  const box = h('div', { class: 'chart', 'data-metric': metric.id, tabindex: '0', role: 'group',
    'aria-label': `${name} chart: arrow keys read the values, + and - zoom, 0 resets the zoom` },
    h('div', { class: 'title' }, h('span', { text: name }), h('span', { class: 'dir', text: dir })), tip);
  const el = svg('svg', { viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': `${name} by ${opts.axis === 'time' ? 'time' : 'round'}`,
    'data-scale': opts.log ? 'log' : 'linear', 'data-axis': opts.axis });
  box.append(el);
  const all = series.flatMap((s) => s.pts);
  if (!all.length) {
    const why = train.length + val.length === 0 ? 'No values yet: the first round is training'
      : opts.log ? 'No values above 0 to show on a log scale' : 'No checkpoint times to place on a time axis';
    el.append(svg('text', { class: 'empty', x: W / 2, y: H / 2, 'text-anchor': 'middle' }, why));
    return box;
  }
  // Horizontal range: the zoom, or every point; vertical range: what is visible, smoothed or not.
  const xs = all.map(xOf);
  let [xmin, xmax] = opts.zoom || [Math.min(...xs), Math.max(...xs)];
  if (xmax === xmin) { xmin = Math.max(0, xmin - 1); xmax += 1; }
  el.setAttribute('data-x0', xmin);
  el.setAttribute('data-x1', xmax);
  const inView = (x) => x >= xmin && x <= xmax;
  const ys = series.flatMap((s) => s.pts.flatMap((p, i) => (inView(xOf(p)) ? [p.y, s.sm[i]] : [])));
  if (!ys.length) ys.push(...all.map((p) => p.y));
  const fy = opts.log ? Math.log10 : (y) => y;
  const yt = opts.log ? logTicks(Math.min(...ys), Math.max(...ys)) : clampTicks(niceTicks(Math.min(...ys), Math.max(...ys)), metricRange(metric, ys));
  const xt = niceTicks(xmin, xmax, opts.axis === 'time' ? 5 : Math.min(6, Math.max(1, xmax - xmin)));
  const xTicks = xt.ticks.filter((v) => inView(v) && (opts.axis === 'time' || Number.isInteger(v)));
  const px = (x) => M.l + ((x - xmin) / (xmax - xmin)) * (W - M.l - M.r);
  const py = (y) => H - M.b - ((fy(y) - yt.lo) / (yt.hi - yt.lo)) * (H - M.t - M.b);
  const g = svg('g', { class: 'axes' });
  for (const v of yt.ticks) {
    g.append(svg('line', { class: 'grid', x1: M.l, x2: W - M.r, y1: py(v), y2: py(v) }));
    g.append(svg('text', { x: M.l - 6, y: py(v) + 4, 'text-anchor': 'end' }, fmtNum(v, 3)));
  }
  for (const v of xTicks) {
    g.append(svg('line', { class: 'axis', x1: px(v), x2: px(v), y1: H - M.b, y2: H - M.b + 4 }));
    g.append(svg('text', { x: px(v), y: H - M.b + 16, 'text-anchor': 'middle' }, fmtX(v)));
  }
  g.append(svg('line', { class: 'axis', x1: M.l, x2: W - M.r, y1: H - M.b, y2: H - M.b }));
  g.append(svg('line', { class: 'axis', x1: M.l, x2: M.l, y1: M.t, y2: H - M.b }));
  g.append(svg('text', { class: 'unit', x: W - M.r, y: H - 2, 'text-anchor': 'end' }, opts.axis === 'time' ? 'time since start' : 'round'));
  el.append(g);
  const clip = `weei-clip-${opts.index}`;
  el.append(svg('clipPath', { id: clip }, svg('rect', { x: M.l, y: 0, width: W - M.l - M.r, height: H - M.b + 1 })));
  const plot = svg('g', { 'clip-path': `url(#${clip})` });
  const path = (pts, ys2) => pts.map((p, i) => `${i ? 'L' : 'M'}${px(xOf(p)).toFixed(1)},${py(ys2[i]).toFixed(1)}`).join('');
  for (const s of series) {
    if (!s.pts.length) continue;
    if (opts.smoothing > 0) plot.append(svg('path', { class: `raw ${s.cls}`, d: path(s.pts, s.pts.map((p) => p.y)) }));
    plot.append(svg('path', { class: `line ${s.cls}`, d: path(s.pts, s.sm) }));
    const dots = svg('g', { class: s.cls });
    const r = s.pts.length > 60 ? 1.5 : 3;
    for (const p of s.pts) {
      dots.append(svg('circle', { class: 'pt', cx: px(xOf(p)).toFixed(1), cy: py(p.y).toFixed(1), r },
        svg('title', {}, `round ${p.round}: ${fmtNum(p.y)}`)));
    }
    plot.append(dots);
  }
  el.append(plot);
  const last = (s) => (s.pts.length ? fmtNum(s.pts[s.pts.length - 1].y) : '—');
  box.append(h('div', { class: 'legend' },
    h('span', {}, h('i'), `training (last ${last(series[0])})`),
    val.length ? h('span', {}, h('i', { class: 'val' }), `validation (last ${last(series[1])})`) : h('span', { class: 'muted', text: 'no validation yet' }),
    hiddenByLog ? h('span', { class: 'muted', text: `${hiddenByLog} value${hiddenByLog === 1 ? '' : 's'} ≤ 0 not shown` }) : null));
  // A zoom is clamped to the data; one that shows all of it is no zoom.
  const [lo, hi] = [Math.min(...xs), Math.max(...xs)];
  const zoomTo = (r) => {
    const range = r && [Math.max(r[0], lo), Math.min(r[1], hi)];
    if (range && !(range[1] > range[0])) return; // outside the data: nothing to show
    opts.onZoom(!r || (r[0] <= lo && r[1] >= hi) ? null : range);
  };
  interact(box, el, { W, series, xOf, fmtX, px, py, xmin, xmax, opts, zoomTo });
  return box;
}

// ---- hover, zoom, keyboard ---------------------------------------------------------------

function interact(box, el, { W, series, xOf, fmtX, px, py, xmin, xmax, opts, zoomTo }) {
  const tip = box.querySelector('.tip');
  const stops = [...new Set(series.flatMap((s) => s.pts.map(xOf)))].filter((x) => x >= xmin && x <= xmax).sort((a, b) => a - b);
  const cursor = svg('line', { class: 'cursor hidden', y1: M.t, y2: H - M.b });
  const marks = svg('g', { class: 'marks' });
  const band = svg('rect', { class: 'band hidden', y: M.t, height: H - M.t - M.b });
  const hit = svg('rect', { class: 'hit', x: M.l, y: M.t, width: W - M.l - M.r, height: H - M.t - M.b });
  el.append(band, cursor, marks, hit);
  // From a pointer event to chart units (the SVG scales with the window's width).
  const toX = (e) => {
    const r = el.getBoundingClientRect();
    const vx = ((e.clientX - r.left) / r.width) * W;
    return xmin + ((Math.min(Math.max(vx, M.l), W - M.r) - M.l) / (W - M.l - M.r)) * (xmax - xmin);
  };
  let at = -1;
  const show = (i) => {
    at = i;
    if (i < 0) { tip.classList.add('hidden'); cursor.classList.add('hidden'); marks.replaceChildren(); return ''; }
    const x = stops[i];
    const lines = [];
    marks.replaceChildren();
    let round = x;
    for (const s of series) {
      const j = s.pts.findIndex((p) => xOf(p) === x);
      if (j < 0) continue;
      round = s.pts[j].round;
      const smoothed = opts.smoothing > 0 ? ` (smoothed ${fmtNum(s.sm[j])})` : '';
      lines.push(h('div', { class: s.cls }, h('i'), `${s.label} ${fmtNum(s.pts[j].y)}${smoothed}`));
      marks.append(svg('circle', { class: s.cls, cx: px(x), cy: py(s.pts[j].y), r: 5 }));
    }
    const head = opts.axis === 'time' ? `round ${round} · ${fmtX(x)}` : `round ${round}`;
    tip.replaceChildren(h('div', { class: 'when', text: head }), ...lines);
    tip.classList.remove('hidden');
    const left = (px(x) / W) * 100;
    tip.style.left = left > 55 ? '' : `calc(${left}% + 12px)`;
    tip.style.right = left > 55 ? `calc(${100 - left}% + 12px)` : '';
    cursor.setAttribute('x1', px(x));
    cursor.setAttribute('x2', px(x));
    cursor.classList.remove('hidden');
    return tip.textContent;
  };
  const nearest = (x) => stops.reduce((best, s, i) => (Math.abs(s - x) < Math.abs(stops[best] - x) ? i : best), 0);
  let drag = null;
  hit.addEventListener('pointerdown', (e) => {
    if (e.button !== 0) return;
    drag = { x: toX(e), id: e.pointerId };
    hit.setPointerCapture(e.pointerId);
  });
  hit.addEventListener('pointermove', (e) => {
    const x = toX(e);
    if (drag) {
      const [a, b] = [Math.min(drag.x, x), Math.max(drag.x, x)];
      band.setAttribute('x', px(a));
      band.setAttribute('width', Math.max(0, px(b) - px(a)));
      band.classList.remove('hidden');
    }
    if (stops.length) show(nearest(x));
  });
  hit.addEventListener('pointerup', (e) => {
    if (!drag) return;
    const [a, b] = [Math.min(drag.x, toX(e)), Math.max(drag.x, toX(e))];
    drag = null;
    band.classList.add('hidden');
    // A click is not a zoom: the selection must span a few pixels and more than a point.
    if (px(b) - px(a) > 6 && b > a) zoomTo([a, b]);
  });
  hit.addEventListener('pointercancel', () => { drag = null; band.classList.add('hidden'); });
  hit.addEventListener('pointerleave', () => { if (!drag) show(-1); });
  el.addEventListener('dblclick', () => { if (opts.zoom) zoomTo(null); });
  box.addEventListener('blur', () => show(-1));
  box.addEventListener('keydown', (e) => {
    const span = xmax - xmin;
    const centre = at >= 0 ? stops[at] : (xmin + xmax) / 2;
    if (e.key === 'ArrowLeft' || e.key === 'ArrowRight') {
      if (!stops.length) return;
      const i = at < 0 ? (e.key === 'ArrowLeft' ? stops.length - 1 : 0) : Math.min(stops.length - 1, Math.max(0, at + (e.key === 'ArrowLeft' ? -1 : 1)));
      announce(box, show(i));
    } else if (e.key === '+' || e.key === '=') {
      zoomTo([centre - span / 4, centre + span / 4]);
    } else if (e.key === '-') {
      zoomTo([centre - span, centre + span]);
    } else if (e.key === '0') {
      zoomTo(null);
    } else return;
    e.preventDefault();
  });
}
