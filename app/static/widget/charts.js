// The window's Metrics section.
// Methods of the window's Widget class (mixed into it by window.js): `this` is the Widget.

import { h, svg, fmtNum } from './dom.js';

export class Metrics {
  renderMetrics(state, job) {
    const cps = job ? job.checkpoints : [];
    const key = job ? [job.id, cps.length, cps.map((c) => c.validationMetrics ? 1 : 0).join(''), job.info && job.info.metrics] : null;
    this.section('metrics', key, () => {
      const metrics = (job && job.info && job.info.metrics) || [];
      if (!job) return h('p', { class: 'muted', text: 'No job.' });
      if (!metrics.length) return h('p', { class: 'muted', text: 'The model declares no metrics.' });
      const charts = h('div', { class: 'charts' });
      for (const m of metrics) {
        const train = [];
        const val = [];
        for (const c of cps) {
          const x = c.artifact.round;
          const t = c.metrics && c.metrics.values ? c.metrics.values[m.id] : undefined;
          const v = c.validationMetrics && c.validationMetrics.values ? c.validationMetrics.values[m.id] : undefined;
          if (typeof t === 'number' && Number.isFinite(t)) train.push([x, t]);
          if (typeof v === 'number' && Number.isFinite(v)) val.push([x, v]);
        }
        charts.append(chart(m, train, val));
      }
      return charts;
    });
  }
}

// ---- chart -------------------------------------------------------------------------------

function niceTicks(min, max, count = 4) {
  if (!(max > min)) { const d = Math.abs(min) || 1; min -= d / 2; max += d / 2; }
  const raw = (max - min) / count;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => s >= raw) || raw;
  const lo = Math.floor(min / step) * step;
  const hi = Math.ceil(max / step) * step;
  const ticks = [];
  for (let v = lo; v <= hi + step / 2; v += step) ticks.push(Number(v.toPrecision(12)));
  return { lo, hi, ticks };
}

/** An inline SVG line chart of one metric: training and validation values against the round. */
function chart(metric, train, val) {
  const W = 600;
  const H = 170;
  const M = { l: 52, r: 12, t: 10, b: 28 };
  const all = train.concat(val);
  const dir = metric.direction === 'maximize' ? '↑ better' : metric.direction === 'minimize' ? '↓ better' : '';
  const box = h('div', { class: 'chart', 'data-metric': metric.id },
    h('div', { class: 'title' }, h('span', { text: metric.label || metric.id }), h('span', { class: 'dir', text: dir })));
  const el = svg('svg', { viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': `${metric.label || metric.id} by round` });
  if (!all.length) {
    el.append(svg('text', { x: W / 2, y: H / 2, 'text-anchor': 'middle', fill: '#7a8698', 'font-size': 13 }, 'No values yet: the first round is training'));
    box.append(el);
    return box;
  }
  const xs = all.map((p) => p[0]);
  const ys = all.map((p) => p[1]);
  let xmin = Math.min(...xs);
  let xmax = Math.max(...xs);
  if (xmax === xmin) { xmin = Math.max(0, xmin - 1); xmax += 1; }
  const yt = niceTicks(Math.min(...ys), Math.max(...ys));
  const xt = niceTicks(xmin, xmax, Math.min(6, xmax - xmin));
  const xTicks = xt.ticks.filter((v) => v >= xmin && v <= xmax && Number.isInteger(v));
  const px = (x) => M.l + ((x - xmin) / (xmax - xmin)) * (W - M.l - M.r);
  const py = (y) => H - M.b - ((y - yt.lo) / (yt.hi - yt.lo)) * (H - M.t - M.b);
  const axis = '#9aa6b6';
  const g = svg('g', { 'font-size': 11, fill: '#4b5668', 'font-family': 'system-ui, sans-serif' });
  for (const v of yt.ticks) {
    g.append(svg('line', { x1: M.l, x2: W - M.r, y1: py(v), y2: py(v), stroke: '#e8ecf1' }));
    g.append(svg('text', { x: M.l - 6, y: py(v) + 4, 'text-anchor': 'end' }, fmtNum(v, 3)));
  }
  for (const v of xTicks) {
    g.append(svg('line', { x1: px(v), x2: px(v), y1: H - M.b, y2: H - M.b + 4, stroke: axis }));
    g.append(svg('text', { x: px(v), y: H - M.b + 16, 'text-anchor': 'middle' }, v));
  }
  g.append(svg('line', { x1: M.l, x2: W - M.r, y1: H - M.b, y2: H - M.b, stroke: axis }));
  g.append(svg('line', { x1: M.l, x2: M.l, y1: M.t, y2: H - M.b, stroke: axis }));
  g.append(svg('text', { x: W - M.r, y: H - 2, 'text-anchor': 'end', fill: '#7a8698' }, 'round'));
  el.append(g);
  const series = (points, color, cls, dash) => {
    if (!points.length) return;
    const d = points.map((p, i) => `${i ? 'L' : 'M'}${px(p[0]).toFixed(1)},${py(p[1]).toFixed(1)}`).join('');
    el.append(svg('path', { d, fill: 'none', stroke: color, 'stroke-width': 2, 'stroke-dasharray': dash, 'stroke-linejoin': 'round' }));
    const dots = svg('g', { class: cls, fill: color });
    const r = points.length > 60 ? 1.5 : 3;
    for (const [x, y] of points) {
      dots.append(svg('circle', { class: 'pt', cx: px(x).toFixed(1), cy: py(y).toFixed(1), r }, svg('title', {}, `round ${x}: ${fmtNum(y)}`)));
    }
    el.append(dots);
  };
  series(train, '#2d6cdf', 'train');
  series(val, '#e0751c', 'validation', '5 4');
  const last = (pts) => (pts.length ? fmtNum(pts[pts.length - 1][1]) : '—');
  box.append(el, h('div', { class: 'legend' },
    h('span', {}, h('i'), `training (last ${last(train)})`),
    val.length ? h('span', {}, h('i', { class: 'val' }), `validation (last ${last(val)})`) : h('span', { class: 'muted', text: 'no validation yet' })));
  return box;
}
