// Weei embed script. One tag on any page, any origin:
//
//   <script src="http://127.0.0.1:8000/weei.js"></script>
//   <script>weeiReady.then((weei) => weei.widgetsApi.get('distributed-training'))</script>
//
// Defines window.loadWeei() and window.weeiReady (a promise of the API
// object, also set as window.weei). The API object exists at once: nothing
// here waits for Pyodide. The page's own Python (aggregation, later the
// coordinator) starts lazily in the background after weeiReady; training
// runs in module Workers, each with its own Pyodide (worker.js).
//
// Layout, so the full API can slot in:
//   1. base URL and small helpers
//   2. PagePython: the page's Pyodide, started lazily
//   3. WorkerClient: one Worker, request/response with progress
//   4. API registry: widgetsApi.get(name) -> factory per widget name
//   5. the 'distributed-training' API (today: getState and _debug hooks)
//   6. loadWeei / weeiReady
(() => {
  'use strict';
  if (window.weeiReady) return; // the script was included twice

  // ---- 1. base URL and helpers ---------------------------------------------
  const script = document.currentScript;
  const BASE = new URL('./', script && script.src ? script.src : location.href).href;
  const VERSION = '0.1.0';
  const PY_DIR = '/weei-py';

  const url = (path) => new URL(path, BASE).href;

  async function fetchOk(path) {
    const response = await fetch(url(path));
    if (!response.ok) throw new Error(`GET ${url(path)}: HTTP ${response.status}`);
    return response;
  }

  async function sha256Hex(buffer) {
    const bytes = buffer instanceof ArrayBuffer ? new Uint8Array(buffer) : buffer;
    if (!(globalThis.crypto && crypto.subtle)) return null; // not a secure context
    const digest = await crypto.subtle.digest('SHA-256', bytes);
    return Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, '0')).join('');
  }

  function log(...args) {
    if (window.WEEI_DEBUG) console.log('[weei]', ...args);
  }

  // ---- 2. PagePython ----------------------------------------------------------
  // The page's Pyodide, started on first use or when idle after weeiReady.
  const pagePython = {
    state: 'not-started', // not-started | starting | ready | failed
    error: null,
    seconds: null,
    promise: null,
    start() {
      if (this.promise) return this.promise;
      this.state = 'starting';
      const t0 = performance.now();
      this.promise = (async () => {
        const [{ loadPyodide }, archive] = await Promise.all([
          import(url('pyodide/pyodide.mjs')),
          fetchOk('weei-py.zip').then((r) => r.arrayBuffer()),
        ]);
        const pyodide = await loadPyodide({ indexURL: url('pyodide/') });
        pyodide.unpackArchive(archive, 'zip', { extractDir: PY_DIR });
        pyodide.runPython(`import sys\nif ${JSON.stringify(PY_DIR)} not in sys.path: sys.path.insert(0, ${JSON.stringify(PY_DIR)})`);
        const main = pyodide.pyimport('weei.browser.page_main');
        const session = main.start(BASE);
        this.seconds = (performance.now() - t0) / 1000;
        this.state = 'ready';
        log('page Python ready in', this.seconds, 's');
        return { pyodide, session };
      })().catch((err) => {
        this.state = 'failed';
        this.error = String(err && err.message || err);
        throw err;
      });
      return this.promise;
    },
  };

  // ---- 3. WorkerClient ----------------------------------------------------------
  // A module Worker created from a same-origin Blob URL that imports the
  // absolute URL of worker.js, so it works when this page's origin is not
  // the Weei server's.
  let workerBlobUrl = null;

  class WorkerClient {
    constructor() {
      if (!workerBlobUrl) {
        const source = `import ${JSON.stringify(url('worker.js'))};\n`;
        workerBlobUrl = URL.createObjectURL(new Blob([source], { type: 'text/javascript' }));
      }
      this.worker = new Worker(workerBlobUrl, { type: 'module', name: 'weei-worker' });
      this.nextId = 1;
      this.pending = new Map();
      this.startSeconds = null;
      this.ready = new Promise((resolve, reject) => {
        this._ready = { resolve, reject };
      });
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

  // ---- 4. API registry ------------------------------------------------------------
  const widgetFactories = new Map();
  const widgetApis = new Map();

  function registerWidgetApi(name, factory) {
    widgetFactories.set(name, factory);
    widgetApis.delete(name);
  }

  const widgetsApi = {
    get(name) {
      if (!widgetApis.has(name)) {
        const factory = widgetFactories.get(name);
        if (!factory) return null;
        widgetApis.set(name, factory(core));
      }
      return widgetApis.get(name);
    },
    list() {
      return Array.from(widgetFactories.keys());
    },
  };

  // What every widget API builds on.
  const core = { BASE, url, fetchOk, sha256Hex, pagePython, WorkerClient, log };

  // ---- 5. 'distributed-training' ------------------------------------------------------
  registerWidgetApi('distributed-training', (core) => {
    let worker = null;
    const stats = { trainings: 0, lastTraining: null };

    function getWorker() {
      if (!worker) worker = new core.WorkerClient();
      return worker;
    }

    async function modelPackage(modelId) {
      const base = `models/${encodeURIComponent(modelId)}/`;
      const manifest = await (await core.fetchOk(base + 'manifest.json')).json();
      const wasm = await (await core.fetchOk(base + manifest.wasm.fileName)).arrayBuffer();
      return { base, manifest, wasm };
    }

    // Test hook: train `modelId` once in a Worker: start weights from
    // createInitialWeights(initSeed) (or `weights`), one dataset chunk
    // (index `chunk`, default 0) or an experience range.
    async function trainOnce(modelId, options = {}) {
      const {
        initSeed = '0', seed = '1', chunk = 0, experience = null, weights = null,
        settings = { localEpochs: 1, batchSize: 32 }, returnWeights = false,
      } = options;
      const t0 = performance.now();
      const client = getWorker();
      const workerStartSeconds = await client.ready;
      const pkg = await modelPackage(modelId);
      const loaded = await client.request('loadModel', { wasm: pkg.wasm }, { transfer: [pkg.wasm] });
      const start = weights
        ? weights.slice(0)
        : (await client.request('createInitialWeights', { seed: String(initSeed) })).weights;
      const startSha256 = await core.sha256Hex(start);
      const fields = { weights: start, settings };
      const transfer = [start];
      if (experience) {
        fields.experience = experience;
      } else {
        const entries = pkg.manifest.inlineJson['dataset-manifest.json'];
        const entry = entries[chunk];
        if (!entry) throw new Error(`${modelId} has no chunk ${chunk}`);
        const data = await (await core.fetchOk(pkg.base + 'data/' + entry.fileName)).arrayBuffer();
        Object.assign(fields, { data, format: entry.format, seed: String(seed) });
        transfer.push(data);
      }
      let progressReports = 0;
      const result = await client.request('train', fields, {
        transfer,
        onProgress: () => { progressReports += 1; },
      });
      const summary = {
        modelId: loaded.modelInfo.id,
        weightBytes: result.weights.byteLength,
        startSha256,
        weightsSha256: await core.sha256Hex(result.weights),
        metrics: result.metrics,
        uniqueExamples: result.uniqueExamples,
        completedUnits: result.completedUnits,
        optimizerSteps: result.optimizerSteps,
        progressReports,
        trainSeconds: result.seconds,
        workerStartSeconds,
        totalSeconds: (performance.now() - t0) / 1000,
      };
      if (returnWeights) summary.weights = result.weights;
      stats.trainings += 1;
      stats.lastTraining = { modelId, seconds: result.seconds };
      return summary;
    }

    // Test hook: aggregate one round in the page's Python (WasmKernel over
    // the browser engine). See page_main.PageSession.debug_aggregate.
    async function aggregate(spec) {
      const { session } = await core.pagePython.start();
      const result = await session.debug_aggregate(spec);
      const out = result.toJs ? result.toJs({ dict_converter: Object.fromEntries }) : result;
      if (result.destroy) result.destroy();
      return {
        weightsSha256: await core.sha256Hex(out.weights),
        stateSha256: out.state ? await core.sha256Hex(out.state) : null,
        stateStep: out.stateStep,
        seconds: out.seconds,
        weights: out.weights,
        state: out.state,
      };
    }

    return {
      getState() {
        return {
          version: VERSION,
          baseUrl: core.BASE,
          pagePython: core.pagePython.state,
          pagePythonError: core.pagePython.error,
          worker: worker ? (worker.startSeconds === null ? 'starting' : 'ready') : 'none',
          trainings: stats.trainings,
          lastTraining: stats.lastTraining,
        };
      },
      _debug: {
        trainOnce,
        aggregate,
        worker: getWorker,
        startPagePython: () => core.pagePython.start().then(() => core.pagePython.seconds),
      },
    };
  });

  // ---- 6. loadWeei / weeiReady ----------------------------------------------------------
  let readyPromise = null;

  function loadWeei(options = {}) {
    if (readyPromise) return readyPromise;
    const weei = {
      version: VERSION,
      baseUrl: BASE,
      widgetsApi,
      _internal: { core, registerWidgetApi },
    };
    window.weei = weei;
    readyPromise = Promise.resolve(weei);
    if (options.startPython !== false && !window.WEEI_NO_BACKGROUND_PYTHON) {
      // In the background, once the page has loaded and is idle.
      const kick = () => {
        const idle = window.requestIdleCallback || ((f) => setTimeout(f, 0));
        idle(() => core.pagePython.start().catch((err) => console.warn('[weei] page Python failed:', err)));
      };
      if (document.readyState === 'complete') kick();
      else window.addEventListener('load', kick, { once: true });
    }
    return readyPromise;
  }

  window.loadWeei = loadWeei;
  window.weeiReady = loadWeei();
})();
