// One training Worker (worker.js, with its own Pyodide) and its request/response protocol with progress.
// The host worker (host.js) starts the page's training Workers with it; the test hooks start one too.
// The Worker is created from a same-origin Blob URL that imports the absolute URL of worker.js, so it
// works when the page's origin is not the Weei server's.
let workerBlobUrl = null;

export class WorkerClient {
  constructor() {
    if (!workerBlobUrl) {
      const source = `import ${JSON.stringify(new URL('../worker.js', import.meta.url).href)};\n`;
      workerBlobUrl = URL.createObjectURL(new Blob([source], { type: 'text/javascript' }));
    }
    this.worker = new Worker(workerBlobUrl, { type: 'module', name: 'weei-worker' });
    this.nextId = 1;
    this.pending = new Map();
    this.startSeconds = null;
    this.snapshot = null; // started from build.py's memory snapshot?
    this.ready = new Promise((resolve, reject) => {
      this._ready = { resolve, reject };
    });
    // Nobody may await `ready` (requests queue in the Worker): a failed
    // start reaches every pending request; it is not an unhandled rejection.
    this.ready.catch(() => {});
    this.worker.onmessage = (event) => this._onMessage(event.data);
    this.worker.onerror = (event) => {
      const error = new Error(`weei worker failed: ${event.message || 'could not load worker.js'}`);
      this._ready.reject(error);
      for (const { reject } of this.pending.values()) reject(error);
      this.pending.clear();
    };
  }

  _onMessage(message) {
    if (message.type === 'ready') {
      this.startSeconds = message.seconds;
      this.snapshot = Boolean(message.snapshot);
      this._ready.resolve(message.seconds);
      return;
    }
    if (message.type === 'error') {
      this._ready.reject(new Error(`weei worker start failed: ${message.message}`));
      return;
    }
    const entry = this.pending.get(message.id);
    if (!entry) return;
    if (message.type === 'progress') {
      if (entry.onProgress) entry.onProgress(message);
      return;
    }
    this.pending.delete(message.id);
    if (message.ok) entry.resolve(message);
    else {
      const e = message.error || {};
      const error = new Error(`${e.message} [${e.reason}]`);
      error.reason = e.reason;
      error.weeiMessage = e.message;
      error.kind = e.kind;
      entry.reject(error);
    }
  }

  // Sends {op, ...fields}; ArrayBuffers listed in `transfer` move to the worker.
  request(op, fields = {}, { transfer = [], onProgress = null } = {}) {
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject, onProgress });
      this.worker.postMessage({ id, op, ...fields }, transfer);
    });
  }

  terminate() {
    this.worker.terminate();
    const error = new Error('weei worker terminated');
    for (const { reject } of this.pending.values()) reject(error);
    this.pending.clear();
  }
}
