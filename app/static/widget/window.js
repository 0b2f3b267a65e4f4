// Weei's built-in window for the 'distributed-training' API.
//
//   import { mountWidget } from '<weei server>/widget.js';   // re-exports this module's
//   const widget = mountWidget(api, { container, onClose });   // widget.close()
//
// weei.js's api.enable() imports widget.js and calls mountWidget. The
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
// Layout (one module per section of the window, in app/static/widget/):
//   window.js      mountWidget: window, drag, subscribe/render loop; the room bar and the
//                  invitation notice at the top (their build/render methods are in peers.js)
//   dom.js         helpers (DOM, formatting, files); styles.js: the CSS
//   setup.js       Job setup (demos, files, settings form, job controls)
//   progress.js, charts.js (Metrics), checkpoints.js, diagnostics.js,
//   peers.js (Peers & invitations), saved.js (Saved jobs), debuglog.js (Debug log)

import { h, errorText, liveRegion } from './dom.js';
import { CSS } from './styles.js';
import { Setup } from './setup.js';
import { Progress } from './progress.js';
import { Metrics } from './charts.js';
import { Checkpoints } from './checkpoints.js';
import { Diagnostics } from './diagnostics.js';
import { Peers, ROOM_CSS } from './peers.js';
import { NAMES_CSS } from './names.js';
import { TryIt, TRY_CSS } from './tryit.js';
import { StorageUse } from './storage.js';
import { PEERCARDS_CSS } from './peercards.js';
import { Events, EVENTS_CSS } from './events.js';
import { statusText } from './status.js';
import { Saved } from './saved.js';
import { DebugLog } from './debuglog.js';

let mounted = null;

/**
 * Open the window in `container` (default: document.body). Returns {close()}.
 * A second call while it is open brings the same window back into view.
 */
export function mountWidget(api, { container = null, onClose = null, starting = null } = {}) {
  if (!api || typeof api.getState !== 'function') throw new Error('mountWidget needs the distributed-training API');
  if (mounted && mounted.host.isConnected && mounted.api === api) {
    mounted.focus();
    return mounted.handle;
  }
  const host = document.createElement('div');
  host.setAttribute('data-weei-widget', 'distributed-training');
  const root = host.attachShadow({ mode: 'open' });
  // Constructed style sheets: a page whose Content-Security-Policy allows no inline style (Weei's own
  // landing page, or a strict embedding page) applies them, where it would refuse <style> elements.
  if (typeof CSSStyleSheet === 'function' && 'adoptedStyleSheets' in root && 'replaceSync' in CSSStyleSheet.prototype) {
    root.adoptedStyleSheets = [CSS, ROOM_CSS, NAMES_CSS, TRY_CSS, PEERCARDS_CSS, EVENTS_CSS].map((text) => {
      const sheet = new CSSStyleSheet();
      sheet.replaceSync(text);
      return sheet;
    });
  } else {
    root.append(h('style', { text: CSS }), h('style', { text: ROOM_CSS }), h('style', { text: NAMES_CSS }), h('style', { text: TRY_CSS }), h('style', { text: PEERCARDS_CSS }), h('style', { text: EVENTS_CSS }));
  }
  (container || document.body).append(host);

  const widget = new Widget(api, root, host, () => { if (onClose) onClose(); }, starting);
  mounted = widget;
  return widget.handle;
}

const SECTIONS = [
  ['setup', 'Job setup'], ['progress', 'Progress'], ['events', 'Events'], ['metrics', 'Metrics'], ['checkpoints', 'Checkpoints'], ['tryit', 'Try the model'],
  ['diagnostics', 'Execution diagnostics'], ['peers', 'Peers & invitations'], ['saved', 'Saved jobs'],
  ['debug', 'Debug log'],
];

class Widget {
  constructor(api, root, host, onClose, starting = null) {
    this.api = api;
    // weei.js's enable() passes a promise that settles when the API is up: until then the
    // controls are disabled and say "Starting Weei…".
    this.starting = Boolean(starting);
    if (starting) Promise.resolve(starting).finally(() => { this.starting = false; this.keys = {}; this.schedule(); });
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

    this.opener = document.activeElement; // focus goes back there on close
    this.build();
    this.win.focus();
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
    this.showError(errorText(err));
  }

  // The window's one error surface: a banner at the top of its body. It stays until the person dismisses it
  // (its Dismiss button) or acts again; a new text brings it into view, wherever the body was scrolled.
  showError(text) {
    const fresh = text !== this.globalErrorText.textContent || this.globalError.classList.contains('hidden');
    this.globalErrorText.textContent = text;
    this.globalError.classList.remove('hidden');
    if (fresh && this.globalError.scrollIntoView) this.globalError.scrollIntoView({ block: 'nearest' });
  }

  dismissError() {
    this.dismissedError = this.state && this.state.error; // the same text comes back only as a new error
    this.globalError.dataset.sticky = '';
    this.globalError.classList.add('hidden');
  }

  close() {
    if (this.closed) return;
    this.closed = true;
    clearInterval(this.timer);
    if (this.frame) cancelAnimationFrame(this.frame);
    if (this.unsubscribe) this.unsubscribe();
    this.host.remove();
    if (this.opener && this.opener.isConnected && this.opener.focus) this.opener.focus();
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
    // One error surface: a new action supersedes the banner of an older error, and an error
    // shown beside its button is not repeated in the banner (state.error says it too).
    this.dismissedError = this.state && this.state.error;
    this.inlineError = null;
    for (const el of this.root.querySelectorAll('.error[role=alert]')) {
      if (el !== this.globalError) { el.textContent = ''; el.classList.add('hidden'); }
    }
    if (button) { button.disabled = true; button.dataset.running = '1'; }
    try {
      return await fn();
    } catch (err) {
      if (errorEl) {
        this.inlineError = String(err && err.message || err);
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
    this.globalErrorText = h('span');
    const dismiss = h('button', { type: 'button', class: 'dismiss', name: 'dismissError', text: 'Dismiss' });
    dismiss.addEventListener('click', () => this.dismissError());
    this.globalError = h('div', { class: 'error hidden', role: 'alert' }, this.globalErrorText, dismiss);
    // The top of the window: incoming invitations (peers.js renderNotice), announced in a live region.
    this.noticeBox = h('div', { class: 'notices', role: 'region', 'aria-label': 'Invitations' });
    this.body = h('div', { class: 'body' }, this.noticeBox, this.globalError);
    this.sections = {};
    for (const [id, label] of SECTIONS) {
      const note = h('span', { class: 'note' });
      const content = h('div', { class: 'content' });
      const el = h('details', { class: `sec sec-${id}`, 'data-section': id, open: id !== 'debug' && id !== 'saved' },
        h('summary', {}, label, note), content);
      this.sections[id] = { el, note, content };
      this.body.append(el);
    }
    this.live = liveRegion(); // status changes and invitations, read out by screen readers
    this.win = h('div', { class: 'win', role: 'dialog', 'aria-labelledby': 'weei-title', tabindex: '-1' },
      this.head, this.buildRoomBar(), this.body, this.live);
    this.win.addEventListener('keydown', (e) => { if (e.key === 'Escape' && !e.defaultPrevented) { e.preventDefault(); this.close(); } });
    this.root.append(this.win);
    this.dragging();
    this.buildSetup();
    this.buildEvents();
    this.buildCheckpoints();
    this.buildTryIt();
    this.buildPeersDevice();
    this.buildSaved();
    this.buildStorage();
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
    // A participant whose coordinator is away does not know the job runs: it says since when it is away.
    const away = job && job.coordinatorOffline;
    const status = away ? `participant · coordinator offline${away.since ? ` since ${new Date(away.since).toLocaleTimeString()}` : ''}`
      : job ? statusText(state, job) : this.starting ? 'Starting Weei…' : 'no job';
    if (status !== this.status.textContent) this.live.textContent = `Weei: ${status}`;
    this.status.textContent = status;
    this.status.className = `chip ${job ? job.status : ''}`;
    if (!state.error) this.dismissedError = null; // the same text later is a new error
    const repeated = state.error && (state.error === this.dismissedError
      || (this.inlineError && state.error.includes(this.inlineError)));
    if (state.error && !repeated) {
      this.showError(state.error);
    } else if (this.globalError.dataset.sticky !== '1') {
      this.globalError.classList.add('hidden');
    }
    this.renderRoomBar(state);
    this.renderNotice(state);
    this.renderSetup(state, job);
    this.renderProgress(state, job);
    this.renderEvents(state);
    this.renderMetrics(state, job);
    this.renderCheckpoints(state, job);
    this.renderTryIt(state, job);
    this.renderDiagnostics(state, job);
    this.renderPeers(state, job);
    this.renderSaved(state, job);
    this.renderStorage(state, job);
    this.renderDebug(state);
  }
}

// Each section module holds its build/render methods; they become methods of Widget.
for (const section of [Setup, Progress, Events, Metrics, Checkpoints, TryIt, Diagnostics, Peers, Saved, StorageUse, DebugLog]) {
  for (const name of Object.getOwnPropertyNames(section.prototype)) {
    if (name !== 'constructor') Object.defineProperty(Widget.prototype, name, Object.getOwnPropertyDescriptor(section.prototype, name));
  }
}
