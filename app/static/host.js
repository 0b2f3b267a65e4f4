// The host worker: the page's Python (weei.browser.page_main, the TrainingController) in a dedicated
// module Worker, so the page's main thread never runs Pyodide's start-up or the controller's work
// (docs/browser.md "The host worker"). weei.js starts it from a same-origin Blob URL that imports this
// file's absolute URL, so every URL here is resolved against import.meta.url (the Weei server).
//
// What a Worker lacks comes from the page: localStorage and sessionStorage are mirrors of the page's weei
// keys (each write is sent to the page), RTCPeerConnection is a stand-in whose real object lives on the
// page (embed/rtc_worker.js, embed/rtc_bridge.js). Training Workers are nested in this one.
//
// Messages from the page: open {hooks, storage}, call {id, name, args, buffers}, callSync {id, name, args},
// rtc {event, ...}, and the test hooks' aggregate {id, spec}, runPython {id, code}, marks {id}. To the page:
// booted | boot-failed, opened | open-failed, publish {state: json | null, mirrors: [{name, value}]},
// storage {area, key, value},
// rtc {op, ...}, reply {id, envelope | value}. A reply comes after the state and mirrors it changed
// (PageApi.publish), so a call's promise settles after the page has seen its effect.
import { startPython, nextTask } from './boot.mjs';
import { rtcStandIns } from './embed/rtc_worker.js';
import { WorkerClient } from './embed/worker_client.js';

const BASE = new URL('./', import.meta.url).href;
const REFRESH_MS = 1000;

// ---- storage the Worker lacks: localStorage / sessionStorage mirrors --------------------------
// Seeded from the page at 'open' (weei's keys); each write is applied here at once (reads stay
// synchronous) and posted to the page, which writes it to its real storage.
class MirroredStorage {
  constructor(area, entries) {
    this.area = area;
    this.map = new Map(Object.entries(entries || {}));
  }
  getItem(key) { return this.map.has(String(key)) ? this.map.get(String(key)) : null; }
  setItem(key, value) {
    this.map.set(String(key), String(value));
    self.postMessage({ type: 'storage', area: this.area, key: String(key), value: String(value) });
  }
  removeItem(key) {
    this.map.delete(String(key));
    self.postMessage({ type: 'storage', area: this.area, key: String(key), value: null });
  }
}

// ---- the API -----------------------------------------------------------------------------------
// The PageApi once 'open' has made it (requests wait for it; a failed open fails startApi on the page).
let openedResolve = null;
const apiReady = new Promise((resolve) => { openedResolve = resolve; });

const rtc = rtcStandIns((message, transfer = []) => self.postMessage(message, transfer));
globalThis.RTCPeerConnection = rtc.RTCPeerConnection;

function plain(value) {
  if (!value || typeof value !== 'object' || !value.toJs) return value;
  const out = value.toJs({ dict_converter: Object.fromEntries });
  value.destroy();
  return out;
}

// An envelope's exported file ({name, bytes}) as the File the page returns: made here, so the page's
// thread never copies it (a File crosses to the page by reference).
const FILE_TYPES = { checkpoint: 'application/octet-stream', module: 'application/wasm' };
function withFile(envelope, type) {
  if (envelope && envelope.ok && envelope.file) envelope.file = new File([envelope.file.bytes], envelope.file.name, { type });
  return envelope;
}

// What one PageApi.publish() sent, as one message: the page never sees a state without the mirrors that
// go with it (a peer in getState().peers that invite() would not know yet).
let batch = null;
function published(field, value) {
  if (!batch) {
    batch = { type: 'publish', state: null, mirrors: [] };
    queueMicrotask(sendBatch);
  }
  if (field === 'state') batch.state = value;
  else batch.mirrors.push(value);
}
function sendBatch() {
  if (batch) self.postMessage(batch);
  batch = null;
}

function reply(api, id, envelope, extra = {}) {
  api.publish(); // the state and mirrors first: the page sees a call's effect when its promise settles
  sendBatch();
  self.postMessage({ type: 'reply', id, envelope, ...extra });
}

async function open(message) {
  globalThis.localStorage = new MirroredStorage('local', message.storage.local);
  globalThis.sessionStorage = new MirroredStorage('session', message.storage.session);
  const { session } = await booted;
  const t0 = performance.now();
  const api = await session.open_api({
    ...message.hooks,
    createWorker: () => new WorkerClient(),
    onState: (text) => published('state', text),
    onMirror: (name, value) => published('mirror', { name, value: withFile(plain(value), FILE_TYPES[name]) }),
  });
  api.listen(true);
  api.publish(); // the mirrors, before 'opened': the synchronous methods answer from them at once
  sendBatch();
  // What changes without the controller telling (PageApi.refresh): published within a second.
  setInterval(() => api.refresh(), REFRESH_MS);
  self.postMessage({ type: 'opened', seconds: (performance.now() - t0) / 1000, json: api.get_state_json() });
  return api;
}

async function handle(message) {
  switch (message.type) {
    case 'open':
      open(message).then(openedResolve, (err) => {
        self.postMessage({ type: 'open-failed', message: String(err && err.message || err) });
      });
      return;
    case 'rtc':
      rtc.handle(message);
      return;
    case 'call': {
      const api = await apiReady;
      reply(api, message.id, plain(await api.call(message.name, message.args, message.buffers)));
      return;
    }
    case 'callSync': {
      const api = await apiReady;
      const envelope = plain(api.call_sync(message.name, message.args));
      reply(api, message.id, envelope, message.name === 'clearDebugLog' ? { debugLog: plain(api.debug_log()) } : {});
      return;
    }
    // Test hooks (embed/test_hooks.js): one aggregation in this Python, Python's own answer to a line, the marks.
    case 'aggregate': {
      const { session } = await booted;
      try {
        const out = plain(await session.debug_aggregate(message.spec));
        self.postMessage({ type: 'reply', id: message.id, ok: true, value: out },
          [out.weights, out.state].filter((b) => b instanceof ArrayBuffer));
      } catch (err) {
        self.postMessage({ type: 'reply', id: message.id, ok: false, error: String(err && err.message || err) });
      }
      return;
    }
    case 'runPython': {
      const { pyodide } = await booted;
      self.postMessage({ type: 'reply', id: message.id, ok: true, value: String(pyodide.runPython(message.code)) });
      return;
    }
    case 'marks':
      self.postMessage({ type: 'reply', id: message.id, ok: true, value: performance.getEntriesByType('mark')
        .filter((m) => m.name.startsWith('weei:')).map((m) => [m.name, m.startTime + performance.timeOrigin]) });
      return;
    default:
      console.warn('[weei host] unknown message', message.type);
  }
}

self.onmessage = (event) => {
  handle(event.data).catch((err) => console.error('[weei host]', err));
};

const booted = (async () => {
  const t0 = performance.now();
  const { pyodide, main, snapshot } = await startPython(BASE, ['weei.browser.webgpu', 'weei.browser.page_main'],
    { pause: nextTask, useSnapshot: new URL(import.meta.url).searchParams.get('snapshot') !== 'no' });
  const session = main.start(BASE);
  self.postMessage({ type: 'booted', seconds: (performance.now() - t0) / 1000, snapshot });
  return { pyodide, main, session };
})();
booted.catch((err) => self.postMessage({ type: 'boot-failed', message: String(err && err.stack || err) }));
