// Weei training worker: a MODULE worker (Pyodide refuses classic workers).
//
// The page creates it with `new Worker(url, {type: 'module'})`; an embedding
// page on another origin creates it from a same-origin Blob URL whose only
// line imports this file's absolute URL, so every URL here is resolved
// against import.meta.url (the Weei server), never against the page.
//
// Start-up (boot.mjs): Pyodide from the Weei server (not from the page's
// memory snapshot: see start()), the weei package (weei-py.zip) unpacked
// into Pyodide's file system, weei.browser.worker_main imported; then
// post {type: 'ready', seconds, snapshot (restored from it?)}. Requests that arrive before that wait
// in a queue. The request protocol is documented in worker_main.py; this
// file only moves messages and transfers every ArrayBuffer in a reply.
//
// trainGpu enters Python with `callPromising` (JSPI), so that the WebGPU
// shim's run_sync can wait on a promise inside it; every other request is a
// plain call. Requests run one after another even while one waits (the model
// instance is shared).
import { startPython } from './boot.mjs';

const BASE = new URL('./', import.meta.url).href;

const queue = [];
let handle = null;
let failed = null;
let chain = Promise.resolve(); // the request running now, then the next

function post(message) {
  const transfer = [];
  for (const value of Object.values(message)) {
    if (value instanceof ArrayBuffer) transfer.push(value);
  }
  self.postMessage(message, transfer);
}

function dispatch(message) {
  // run() answers every failure of the request itself; this keeps the chain going past anything else.
  chain = chain.then(() => run(message)).catch((err) => console.error('weei worker:', err));
}

async function run(message) {
  if (failed) {
    post({ type: 'reply', id: message.id, ok: false, error: { kind: 'start', reason: 'worker-start-failed', message: failed } });
    return;
  }
  let reply;
  try {
    reply = await handle(message);
  } catch (err) {
    reply = { type: 'reply', id: message.id, ok: false, error: { kind: 'internal', reason: 'internal-error', message: String(err && err.message || err) } };
  }
  post(reply);
}

self.onmessage = (event) => {
  if (handle || failed) dispatch(event.data);
  else queue.push(event.data);
};

async function start() {
  // boot.mjs: Pyodide, weei unpacked, worker_main imported. Not from build.py's memory snapshot:
  // Python records at start-up whether the runtime has stack switching (JSPI), and the snapshot,
  // made in Node without it, would say "no" here, where trainGpu's run_sync needs it.
  const { main, seconds, snapshot } = await startPython(BASE, ['weei.browser.worker_main'], { useSnapshot: false });
  main.start((message) => post(message.toJs ? message.toJs({ dict_converter: Object.fromEntries }) : message));
  // Only trainGpu waits on promises (the WebGPU shim's run_sync), so only trainGpu enters Python with
  // callPromising (JSPI): a promising call switches stacks each time, and a chunk's train is many short calls.
  // Without callPromising (no JSPI) CPU requests still work; trainGpu then fails by name (gpu-error).
  const promising = typeof main.handle.callPromising === 'function';
  handle = (message) => (promising && message && message.op === 'trainGpu'
    ? main.handle.callPromising(message)
    : main.handle(message));
  return { seconds, snapshot };
}

start().then(
  ({ seconds, snapshot }) => {
    self.postMessage({ type: 'ready', seconds, snapshot });
    while (queue.length) dispatch(queue.shift());
  },
  (err) => {
    failed = String(err && err.stack || err);
    self.postMessage({ type: 'error', message: failed });
    while (queue.length) dispatch(queue.shift());
  },
);
