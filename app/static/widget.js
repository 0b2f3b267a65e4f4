// Weei's built-in window for the 'distributed-training' API.
//
//   import { mountWidget } from '<weei server>/widget.js';
//   const widget = mountWidget(api, { container, onClose });   // widget.close()
//
// weei.js's api.enable() imports this module and calls mountWidget. The
// window is ONE client of the public API: it only calls the documented
// methods (createJob, start, subscribe, getState, ...) and reads the
// documented state, so anything it shows or does can be built into a page's
// own interface. Closing it unsubscribes and removes it; training goes on.
//
// No framework, no build step, no external assets. Everything lives in a
// shadow root, so the host page's styles do not reach in and ours do not leak
// out. Rendering is coalesced to one pass per animation frame, and each
// section is rebuilt only when the part of the state it shows changed.
//
// Layout of this file:
//   1. helpers (DOM, formatting, files)
//   2. styles
//   3. mountWidget: window, drag, subscribe/render loop
//   4. sections: Job setup, Progress, Metrics, Checkpoints, Execution
//      diagnostics, Peers & invitations, Saved jobs, Debug log

const BASE = new URL('./', import.meta.url).href;
const SVG_NS = 'http://www.w3.org/2000/svg';

// ---- 1. helpers ----------------------------------------------------------------

/** h('div', {class: 'x', onclick: f, text: 'hi'}, child, ...) → element. */
function h(tag, props = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === 'text') el.textContent = value;
    else if (key === 'class') el.className = value;
    else if (key.startsWith('on') && typeof value === 'function') el.addEventListener(key.slice(2), value);
    else if (key in el && typeof value !== 'string') el[key] = value;
    else if (key === 'value' || key === 'checked' || key === 'disabled') el[key] = value;
    else el.setAttribute(key, value === true ? '' : String(value));
  }
  append(el, children);
  return el;
}

function append(el, ...children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

function svg(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value !== undefined && value !== null) el.setAttribute(key, String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/** 'unknown', null and undefined are missing data: shown as a dash, never as a reason. */
const missing = (v) => v === undefined || v === null || v === 'unknown' || v === '';
const show = (v, fmt = String) => (missing(v) ? '—' : fmt(v));

function fmtNum(v, digits = 4) {
  if (typeof v !== 'number' || !Number.isFinite(v)) return show(v);
  if (Number.isInteger(v) && Math.abs(v) < 1e9) return v.toLocaleString('en-US');
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e6)) return v.toExponential(2);
  return Number(v.toPrecision(digits)).toString();
}

function fmtBytes(n) {
  if (typeof n !== 'number' || !Number.isFinite(n)) return show(n);
  if (n < 1024) return `${n} B`;
  const units = ['KiB', 'MiB', 'GiB', 'TiB'];
  let v = n / 1024;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
  return `${v < 10 ? v.toFixed(1) : Math.round(v)} ${units[i]}`;
}

function fmtMs(ms) {
  if (typeof ms !== 'number' || !Number.isFinite(ms)) return show(ms);
  if (ms < 1000) return `${Math.round(ms)} ms`;
  return fmtDuration(ms);
}

function fmtDuration(ms) {
  if (typeof ms !== 'number' || !Number.isFinite(ms)) return show(ms);
  const s = ms / 1000;
  if (s < 60) return `${s < 10 ? s.toFixed(1) : Math.round(s)} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min ${Math.round(s - m * 60)} s`;
  return `${Math.floor(m / 60)} h ${m % 60} min`;
}

function fmtTime(ms) {
  if (typeof ms !== 'number' || !Number.isFinite(ms) || ms <= 0) return '—';
  const d = new Date(ms);
  const today = new Date().toDateString() === d.toDateString();
  return today ? d.toLocaleTimeString() : d.toLocaleString();
}

/** Disable a button per the state, but never re-enable one whose command is still running. */
function setDisabled(button, disabled) {
  button.disabled = Boolean(disabled) || button.dataset.running === '1';
}

const shortHash = (sha) => (missing(sha) ? '—' : String(sha).slice(0, 12) + '…');

function errorText(err) {
  if (!err) return '';
  const message = String(err.message || err);
  const reason = err.reason;
  return reason && !message.includes(reason) ? `${message} (reason: ${reason})` : message;
}

function saveFile(root, file, fallbackName) {
  const href = URL.createObjectURL(file);
  const a = h('a', { href, download: file.name || fallbackName, style: 'display:none' });
  root.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(href), 60_000);
}

async function fetchFile(path, name, type = 'application/octet-stream') {
  const response = await fetch(new URL(path, BASE));
  if (!response.ok) throw new Error(`GET ${path}: HTTP ${response.status}`);
  return new File([await response.blob()], name, { type });
}

/** The built-in reference packages, served next to this module. */
async function loadDemo(modelId) {
  const base = `models/${modelId}/`;
  const manifestFile = await fetchFile(base + 'manifest.json', 'manifest.json', 'application/json');
  const manifest = JSON.parse(await manifestFile.text());
  const wasm = await fetchFile(base + manifest.wasm.fileName, manifest.wasm.fileName, 'application/wasm');
  const entries = (manifest.inlineJson && manifest.inlineJson['dataset-manifest.json']) || [];
  const files = await Promise.all(entries.map((e) => fetchFile(base + 'data/' + e.fileName, e.fileName)));
  let validation = null;
  if (entries.length) {
    try { validation = await fetchFile(base + 'data/validation.bin', 'validation.bin'); } catch { validation = null; }
  }
  return { wasm, manifest: manifestFile, manifestJson: manifest, files, validation };
}

/** The workSource of a package manifest or model info, if it is an experience model. */
function experienceOf(source) {
  const ws = source && !Array.isArray(source) ? source.workSource : null;
  return ws && ws.kind === 'experience' ? ws : null;
}

// ---- 2. styles -------------------------------------------------------------------

const CSS = `
:host { all: initial; }
* { box-sizing: border-box; }
.win {
  position: fixed; top: 16px; right: 16px; z-index: 2147483000;
  width: min(700px, calc(100vw - 16px)); height: min(860px, calc(100vh - 32px));
  min-width: 320px; min-height: 160px;
  display: flex; flex-direction: column; overflow: hidden; resize: both;
  font: 13px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1d2430;
  background: #fbfcfd; border: 1px solid #c9d1dc; border-radius: 10px;
  box-shadow: 0 12px 36px rgba(20, 30, 50, .22), 0 2px 6px rgba(20, 30, 50, .12);
}
.head {
  display: flex; align-items: center; gap: 8px; padding: 7px 8px 7px 12px;
  background: linear-gradient(#2f4b73, #263d5e); color: #fff; cursor: move; user-select: none;
  touch-action: none;
}
.head:focus-visible { outline: 2px solid #9cc3ff; outline-offset: -2px; }
.head h2 { font-size: 14px; font-weight: 600; margin: 0; flex: 1; white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
.head .chip { background: rgba(255,255,255,.16); color: #fff; }
.head button { background: rgba(255,255,255,.12); color: #fff; border-color: rgba(255,255,255,.35); }
.head button:hover:not(:disabled) { background: rgba(255,255,255,.25); }
.body { flex: 1; overflow: auto; padding: 6px 10px 12px; }
details { border-bottom: 1px solid #e1e6ed; padding: 4px 0 8px; }
details:last-child { border-bottom: 0; }
summary { cursor: pointer; font-weight: 600; font-size: 13.5px; padding: 5px 2px; color: #22344f; }
summary:focus-visible { outline: 2px solid #4a8cf0; border-radius: 4px; }
details.settings { border: 0; padding: 0; }
details.settings > summary { font-size: 12px; text-transform: uppercase; letter-spacing: .04em; color: #5b6778; padding: 6px 0 2px; }
summary .note { font-weight: 400; color: #5b6778; margin-left: 6px; font-size: 12px; }
h3 { font-size: 12px; text-transform: uppercase; letter-spacing: .04em; color: #5b6778; margin: 10px 0 4px; }
p { margin: 4px 0; }
.muted { color: #5b6778; }
.small { font-size: 12px; }
.mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 12px; }
button {
  font: inherit; font-size: 12.5px; padding: 3px 10px; border-radius: 6px; cursor: pointer;
  border: 1px solid #aab6c6; background: #fff; color: #1d2430;
}
button:hover:not(:disabled) { background: #eef3fa; }
button:focus-visible, input:focus-visible, select:focus-visible { outline: 2px solid #4a8cf0; outline-offset: 1px; }
button:disabled { opacity: .45; cursor: default; }
button.primary { background: #2d6cdf; border-color: #2d6cdf; color: #fff; }
button.primary:hover:not(:disabled) { background: #2259bd; }
button.danger { color: #a3261b; border-color: #d9a19b; }
input, select {
  font: inherit; font-size: 12.5px; padding: 2px 6px; border: 1px solid #b9c3d0; border-radius: 5px;
  background: #fff; color: #1d2430; min-width: 0;
}
input[type=number] { width: 100%; }
input[type=file] { font-size: 12px; border: 0; padding: 0; width: 100%; }
input[type=checkbox] { margin: 0 5px 0 0; vertical-align: -2px; }
.row { display: flex; flex-wrap: wrap; align-items: center; gap: 6px; margin: 6px 0; }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(150px, 1fr)); gap: 6px 10px; margin: 6px 0; }
.grid label, .files label { display: flex; flex-direction: column; gap: 2px; font-size: 12px; color: #3b4658; }
.grid label.check { flex-direction: row; align-items: center; }
.grid .field { display: flex; flex-direction: column; gap: 2px; font-size: 12px; color: #3b4658; }
.files { display: grid; grid-template-columns: 1fr 1fr; gap: 6px 12px; margin: 6px 0; }
.hidden { display: none !important; }
.error { color: #a3261b; background: #fdeceb; border: 1px solid #f3c1bc; border-radius: 6px; padding: 4px 8px; margin: 6px 0; white-space: pre-wrap; }
.ok { color: #1d6b35; }
.chip { display: inline-block; font-size: 11.5px; padding: 0 7px; border-radius: 9px; background: #e6ebf2; color: #2b3a50; white-space: nowrap; }
.chip.running, .chip.training, .chip.live { background: #dff3e4; color: #1d6b35; }
.chip.paused, .chip.stale, .chip.loading { background: #fff1d6; color: #8a5a00; }
.chip.completed, .chip.received { background: #e1ecfb; color: #24508f; }
.chip.error, .chip.stopped { background: #fdeceb; color: #a3261b; }
.bar { position: relative; height: 14px; border-radius: 7px; background: #e4e9f0; overflow: hidden; min-width: 80px; flex: 1; }
.bar > i { position: absolute; inset: 0 auto 0 0; background: linear-gradient(90deg, #3b7be6, #5a9af5); border-radius: 7px; }
.bar.done > i { background: linear-gradient(90deg, #2f9a55, #4cbc73); }
.progress { display: grid; grid-template-columns: 120px 1fr auto; gap: 4px 8px; align-items: center; margin: 4px 0; }
.progress .lbl { font-size: 12px; color: #3b4658; }
.progress .val { font-size: 12px; font-variant-numeric: tabular-nums; text-align: right; white-space: nowrap; }
.tablewrap { overflow-x: auto; margin: 4px 0; max-height: 260px; overflow-y: auto; }
table { border-collapse: collapse; width: 100%; font-size: 12px; font-variant-numeric: tabular-nums; }
th { text-align: left; font-weight: 600; color: #3b4658; background: #eef2f7; position: sticky; top: 0; }
th, td { padding: 3px 6px; border-bottom: 1px solid #e4e9f0; vertical-align: top; }
td .sub { color: #5b6778; font-size: 11.5px; }
tr.me td:first-child { font-weight: 600; }
table.diagnostics td { white-space: nowrap; }
.tablewrap.wide { max-height: none; }
.card { border: 1px solid #dde3eb; border-radius: 8px; padding: 6px 10px; margin: 6px 0; background: #fff; }
.jobbox p { margin: 0 0 2px; }
.jobbox .row { margin: 4px 0 2px; }
.charts { display: grid; grid-template-columns: 1fr; gap: 8px; }
.chart { background: #fff; border: 1px solid #dde3eb; border-radius: 8px; padding: 4px 6px; }
.chart .title { display: flex; justify-content: space-between; font-size: 12px; font-weight: 600; color: #22344f; padding: 0 2px; }
.chart .title .dir { font-weight: 400; color: #5b6778; }
.chart svg { display: block; width: 100%; height: auto; }
.legend { display: flex; gap: 14px; font-size: 11.5px; color: #3b4658; padding: 0 2px 2px; }
.legend i { display: inline-block; width: 16px; height: 0; border-top: 2px solid #2d6cdf; vertical-align: middle; margin-right: 4px; }
.legend i.val { border-top: 2px dashed #e0751c; }
.kv { margin: 0; display: grid; grid-template-columns: max-content 1fr; gap: 1px 10px; font-size: 12px; }
.kv dt { color: #5b6778; }
.kv dd { margin: 0; overflow-wrap: anywhere; }
`;

// ---- 3. mountWidget --------------------------------------------------------------------

let mounted = null;

/**
 * Open the window in `container` (default: document.body). Returns {close()}.
 * A second call while it is open brings the same window back into view.
 */
export function mountWidget(api, { container = null, onClose = null } = {}) {
  if (!api || typeof api.getState !== 'function') throw new Error('mountWidget needs the distributed-training API');
  if (mounted && mounted.host.isConnected && mounted.api === api) {
    mounted.focus();
    return mounted.handle;
  }
  const host = document.createElement('div');
  host.setAttribute('data-weei-widget', 'distributed-training');
  const root = host.attachShadow({ mode: 'open' });
  root.append(h('style', { text: CSS }));
  (container || document.body).append(host);

  const widget = new Widget(api, root, host, () => { if (onClose) onClose(); });
  mounted = widget;
  return widget.handle;
}

const SECTIONS = [
  ['setup', 'Job setup'], ['progress', 'Progress'], ['metrics', 'Metrics'], ['checkpoints', 'Checkpoints'],
  ['diagnostics', 'Execution diagnostics'], ['peers', 'Peers & invitations'], ['saved', 'Saved jobs'],
  ['debug', 'Debug log'],
];

class Widget {
  constructor(api, root, host, onClose) {
    this.api = api;
    this.root = root;
    this.host = host;
    this.onClose = onClose;
    this.state = null;
    this.keys = {};          // section -> key of what it shows now
    this.frame = 0;
    this.closed = false;
    this.selection = { wasm: null, manifest: null, manifestJson: null, files: [], validation: null, label: '' };
    this.filledFor = null;   // job id the settings form was filled from
    this.debugCount = null;
    this.debugCountAt = 0;
    this.handle = { close: () => this.close() };

    this.build();
    this.unsubscribe = null;
    try {
      const stop = api.subscribe((state) => { this.state = state; this.schedule(); });
      Promise.resolve(stop).then((fn) => {
        if (typeof fn !== 'function') return;
        if (this.closed) fn(); else this.unsubscribe = fn;
      });
    } catch (err) {
      this.fail(err);
    }
    // Freshness ('live' / 'stale N s') and the debug-log count age without a state change.
    this.timer = setInterval(() => this.refresh(), 2000);
  }

  focus() {
    this.win.focus();
  }

  async refresh() {
    if (this.closed) return;
    try {
      this.state = await this.api.getState();
      this.schedule();
    } catch { /* the next subscribe() call brings the state */ }
  }

  fail(err) {
    this.globalError.dataset.sticky = '1';
    this.globalError.textContent = errorText(err);
    this.globalError.classList.remove('hidden');
  }

  close() {
    if (this.closed) return;
    this.closed = true;
    clearInterval(this.timer);
    if (this.frame) cancelAnimationFrame(this.frame);
    if (this.unsubscribe) this.unsubscribe();
    this.host.remove();
    if (mounted === this) mounted = null;
    this.onClose();
  }

  schedule() {
    if (this.frame || this.closed) return;
    this.frame = requestAnimationFrame(() => {
      this.frame = 0;
      try { this.render(); } catch (err) { console.error('[weei widget]', err); }
    });
  }

  /** Run an API call from a button: disable it meanwhile, show the error in `errorEl`. */
  async act(button, errorEl, fn) {
    this.globalError.dataset.sticky = '';
    if (errorEl) { errorEl.textContent = ''; errorEl.classList.add('hidden'); }
    if (button) { button.disabled = true; button.dataset.running = '1'; }
    try {
      return await fn();
    } catch (err) {
      if (errorEl) {
        errorEl.textContent = errorText(err);
        errorEl.classList.remove('hidden');
      } else {
        this.fail(err);
      }
      return undefined;
    } finally {
      if (button) { button.dataset.running = ''; button.disabled = false; }
      this.keys = {}; // buttons' enabled state follows the state again
      this.refresh();
    }
  }

  // ---- window, drag ----------------------------------------------------------------

  build() {
    this.status = h('span', { class: 'chip', text: 'loading…' });
    const close = h('button', { type: 'button', class: 'close', 'aria-label': 'Close window', title: 'Close (training goes on)', text: 'Close' });
    close.addEventListener('click', () => this.close());
    this.title = h('h2', { id: 'weei-title', text: 'Weei · Distributed training' });
    this.head = h('div', { class: 'head', tabindex: '0', title: 'Drag to move; arrow keys move too' }, this.title, this.status, close);
    this.globalError = h('div', { class: 'error hidden', role: 'alert' });
    this.body = h('div', { class: 'body' }, this.globalError);
    this.sections = {};
    for (const [id, label] of SECTIONS) {
      const note = h('span', { class: 'note' });
      const content = h('div', { class: 'content' });
      const el = h('details', { class: `sec sec-${id}`, 'data-section': id, open: id !== 'debug' && id !== 'saved' },
        h('summary', {}, label, note), content);
      this.sections[id] = { el, note, content };
      this.body.append(el);
    }
    this.win = h('div', { class: 'win', role: 'dialog', 'aria-labelledby': 'weei-title', tabindex: '-1' }, this.head, this.body);
    this.root.append(this.win);
    this.dragging();
    this.buildSetup();
    this.buildCheckpoints();
    this.buildPeersDevice();
    this.buildSaved();
    this.buildDebug();
  }

  dragging() {
    const win = this.win;
    const place = (left, top) => {
      const r = win.getBoundingClientRect();
      left = Math.min(Math.max(left, 40 - r.width), window.innerWidth - 40);
      top = Math.min(Math.max(top, 0), window.innerHeight - 32);
      Object.assign(win.style, { left: `${left}px`, top: `${top}px`, right: 'auto' });
    };
    let start = null;
    this.head.addEventListener('pointerdown', (e) => {
      if (e.button !== 0 || e.target.closest('button')) return;
      const r = win.getBoundingClientRect();
      start = { x: e.clientX, y: e.clientY, left: r.left, top: r.top };
      this.head.setPointerCapture(e.pointerId);
      e.preventDefault();
    });
    this.head.addEventListener('pointermove', (e) => {
      if (start) place(start.left + e.clientX - start.x, start.top + e.clientY - start.y);
    });
    const end = () => { start = null; };
    this.head.addEventListener('pointerup', end);
    this.head.addEventListener('pointercancel', end);
    this.head.addEventListener('keydown', (e) => {
      const step = e.shiftKey ? 50 : 10;
      const d = { ArrowLeft: [-step, 0], ArrowRight: [step, 0], ArrowUp: [0, -step], ArrowDown: [0, step] }[e.key];
      if (!d) return;
      const r = win.getBoundingClientRect();
      place(r.left + d[0], r.top + d[1]);
      e.preventDefault();
    });
  }

  /** Rebuild a section only when `key` changed. */
  section(id, key, build, target = this.sections[id].content) {
    const k = JSON.stringify(key);
    if (this.keys[id] === k) return;
    this.keys[id] = k;
    target.replaceChildren(...[].concat(build()).filter(Boolean));
  }

  render() {
    const state = this.state;
    if (!state) return;
    const job = state.job || null;
    this.status.textContent = job ? `${job.role === 'participant' ? 'participant' : 'coordinator'} · ${job.status}`
      : state.ready === false ? 'starting…' : 'no job';
    this.status.className = `chip ${job ? job.status : ''}`;
    if (state.error) {
      this.globalError.textContent = state.error;
      this.globalError.classList.remove('hidden');
    } else if (this.globalError.dataset.sticky !== '1') {
      this.globalError.classList.add('hidden');
    }
    this.renderSetup(state, job);
    this.renderProgress(state, job);
    this.renderMetrics(state, job);
    this.renderCheckpoints(state, job);
    this.renderDiagnostics(state, job);
    this.renderPeers(state, job);
    this.renderSaved(state, job);
    this.renderDebug(state);
  }

  // ---- 4a. Job setup ------------------------------------------------------------------

  buildSetup() {
    const s = this.sections.setup;
    const f = (this.f = {});
    const num = (name, label, attrs = {}) => {
      f[name] = h('input', { type: 'number', name, ...attrs });
      return (f[name + 'Label'] = h('label', {}, h('span', { text: label }), f[name]));
    };
    const fileInput = (name, label, attrs) => {
      f[name] = h('input', { type: 'file', name, ...attrs });
      return h('label', {}, h('span', { text: label }), f[name]);
    };

    f.demoDigits = h('button', { type: 'button', text: 'Digits MLP demo', title: 'A small dataset model: handwritten digits, 15 chunks and a validation file' });
    f.demoCartpole = h('button', { type: 'button', text: 'CartPole demo', title: 'A reinforcement learning model: no dataset, the model plays episodes' });
    f.selection = h('p', { class: 'small muted', text: 'Choose a model package, or load a built-in demo.' });
    f.demoError = h('div', { class: 'error hidden', role: 'alert' });

    const files = h('div', { class: 'files' },
      fileInput('wasm', 'Model module (.wasm)', { accept: '.wasm,application/wasm' }),
      fileInput('manifest', 'Manifest (.json)', { accept: '.json,application/json' }),
      fileInput('files', 'Dataset files (and auxiliary weights)', { multiple: true }),
      fileInput('validation', 'Validation file (optional)', {}),
      fileInput('checkpoint', 'Continue from checkpoint (optional)', { accept: '.weei-checkpoint' }),
      h('label', { class: 'check' }, h('span', {},
        (f.restore = h('input', { type: 'checkbox', name: 'restore' })), 'Restore the saved dataset progress')));

    f.method = h('select', { name: 'method' },
      h('option', { value: 'fedavg', text: 'FedAvg (average)' }),
      h('option', { value: 'fedavgm', text: 'FedAvgM (momentum)' }),
      h('option', { value: 'fedadam', text: 'FedAdam' }));
    f.vunit = h('select', { name: 'validationUnit', 'aria-label': 'Validation unit' }, h('option', { value: 'round', text: 'rounds' }), h('option', { value: 'epoch', text: 'epochs' }));
    f.participates = h('input', { type: 'checkbox', name: 'coordinatorParticipates', checked: true });
    f.venabled = h('input', { type: 'checkbox', name: 'validationEnabled' });

    const grid = h('div', { class: 'grid' },
      num('epochs', 'Epochs', { min: 1, step: 1, value: 1, required: true }),
      num('units', 'Episodes per round', { min: 1, step: 1, value: 32 }),
      num('localEpochs', 'Local epochs', { min: 1, step: 1, value: 1, required: true }),
      num('batchSize', 'Batch size', { min: 1, step: 1, value: 32, required: true }),
      num('learningRate', 'Learning rate (optional)', { min: 0, step: 'any', placeholder: 'model default' }),
      h('label', {}, h('span', { text: 'Aggregation' }), f.method),
      num('serverLearningRate', 'Server learning rate (0–10)', { min: 0, max: 10, step: 'any', placeholder: '1' }),
      num('momentum', 'Momentum (0–<1)', { min: 0, max: 0.9999, step: 'any', placeholder: '0.9' }),
      num('beta1', 'β1 (0–<1)', { min: 0, max: 0.9999, step: 'any', placeholder: '0.9' }),
      num('beta2', 'β2 (0–<1)', { min: 0, max: 0.9999, step: 'any', placeholder: '0.99' }),
      num('epsilon', 'ε (0–1)', { min: 0, max: 1, step: 'any', placeholder: '0.001' }),
      h('label', { class: 'check' }, f.participates, 'Coordinator trains too'),
      h('label', { class: 'check' }, f.venabled, 'Validate'),
      h('div', { class: 'field' }, h('label', { for: 'weei-vevery', text: 'Validate every' }), h('span', { class: 'row', style: 'margin:0' },
        (f.vevery = h('input', { type: 'number', id: 'weei-vevery', name: 'validationEvery', min: 1, step: 1, value: 1, style: 'width:5em' })), f.vunit)));
    f.method.addEventListener('change', () => this.updateMethodFields());

    f.create = h('button', { type: 'button', class: 'primary', text: 'Create job' });
    f.apply = h('button', { type: 'button', text: 'Apply settings to job', title: 'updateSettings(): takes effect from the next round' });
    f.formError = h('div', { class: 'error hidden', role: 'alert' });
    f.start = h('button', { type: 'button', class: 'primary', text: 'Start' });
    f.pause = h('button', { type: 'button', text: 'Pause' });
    f.resume = h('button', { type: 'button', class: 'primary', text: 'Resume' });
    f.stop = h('button', { type: 'button', class: 'danger', text: 'Stop' });
    f.shuffle = h('button', { type: 'button', text: 'Shuffle chunks' });
    f.validate = h('button', { type: 'button', text: 'Run validation' });
    f.controlError = h('div', { class: 'error hidden', role: 'alert' });
    f.jobLine = h('p', { class: 'small muted' });

    f.jobBox = h('div', { class: 'card jobbox' }, f.jobLine,
      h('div', { class: 'row' }, f.start, f.pause, f.resume, f.stop, f.shuffle, f.validate), f.controlError);
    f.choose = h('div', { class: 'choose' },
      h('div', { class: 'row' }, h('span', { class: 'small muted', text: 'Built-in demos:' }), f.demoDigits, f.demoCartpole),
      f.selection, f.demoError, files);
    f.settingsBox = h('details', { class: 'settings', open: true }, h('summary', { text: 'Settings' }), grid,
      h('div', { class: 'row' }, f.create, f.apply), f.formError);
    append(s.content, f.jobBox, f.choose, f.settingsBox);

    const demo = (button, id, defaults) => button.addEventListener('click', () => this.act(button, f.demoError, async () => {
      f.selection.textContent = `Loading the ${button.textContent}…`;
      const pkg = await loadDemo(id);
      for (const name of ['wasm', 'manifest', 'files', 'validation', 'checkpoint']) f[name].value = '';
      this.selection = { ...pkg, label: button.textContent };
      this.fillSettings(defaults, experienceOf(pkg.manifestJson));
      f.venabled.checked = Boolean(pkg.validation) || Boolean(experienceOf(pkg.manifestJson));
      this.describeSelection();
    }));
    demo(f.demoDigits, 'digits-mlp', { epochs: 1, localEpochs: 1, batchSize: 32, coordinatorParticipates: true,
      validationSchedule: { enabled: true, unit: 'round', every: 5 } });
    demo(f.demoCartpole, 'cartpole-reinforce', { epochs: 20, localEpochs: 1, batchSize: 16, coordinatorParticipates: true,
      experience: { unitsPerAssignment: 32 }, validationSchedule: { enabled: true, unit: 'round', every: 5 } });

    f.wasm.addEventListener('change', () => { this.selection.wasm = f.wasm.files[0] || null; this.selection.label = ''; this.describeSelection(); });
    f.files.addEventListener('change', () => { this.selection.files = [...f.files.files]; this.selection.label = ''; this.describeSelection(); });
    f.validation.addEventListener('change', () => { this.selection.validation = f.validation.files[0] || null; this.describeSelection(); });
    f.checkpoint.addEventListener('change', () => this.describeSelection());
    f.manifest.addEventListener('change', async () => {
      const file = f.manifest.files[0] || null;
      this.selection.manifest = file;
      this.selection.manifestJson = null;
      this.selection.label = '';
      if (file) {
        try { this.selection.manifestJson = JSON.parse(await file.text()); } catch { /* createJob names the problem */ }
      }
      this.fillSettings(null, experienceOf(this.selection.manifestJson));
      this.describeSelection();
    });

    f.create.addEventListener('click', () => this.act(f.create, f.formError, () => this.createJob()));
    f.apply.addEventListener('click', () => this.act(f.apply, f.formError, () => this.api.updateSettings(this.readSettings())));
    const control = (button, fn) => button.addEventListener('click', () => this.act(button, f.controlError, fn));
    control(f.start, () => this.api.start());
    control(f.pause, () => this.api.pause());
    control(f.resume, () => this.api.resume());
    control(f.stop, () => this.api.stop());
    control(f.shuffle, () => this.api.shuffleChunks());
    control(f.validate, () => this.api.runValidation());
    this.fillSettings(null, null);
  }

  describeSelection() {
    const sel = this.selection;
    const f = this.f;
    const parts = [];
    parts.push(sel.wasm ? `${sel.wasm.name} (${fmtBytes(sel.wasm.size)})` : 'no model');
    parts.push(sel.manifest ? sel.manifest.name : 'no manifest');
    const exp = experienceOf(sel.manifestJson);
    if (exp) parts.push(`experience model (${exp.unit && exp.unit.label || 'units'}), no dataset`);
    else parts.push(`${sel.files.length} dataset file${sel.files.length === 1 ? '' : 's'} (${fmtBytes(sel.files.reduce((a, x) => a + x.size, 0))})`);
    if (sel.validation) parts.push(`validation ${sel.validation.name}`);
    if (f.checkpoint.files[0]) parts.push(`from checkpoint ${f.checkpoint.files[0].name}`);
    f.selection.textContent = (sel.label ? `${sel.label}: ` : '') + parts.join(' · ');
    f.selection.classList.remove('muted');
  }

  /** Show Epochs, or Rounds and units per round, and fill values from `settings` if given. */
  fillSettings(settings, experience) {
    const f = this.f;
    this.experience = experience;
    f.epochsLabel.firstChild.textContent = experience ? 'Rounds' : 'Epochs';
    f.unitsLabel.classList.toggle('hidden', !experience);
    f.vunit.options[1].disabled = Boolean(experience);
    if (experience) {
      const upa = experience.unitsPerAssignment || {};
      f.unitsLabel.firstChild.textContent = `${(experience.unit && experience.unit.label) || 'Units'} per round`;
      if (upa.minimum) f.units.min = upa.minimum;
      if (upa.maximum) f.units.max = upa.maximum;
      if (!settings && upa.default) f.units.value = upa.default;
      if (f.vunit.value === 'epoch') f.vunit.value = 'round';
    }
    if (settings) {
      const set = (el, v) => { el.value = v === undefined || v === null ? '' : v; };
      set(f.epochs, settings.epochs ?? settings.rounds);
      set(f.localEpochs, settings.localEpochs);
      set(f.batchSize, settings.batchSize);
      set(f.learningRate, settings.learningRate);
      f.participates.checked = settings.coordinatorParticipates !== false;
      if (settings.experience) set(f.units, settings.experience.unitsPerAssignment);
      const agg = settings.aggregation || { method: 'fedavg' };
      f.method.value = agg.method;
      for (const k of ['serverLearningRate', 'momentum', 'beta1', 'beta2', 'epsilon']) set(f[k], agg[k]);
      const vs = settings.validationSchedule;
      f.venabled.checked = Boolean(vs && vs.enabled);
      if (vs) { f.vunit.value = vs.unit; set(f.vevery, vs.every); }
    }
    this.updateMethodFields();
  }

  updateMethodFields() {
    const f = this.f;
    const m = f.method.value;
    const shown = { fedavg: [], fedavgm: ['serverLearningRate', 'momentum'], fedadam: ['serverLearningRate', 'beta1', 'beta2', 'epsilon'] }[m];
    for (const k of ['serverLearningRate', 'momentum', 'beta1', 'beta2', 'epsilon']) {
      f[k + 'Label'].classList.toggle('hidden', !shown.includes(k));
    }
    f.serverLearningRate.placeholder = m === 'fedadam' ? '0.01' : '1';
  }

  /** The form as TrainingSettings. Empty optional fields are left out (the defaults apply). */
  readSettings() {
    const f = this.f;
    const int = (el, what) => {
      const v = Number(el.value);
      if (el.value.trim() === '' || !Number.isInteger(v) || v < 1) throw Object.assign(new Error(`${what} must be a whole number of 1 or more`), { reason: 'invalid-setting' });
      return v;
    };
    const opt = (el) => (el.value.trim() === '' ? undefined : Number(el.value));
    const settings = {
      epochs: int(f.epochs, this.experience ? 'Rounds' : 'Epochs'),
      localEpochs: int(f.localEpochs, 'Local epochs'),
      batchSize: int(f.batchSize, 'Batch size'),
      coordinatorParticipates: f.participates.checked,
    };
    const lr = opt(f.learningRate);
    if (lr !== undefined) settings.learningRate = lr;
    if (this.experience) settings.experience = { unitsPerAssignment: int(f.units, this.f.unitsLabel.firstChild.textContent) };
    const method = f.method.value;
    if (method !== 'fedavg') {
      const agg = { method };
      const keys = method === 'fedavgm' ? ['serverLearningRate', 'momentum'] : ['serverLearningRate', 'beta1', 'beta2', 'epsilon'];
      for (const k of keys) { const v = opt(f[k]); if (v !== undefined) agg[k] = v; }
      settings.aggregation = agg;
    }
    settings.validationSchedule = { enabled: f.venabled.checked, unit: f.vunit.value, every: int(f.vevery, 'Validate every') };
    return settings;
  }

  async createJob() {
    const sel = this.selection;
    const settings = this.readSettings();
    if (!sel.wasm) throw Object.assign(new Error('Choose the model module (.wasm) or a demo'), { reason: 'missing-file' });
    if (!sel.manifest) throw Object.assign(new Error('Choose the manifest (.json)'), { reason: 'missing-file' });
    const request = { wasm: sel.wasm, manifest: sel.manifest, files: sel.files, settings };
    if (sel.validation) request.validation = sel.validation;
    const checkpoint = this.f.checkpoint.files[0];
    if (checkpoint) {
      await this.api.continueFromCheckpoint({ ...request, checkpoint, datasetMode: this.f.restore.checked ? 'resume' : 'new' });
    } else {
      await this.api.createJob(request);
    }
  }

  renderSetup(state, job) {
    const f = this.f;
    if (job && job.id !== this.filledFor) {
      this.filledFor = job.id;
      if (job.role === 'coordinator' && job.settings) this.fillSettings(job.settings, experienceOf(job.info));
      // The form is for creating a job: once there is one, it folds away (it still applies settings).
      f.settingsBox.open = job.status === 'completed';
    }
    const coordinator = job && job.role === 'coordinator';
    const active = job && job.status !== 'completed';
    const busy = Boolean(state.preparing);
    setDisabled(f.create, busy || Boolean(active));
    f.create.textContent = state.preparing ? 'Preparing…' : (f.checkpoint.files[0] ? 'Continue from checkpoint' : 'Create job');
    f.demoDigits.disabled = f.demoCartpole.disabled = busy;
    f.apply.classList.toggle('hidden', !(coordinator && active));
    setDisabled(f.start, !(coordinator && job.status === 'ready'));
    setDisabled(f.pause, !(coordinator && job.status === 'running'));
    setDisabled(f.resume, !(coordinator && job.status === 'paused'));
    setDisabled(f.stop, !(coordinator && (job.status === 'running' || job.status === 'paused')));
    const exp = job && experienceOf(job.info);
    setDisabled(f.shuffle, !(coordinator && active && !exp));
    const canValidate = coordinator && !job.validationUnavailable && !state.evaluating
      && (exp ? Boolean(job.info.capabilities && job.info.capabilities.evaluation) : true);
    setDisabled(f.validate, !canValidate);
    f.validate.textContent = state.evaluating ? 'Validating…' : 'Run validation';
    f.choose.classList.toggle('hidden', Boolean(active));
    f.create.classList.toggle('hidden', Boolean(active));
    f.jobBox.classList.toggle('hidden', !job);
    f.settingsBox.classList.toggle('hidden', Boolean(active && !coordinator));
    if (job) {
      const info = job.info || {};
      const bits = [`${info.name || info.id || 'model'}${info.version ? ' ' + info.version : ''}`,
        `job ${job.id}`, job.role, job.status];
      if (job.shuffled) bits.push('chunks shuffled');
      if (job.incomplete) bits.push('finished before every chunk was trained');
      if (job.validationUnavailable) bits.push('validation file missing from browser storage');
      f.jobLine.textContent = bits.join(' · ');
    }
    this.sections.setup.note.textContent = job ? `${job.status}` : '';
  }

  // ---- 4b. Progress ---------------------------------------------------------------------

  renderProgress(state, job) {
    const key = job ? [job.status, job.progress, job.slots, job.checkpoints.length, job.settings && job.settings.epochs,
      state.progress, state.transfers, state.transferErrors, state.estimatedRemainingMs, state.transitioning,
      state.evaluating, state.busy] : null;
    this.section('progress', key, () => {
      if (!job) return h('p', { class: 'muted', text: 'No job.' });
      const out = [];
      const last = job.checkpoints[job.checkpoints.length - 1];
      const exp = experienceOf(job.info);
      const bar = (label, value, max, text) => {
        const frac = max > 0 ? Math.max(0, Math.min(1, value / max)) : 0;
        return h('div', { class: 'progress' },
          h('span', { class: 'lbl', text: label }),
          h('div', { class: `bar${frac >= 1 ? ' done' : ''}`, role: 'progressbar', 'aria-label': label,
            'aria-valuemin': 0, 'aria-valuemax': max, 'aria-valuenow': value }, h('i', { style: `width:${(frac * 100).toFixed(1)}%` })),
          h('span', { class: 'val', text }));
      };
      if (exp) {
        const planned = job.settings && job.settings.epochs || 0;
        const done = last ? last.artifact.round : 0;
        out.push(bar('Rounds', done, planned, `${done} / ${planned}`));
      } else if (job.progress) {
        const p = job.progress;
        const passes = last && typeof last.datasetProgress === 'number' ? last.datasetProgress : p.datasetEpoch;
        out.push(bar('Dataset passes', passes, p.plannedEpochs, `${fmtNum(passes, 3)} / ${p.plannedEpochs}`));
        out.push(h('p', { class: 'small muted', text: `${p.remainingChunks} of ${p.totalChunks} chunks left in this pass · ${job.checkpoints.length} checkpoints` }));
      } else if (job.role === 'participant') {
        out.push(h('p', { class: 'small muted', text: 'The coordinator reports the dataset progress; this browser trains the chunks it is given.' }));
      }
      const eta = state.estimatedRemainingMs ?? (job.progress && job.progress.estimatedRemainingMs);
      const flags = [];
      if (state.transitioning) flags.push('averaging updates into a checkpoint');
      if (state.evaluating) flags.push('validating');
      if (typeof eta === 'number') flags.push(`about ${fmtDuration(eta)} left`);
      if (flags.length) out.push(h('p', { class: 'small', text: flags.join(' · ') }));

      out.push(h('h3', { text: `Current round${last ? ' ' + (last.artifact.round + 1) : ''}` }));
      const slots = job.slots || [];
      const progress = state.progress || {};
      const peers = new Set(slots.map((s) => s.peerId));
      for (const p of Object.keys(progress)) peers.add(p);
      if (!peers.size) {
        out.push(h('p', { class: 'small muted', text: job.status === 'running' ? 'Waiting for assignments…' : 'No assignments.' }));
      }
      for (const peer of peers) {
        const slot = slots.find((s) => s.peerId === peer);
        const pr = progress[peer];
        const done = pr ? pr.processedExamples : (slot && slot.status === 'received' ? 1 : 0);
        const total = pr && pr.totalExamples ? pr.totalExamples : (slot && slot.status === 'received' ? 1 : 0);
        const who = peer === state.myPeerId ? 'this browser' : peer.slice(0, 10);
        const text = [slot && slot.chunkId, pr ? `${fmtNum(pr.processedExamples)}${pr.totalExamples ? ' / ' + fmtNum(pr.totalExamples) : ''}` : null,
          pr && pr.recordsPerSecond ? `${fmtNum(pr.recordsPerSecond, 3)}/s` : null].filter(Boolean).join(' · ');
        out.push(h('div', { class: 'progress', title: peer },
          h('span', { class: 'lbl' }, who, ' ', slot ? h('span', { class: `chip ${slot.status}`, text: slot.status }) : null),
          h('div', { class: 'bar', role: 'progressbar', 'aria-label': `${who} progress`, 'aria-valuenow': done, 'aria-valuemax': total || 0 },
            h('i', { style: `width:${total ? Math.min(100, (100 * done) / total).toFixed(1) : 0}%` })),
          h('span', { class: 'val', text })));
        if (slot && slot.error) out.push(h('div', { class: 'error', text: `${who}: ${slot.error}` }));
      }

      const transfers = state.transfers || [];
      const terrs = Object.entries(state.transferErrors || {});
      if (transfers.length || terrs.length) {
        out.push(h('h3', { text: 'Transfers' }));
        for (const t of transfers) {
          out.push(bar(`${t.direction === 'send' ? '↑ to' : '↓ from'} ${t.peerId.slice(0, 8)}`, t.bytes, t.totalBytes,
            `${fmtBytes(t.bytes)} / ${fmtBytes(t.totalBytes)} · ${fmtBytes(t.bytesPerSecond)}/s`
            + (typeof t.remainingSeconds === 'number' ? ` · ${fmtDuration(t.remainingSeconds * 1000)} left` : '')));
        }
        for (const [id, message] of terrs) out.push(h('div', { class: 'error', text: `Transfer ${id}: ${message}` }));
      }
      this.sections.progress.note.textContent = exp
        ? `${last ? last.artifact.round : 0} / ${job.settings.epochs} rounds`
        : job.progress ? `${fmtNum(last && typeof last.datasetProgress === 'number' ? last.datasetProgress : job.progress.datasetEpoch, 3)} / ${job.progress.plannedEpochs} passes` : '';
      return out;
    });
  }

  // ---- 4c. Metrics chart --------------------------------------------------------------------

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

  // ---- 4d. Checkpoints --------------------------------------------------------------------

  /** The buttons stay the same elements (a rebuild between mouse down and up would swallow a click). */
  buildCheckpoints() {
    const c = (this.c = {});
    c.error = h('div', { class: 'error hidden', role: 'alert' });
    c.download = h('button', { type: 'button', class: 'primary', text: 'Download latest checkpoint' });
    c.download.addEventListener('click', () => this.act(c.download, c.error, async () => {
      const file = await this.api.exportCheckpoint();
      saveFile(this.root, file, 'checkpoint.weei-checkpoint');
    }));
    c.module = h('button', { type: 'button', text: 'Export module' });
    c.module.addEventListener('click', () => this.act(c.module, c.error, async () => {
      const file = await this.api.exportModule();
      if (!file) throw new Error('This browser does not keep the model module of this job');
      saveFile(this.root, file, 'model.wasm');
    }));
    c.file = h('span', { class: 'small muted' });
    c.toolbar = h('div', { class: 'row' }, c.download, c.module, c.file);
    c.table = h('div');
    append(this.sections.checkpoints.content, c.toolbar, c.error, c.table);
  }

  renderCheckpoints(state, job) {
    const c = this.c;
    const cps = job ? job.checkpoints : [];
    const last = cps[cps.length - 1];
    c.toolbar.classList.toggle('hidden', !job);
    setDisabled(c.download, !cps.length || !job || job.role !== 'coordinator');
    setDisabled(c.module, !job || !job.hasModuleFile);
    c.file.textContent = last ? `${last.artifact.fileName} · ${fmtBytes(last.artifact.bytes)}` : '';
    this.sections.checkpoints.note.textContent = last ? `${cps.length}, latest round ${last.artifact.round}` : '';
    const key = job ? [job.id, cps.length, cps.map((x) => (x.validationMetrics ? 'v' : '') + (x.validationError ? 'e' : '')).join('')] : null;
    this.section('checkpoints', key, () => {
      if (!job) return h('p', { class: 'muted', text: 'No job.' });
      if (!cps.length) return h('p', { class: 'muted', text: 'No checkpoints yet.' });
      const metrics = (job.info && job.info.metrics) || [];
      const values = (obj) => metrics.map((m) => (obj && obj.values && typeof obj.values[m.id] === 'number'
        ? `${metrics.length > 1 ? m.label + ' ' : ''}${fmtNum(obj.values[m.id])}` : '')).filter(Boolean).join(' · ') || '—';
      const rows = cps.slice().reverse().slice(0, 200).map((x) => h('tr', {},
        h('td', { text: x.artifact.round }),
        h('td', { text: fmtNum(x.metrics ? x.metrics.examplesProcessed : undefined) }),
        h('td', { text: x.artifact.round === 0 ? '—' : values(x.metrics) }),
        h('td', { title: x.validationError || '' }, x.validationError ? h('span', { class: 'chip error', text: 'failed' }) : values(x.validationMetrics)),
        h('td', { text: fmtTime(x.createdAt) })));
      const label = metrics.length === 1 ? ` (${metrics[0].label})` : '';
      return h('div', { class: 'tablewrap' }, h('table', { class: 'checkpoints' },
        h('thead', {}, h('tr', {}, ['Round', 'Examples', `Metrics${label}`, 'Validation', 'Created'].map((t) => h('th', { text: t })))),
        h('tbody', {}, rows)));
    }, c.table);
  }

  // ---- 4e. Execution diagnostics -----------------------------------------------------------

  renderDiagnostics(state) {
    const diag = state.diagnostics || {};
    const key = [diag, state.myPeerId];
    this.section('diagnostics', key, () => {
      const entries = Object.entries(diag);
      this.sections.diagnostics.note.textContent = entries.length ? `${entries.length} peer${entries.length === 1 ? '' : 's'}` : '';
      if (!entries.length) return h('p', { class: 'muted', text: 'No diagnostics yet: they appear once a peer takes part in a job.' });
      const rows = entries.map(([peer, d]) => {
        const env = d.environment || {};
        const ex = d.execution || {};
        const gpu = d.gpu || {};
        const a = d.assignment;
        const t = d.timings || {};
        const p = d.performance || {};
        const adapter = gpu.adapter && gpu.adapter !== 'unknown'
          ? [gpu.adapter.vendor, gpu.adapter.device || gpu.adapter.architecture].filter((x) => !missing(x)).join(' ') || gpu.adapter.description : null;
        const gpuErr = typeof gpu.initializationError === 'string' && gpu.initializationError !== 'unknown' ? gpu.initializationError : null;
        const timing = [['prep', t.preparationMs], ['compile', t.compilationMs], ['train', t.trainingMs], ['upload', t.uploadMs]]
          .filter(([, v]) => typeof v === 'number').map(([k, v]) => `${k} ${fmtMs(v)}`);
        const fresh = d.stale ? `stale ${Math.round((d.ageMs || 0) / 1000)} s` : 'live';
        return h('tr', { class: peer === state.myPeerId ? 'me' : '', 'data-peer': peer },
          h('td', { title: peer }, peer === state.myPeerId ? 'this browser' : peer.slice(0, 10), d.connected === false ? h('div', { class: 'sub', text: 'disconnected' }) : null),
          h('td', {}, `${show(env.browser)} ${missing(env.browserVersion) ? '' : env.browserVersion}`.trim(),
            h('div', { class: 'sub', text: `${show(env.os)}${missing(env.logicalCores) ? '' : ` · ${env.logicalCores} cores`}` })),
          h('td', {}, show(ex.actual), ex.requested && ex.requested !== 'auto' && ex.requested !== ex.actual ? h('span', { class: 'sub', text: ` (asked ${ex.requested})` }) : null,
            h('div', { class: 'sub', text: show(ex.backend) }),
            ex.fallbackReason ? h('div', { class: 'sub', text: `fallback: ${ex.fallbackReason}` }) : null),
          h('td', { text: `${show(ex.activeWorkers)} / ${show(ex.workerLimit)}` }),
          h('td', {}, gpu.webgpu === 'available' ? 'WebGPU' : 'no WebGPU', h('div', { class: 'sub', text: adapter || '—' }),
            h('div', { class: 'sub', text: `budget ${show(gpu.memoryBudgetMiB)} MiB` }), gpuErr ? h('div', { class: 'sub', text: `error: ${gpuErr}` }) : null),
          h('td', {}, a ? `round ${a.round}` : '—', a ? h('div', { class: 'sub', text: `${show(a.chunkId)} · ${fmtNum(a.exampleCount)} ex` }) : null,
            a ? h('div', { class: 'sub', text: `batch ${show(a.batchSize)} · ${show(a.localEpochs)} ep · lr ${show(a.learningRate, fmtNum)}` }) : null),
          h('td', {}, h('span', { class: `chip ${d.stage === 'error' ? 'error' : d.stage === 'training' ? 'training' : ''}`, text: show(d.stage) }),
            d.error ? h('div', { class: 'sub', text: d.error }) : null),
          h('td', { class: 'small' }, timing.length ? timing.map((x) => h('div', { text: x })) : '—'),
          h('td', {}, p.currentExamplesPerSecond == null ? '—' : `${fmtNum(p.currentExamplesPerSecond, 3)}/s`,
            h('div', { class: 'sub', text: `avg ${p.averageExamplesPerSecond == null ? '—' : fmtNum(p.averageExamplesPerSecond, 3) + '/s'}` }),
            h('div', { class: 'sub', text: `${fmtNum(p.processedExamples || 0)} / ${show(p.totalExamples, fmtNum)}` })),
          h('td', {}, h('span', { class: `chip ${d.stale ? 'stale' : 'live'}`, text: fresh })));
      });
      return [
        h('p', { class: 'small consistency', text: consistency(entries, state.myPeerId) }),
        h('div', { class: 'tablewrap wide' }, h('table', { class: 'diagnostics' },
          h('thead', {}, h('tr', {}, ['Peer', 'Browser / OS', 'Mode', 'Workers', 'GPU', 'Assignment', 'Stage', 'Timings', 'Speed', 'Fresh']
            .map((t) => h('th', { text: t })))),
          h('tbody', {}, rows))),
      ];
    });
  }

  // ---- 4f. Peers & invitations --------------------------------------------------------------

  buildPeersDevice() {
    const d = (this.d = {});
    d.pause = h('input', { type: 'checkbox', name: 'pauseContribution' });
    d.workers = h('input', { type: 'number', name: 'maxLocalWorkers', min: 1, max: 64, step: 1, style: 'width:5em' });
    d.gpu = h('input', { type: 'number', name: 'gpuMemoryBudgetMiB', min: 0, step: 64, style: 'width:7em' });
    d.backend = h('select', { name: 'backendPreference' }, ['auto', 'cpu', 'gpu', 'hybrid'].map((v) => h('option', { value: v, text: v })));
    d.error = h('div', { class: 'error hidden', role: 'alert' });
    d.line = h('p', { class: 'small muted' });
    d.pause.addEventListener('change', () => this.act(null, d.error, () => this.api.pauseContribution(d.pause.checked)));
    d.workers.addEventListener('change', () => this.act(null, d.error, () => this.api.setMaxLocalWorkers(Number(d.workers.value))));
    d.gpu.addEventListener('change', () => this.act(null, d.error, () => this.api.setGpuMemoryBudgetMiB(Number(d.gpu.value))));
    d.backend.addEventListener('change', () => this.act(null, d.error, () => this.api.setBackendPreference(d.backend.value)));
    d.peersBox = h('div');
    d.partsBox = h('div');
    d.invBox = h('div');
    append(this.sections.peers.content, d.peersBox, d.partsBox, d.invBox,
      h('h3', { text: 'This device' }),
      h('div', { class: 'row' },
        h('label', {}, d.pause, 'Pause my contribution'),
        h('label', {}, 'Workers per device ', d.workers),
        h('label', {}, 'GPU budget (MiB) ', d.gpu),
        h('label', {}, 'Backend ', d.backend)),
      d.line, d.error);
  }

  renderPeers(state, job) {
    const d = this.d;
    const focused = this.root.activeElement;
    if (focused !== d.workers) d.workers.value = state.maxLocalWorkers ?? '';
    if (focused !== d.gpu) d.gpu.value = state.gpuMemoryBudgetMiB ?? '';
    d.backend.value = state.backendPreference || 'auto';
    d.pause.checked = Boolean(state.pausedContribution);
    const ex = state.execution || {};
    const lw = job && job.localWorkers;
    d.line.textContent = `Workers running: ${show(state.activeWorkers)}`
      + (lw ? ` · this job can use ${lw.effective} (device allows ${lw.capacity})` : '')
      + ` · mode ${show(ex.actual)}${ex.fallback && ex.fallback !== 'none' ? ` (fallback: ${ex.fallback})` : ''}`;

    const peers = state.peers || [];
    const participants = (job && job.participants) || {};
    const invitations = state.invitations || [];
    this.sections.peers.note.textContent = [peers.length ? `${peers.length} connected` : '',
      invitations.length ? `${invitations.length} invitation${invitations.length > 1 ? 's' : ''}` : ''].filter(Boolean).join(' · ');
    const coordinator = job && job.role === 'coordinator' && job.status !== 'completed';

    // Connected peers with Invite buttons: rebuilt only when who can be invited changes.
    this.section('peers.list', [peers, coordinator, Object.keys(participants)], () => {
      const errorEl = h('div', { class: 'error hidden', role: 'alert' });
      const out = [h('h3', { text: 'Connected peers' })];
      if (!peers.length) out.push(h('p', { class: 'small muted', text: 'No other browser is connected to you.' }));
      for (const peer of peers) {
        const invite = h('button', { type: 'button', text: participants[peer] ? 'Invited' : 'Invite', disabled: !coordinator || Boolean(participants[peer]) });
        invite.addEventListener('click', () => this.act(invite, errorEl, () => this.api.invite(peer)));
        out.push(h('div', { class: 'row' }, h('span', { class: 'mono', text: peer }), invite));
      }
      out.push(errorEl);
      return out;
    }, d.peersBox);

    this.section('peers.parts', [job && job.id, participants, state.myPeerId], () => {
      const parts = Object.entries(participants);
      if (!job) return null;
      return [h('h3', { text: 'Participants' }),
        !parts.length ? h('p', { class: 'small muted', text: 'Nobody yet.' }) : h('div', { class: 'tablewrap' }, h('table', { class: 'participants' },
          h('thead', {}, h('tr', {}, ['Peer', 'State', 'Connected', 'Approved', 'Paused'].map((t) => h('th', { text: t })))),
          h('tbody', {}, parts.map(([peer, p]) => h('tr', {},
            h('td', { class: 'mono', title: peer, text: peer === state.myPeerId ? 'this browser' : peer.slice(0, 16) }),
            h('td', {}, h('span', { class: `chip ${p.state}`, text: p.state })),
            h('td', { text: p.connected ? 'yes' : 'no' }), h('td', { text: p.approved ? 'yes' : 'no' }),
            h('td', { text: p.paused ? 'yes' : 'no' }))))))];
    }, d.partsBox);

    this.section('peers.inv', invitations.map(([id]) => id), () => {
      const out = [h('h3', { text: 'Invitations' })];
      if (!invitations.length) out.push(h('p', { class: 'small muted', text: 'No pending invitation.' }));
      for (const [jobId, entry] of invitations) out.push(this.invitationCard(jobId, entry));
      return out;
    }, d.invBox);
  }

  /** What the participant sees before accepting: the model, its module and hash, the data size, the settings. */
  invitationCard(jobId, entry) {
    const inv = (entry && entry.invitation) || entry || {};
    const info = inv.modelInfo || {};
    const mod = inv.module || {};
    const s = inv.settings || {};
    const err = h('div', { class: 'error hidden', role: 'alert' });
    const accept = h('button', { type: 'button', class: 'primary', text: 'Accept' });
    const decline = h('button', { type: 'button', text: 'Decline' });
    accept.addEventListener('click', () => this.act(accept, err, () => this.api.decideInvitation(jobId, true)));
    decline.addEventListener('click', () => this.act(decline, err, () => this.api.decideInvitation(jobId, false)));
    const exp = experienceOf(info);
    const agg = s.aggregation ? [s.aggregation.method, ...Object.entries(s.aggregation).filter(([k]) => k !== 'method').map(([k, x]) => `${k} ${x}`)].join(' ') : 'fedavg';
    const settingsText = [s.epochs !== undefined ? `${exp ? 'rounds' : 'epochs'} ${s.epochs}` : null,
      s.localEpochs !== undefined ? `local epochs ${s.localEpochs}` : null, s.batchSize !== undefined ? `batch ${s.batchSize}` : null,
      `learning rate ${s.learningRate !== undefined ? s.learningRate : 'model default'}`,
      s.experience ? `${s.experience.unitsPerAssignment} ${(exp && exp.unit && exp.unit.label || 'units').toLowerCase()} per round` : null,
      agg].filter(Boolean).join(' · ');
    return h('div', { class: 'card invitation', 'data-job': jobId },
      h('dl', { class: 'kv' },
        h('dt', { text: 'Model' }), h('dd', { text: `${info.name || '—'} (${info.id || '—'} ${info.version || ''})` }),
        h('dt', { text: 'From' }), h('dd', { class: 'mono', text: inv.coordinator || '—' }),
        h('dt', { text: 'Module' }), h('dd', { text: `${mod.fileName || ''} ${fmtBytes(mod.bytes)}` }),
        h('dt', { text: 'SHA-256' }), h('dd', { class: 'mono', text: show(mod.sha256) }),
        h('dt', { text: 'Data' }), h('dd', { text: exp ? 'none: the model plays episodes' : fmtBytes(inv.dataBytes) }),
        h('dt', { text: 'Settings' }), h('dd', { text: settingsText }),
        h('dt', { text: 'Job' }), h('dd', { class: 'mono', text: jobId })),
      h('p', { class: 'small muted', text: 'Nothing is downloaded before you accept. Only use models you trust: the module runs in your browser.' }),
      h('div', { class: 'row' }, accept, decline), err);
  }

  // ---- 4g. Saved jobs ---------------------------------------------------------------------

  buildSaved() {
    const v = (this.v = { cells: new Map() });
    v.error = h('div', { class: 'error hidden', role: 'alert' });
    v.leave = h('button', { type: 'button', text: 'Leave job', title: 'The job stops here and stays in Saved jobs' });
    v.leave.addEventListener('click', () => this.act(v.leave, v.error, () => this.api.leave()));
    v.table = h('div');
    append(this.sections.saved.content,
      h('div', { class: 'row' }, v.leave, h('span', { class: 'small muted', text: 'Jobs and checkpoints are kept in this browser (IndexedDB).' })),
      v.error, v.table);
  }

  renderSaved(state, job) {
    const v = this.v;
    const saved = state.savedJobs || [];
    setDisabled(v.leave, !job);
    this.sections.saved.note.textContent = saved.length ? String(saved.length) : '';
    // Rows (and their buttons) are rebuilt only when the list changes; round and time update in place.
    const key = [saved.map((s) => [s.id, s.model, s.status, s.active]), job ? [job.id, job.status] : null];
    this.section('saved', key, () => {
      v.cells.clear();
      if (!saved.length) return h('p', { class: 'muted', text: 'No saved jobs.' });
      const rows = saved.map((s) => {
        const open = h('button', { type: 'button', text: 'Open', disabled: s.active || Boolean(job && job.status !== 'completed') });
        const del = h('button', { type: 'button', class: 'danger', text: 'Delete', disabled: Boolean(job && job.id === s.id) });
        open.addEventListener('click', () => this.act(open, v.error, () => this.api.openSavedJob(s.id)));
        del.addEventListener('click', () => {
          if (!window.confirm(`Delete saved job ${s.id} and its checkpoints from this browser?`)) return;
          this.act(del, v.error, () => this.api.deleteSavedJob(s.id));
        });
        const round = h('td');
        const updated = h('td');
        v.cells.set(s.id, { round, updated });
        return h('tr', { 'data-job': s.id },
          h('td', {}, s.model || '—', h('div', { class: 'sub mono', text: s.id })),
          h('td', {}, h('span', { class: `chip ${s.status}`, text: s.status }), s.active ? h('div', { class: 'sub', text: 'active' }) : null),
          round, updated,
          h('td', {}, h('div', { class: 'row', style: 'margin:0' }, open, del)));
      });
      return h('div', { class: 'tablewrap' }, h('table', { class: 'saved' },
        h('thead', {}, h('tr', {}, ['Model', 'Status', 'Round', 'Updated', ''].map((t) => h('th', { text: t })))),
        h('tbody', {}, rows)));
    }, v.table);
    for (const s of saved) {
      const cells = v.cells.get(s.id);
      if (!cells) continue;
      cells.round.textContent = s.round;
      cells.updated.textContent = fmtTime(s.updatedAt);
    }
  }

  // ---- 4h. Debug log ----------------------------------------------------------------------

  buildDebug() {
    const g = (this.g = {});
    g.count = h('span', { class: 'small', text: '—' });
    g.download = h('button', { type: 'button', text: 'Download' });
    g.clear = h('button', { type: 'button', class: 'danger', text: 'Clear' });
    g.error = h('div', { class: 'error hidden', role: 'alert' });
    g.download.addEventListener('click', () => this.act(g.download, g.error, async () => {
      const log = await this.api.getDebugLog();
      const stamp = new Date().toISOString().replace(/[:.]/g, '-');
      saveFile(this.root, new File([JSON.stringify(log, null, 2)], `weei-debug-log-${stamp}.json`, { type: 'application/json' }), 'weei-debug-log.json');
    }));
    g.clear.addEventListener('click', () => this.act(g.clear, g.error, async () => {
      await this.api.clearDebugLog();
      this.debugCountAt = 0;
    }));
    this.sections.debug.el.addEventListener('toggle', () => { this.debugCountAt = 0; this.schedule(); });
    append(this.sections.debug.content,
      h('div', { class: 'row' }, g.count, g.download, g.clear),
      h('p', { class: 'small muted', text: 'The last 1,000 events of this browser profile, across jobs and reloads. No dataset contents or weights.' }),
      g.error);
  }

  async renderDebug() {
    // getDebugLog() copies up to 1,000 events: count them only while the section is open, at most every 2 s.
    if (!this.sections.debug.el.open || Date.now() - this.debugCountAt < 2000 || this.debugCounting) return;
    this.debugCounting = true;
    this.debugCountAt = Date.now();
    try {
      const log = await this.api.getDebugLog();
      const n = log && log.events ? log.events.length : 0;
      this.g.count.textContent = `${n.toLocaleString('en-US')} event${n === 1 ? '' : 's'}`;
      this.sections.debug.note.textContent = String(n);
    } catch (err) {
      this.g.count.textContent = `— (${errorText(err)})`;
    } finally {
      this.debugCounting = false;
    }
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

// ---- consistency line ---------------------------------------------------------------------

function consistency(entries, me) {
  const models = new Map();
  const settings = new Map();
  const unknownModel = [];
  for (const [peer, d] of entries) {
    const name = peer === me ? 'this browser' : peer.slice(0, 10);
    if (d.model && d.model !== 'unknown' && d.model.wasmSha256) {
      models.set(d.model.wasmSha256, [...(models.get(d.model.wasmSha256) || []), name]);
    } else unknownModel.push(name);
    if (d.assignment) {
      const a = d.assignment;
      const k = `batch ${show(a.batchSize)} · local epochs ${show(a.localEpochs)} · learning rate ${missing(a.learningRate) ? 'model default' : fmtNum(a.learningRate)}`;
      settings.set(k, [...(settings.get(k) || []), name]);
    }
  }
  const parts = [];
  if (entries.length === 1) parts.push('One participant reports diagnostics');
  if (models.size === 1) parts.push(`${entries.length > 1 ? 'All use the same model' : 'Model'} ${shortHash([...models.keys()][0])}`);
  else if (models.size > 1) parts.push(`Different models: ${[...models].map(([sha, who]) => `${shortHash(sha)} (${who.join(', ')})`).join('; ')}`);
  if (unknownModel.length && entries.length > 1) parts.push(`model not known yet for ${unknownModel.join(', ')}`);
  if (settings.size === 1) parts.push(`${entries.length > 1 && [...settings.values()][0].length === entries.length ? 'same settings' : 'settings'}: ${[...settings.keys()][0]}`);
  else if (settings.size > 1) parts.push(`Different settings: ${[...settings].map(([k, who]) => `${k} (${who.join(', ')})`).join('; ')}`);
  else parts.push('no assignment yet to compare settings');
  const same = models.size <= 1 && settings.size <= 1 && !unknownModel.length;
  return (entries.length > 1 ? (same ? '✓ ' : '⚠ ') : '') + parts.join(' · ') + '.';
}
