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
// This file is what must exist at once (a classic script: the API object,
// getState() and the synchronous methods answer without waiting for any
// fetch). What only runs after an await is in ES modules beside it, from the
// same server, imported at first use (core.loadModule):
//   embed/tabs.js        this tab's storage slot and local peer ID (Web Locks)
//   embed/files.js       reading a job's Files, checked against the limits
//   embed/test_hooks.js  the test hooks that train or aggregate
//
// Layout:
//   1. base URL and small helpers
//   2. PagePython: the page's Pyodide, started lazily
//   3. WorkerClient: one Worker, request/response with progress
//   4. API registry: widgetsApi.get(name) -> factory per widget name
//   5. the 'distributed-training' API: the bridge to the page's
//      TrainingController (weei.browser.page_api); every method forwards
//   6. loadWeei / weeiReady, and the test hooks
//
// Test hooks (train once in a Worker, aggregate, the embed script's status,
// storage keys) are not on the API object. They are reachable as
// window.__weeiTestHooks.get('distributed-training') only on a page that
// asks for them: window.WEEI_TEST_HOOKS = true before this script runs, or
// a data-test-hooks attribute on its <script> tag (index.html has one).
(() => {
  'use strict';
  if (window.weeiReady) return; // the script was included twice

  // ---- 1. base URL and helpers ---------------------------------------------
  const script = document.currentScript;
  const BASE = new URL('./', script && script.src ? script.src : location.href).href;
  const VERSION = '0.1.0';

  const url = (path) => new URL(path, BASE).href;

  // A room key in the query (?room=KEY, the older link form) reached the server with the page request;
  // weei serve logs no request lines, but a proxy in front may. The key moves into the fragment at
  // once, before anything else here, so the address bar, the history, a bookmark, a copied link and
  // later Referer headers carry it only where HTTP never sends it (docs/signaling.md "Rooms and keys").
  // A key already in the fragment stays the one used (the fragment is read first).
  (function moveRoomKeyIntoFragment() {
    const query = new URLSearchParams(location.search);
    const key = query.get('room');
    if (key === null) return;
    query.delete('room');
    const fragment = location.hash.slice(1);
    const hash = new URLSearchParams(fragment).has('room') ? fragment
      : `${fragment ? fragment + '&' : ''}room=${encodeURIComponent(key)}`;
    const search = query.toString();
    try {
      history.replaceState(history.state, '', `${location.pathname}${search ? '?' + search : ''}#${hash}`);
    } catch (err) { // a sandboxed or opaque document: the key is still read from the query below
      console.warn('[weei] could not move the room key out of the query:', err);
    }
  })();

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

  // This tab's peer ID when it trains without a room (a room's signaling
  // server names the peer instead): made here, before the page's Python
  // starts, so getState().myPeerId is known from weeiReady on. The page's
  // Python (page_main._peer_id) reads the same sessionStorage key.
  const PEER_ID_KEY = 'weei.peerId';

  function tabPeerId({ fresh = false } = {}) {
    try {
      const existing = fresh ? null : sessionStorage.getItem(PEER_ID_KEY);
      if (existing) return existing;
      const bytes = crypto.getRandomValues(new Uint8Array(8));
      const peer = 'peer-' + Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('');
      sessionStorage.setItem(PEER_ID_KEY, peer);
      return peer;
    } catch {
      return ''; // no sessionStorage (a sandboxed frame): the page's Python picks one
    }
  }

  // One of the embed script's own ES modules (embed/*.js, from the Weei server like boot.mjs), imported at first use.
  const loadModule = (path) => import(url(path));

  function log(...args) {
    if (window.WEEI_DEBUG) console.log('[weei]', ...args);
  }

  // value, or a Promise of it -> f(value), or a Promise of that.
  const then = (value, f) => (value instanceof Promise ? value.then(f) : f(value));

  // Each widget API's internals (its test hooks and its start), by widget name.
  const internals = new Map();

  // ---- 2. PagePython ----------------------------------------------------------
  // The page's Pyodide, started on first use or when idle after weeiReady.
  const pagePython = {
    state: 'not-started', // not-started | starting | ready | failed
    error: null,
    seconds: null,
    snapshot: null, // restored from build.py's memory snapshot (weei-snapshot.bin)?
    promise: null,
    start() {
      if (this.promise) return this.promise;
      this.state = 'starting';
      const t0 = performance.now();
      this.promise = (async () => {
        const { startPython, nextTask } = await import(url('boot.mjs'));
        // page_main imports webgpu, which the snapshot leaves out: two imports, a yield between.
        // WEEI_NO_SNAPSHOT: start the ordinary way. A restored snapshot cannot run_sync (it was made in
        // Node, without the JSPI the page has), which only code driving WebGPU from the page's Python needs.
        const { pyodide, main, snapshot } = await startPython(BASE, ['weei.browser.webgpu', 'weei.browser.page_main'],
          { pause: nextTask, useSnapshot: !globalThis.WEEI_NO_SNAPSHOT });
        this.snapshot = snapshot;
        await nextTask();
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
        if (!factory) return undefined;
        widgetApis.set(name, factory(core));
      }
      return widgetApis.get(name);
    },
    list() {
      return Array.from(widgetFactories.keys());
    },
  };

  // What every widget API builds on.
  const core = { BASE, url, fetchOk, sha256Hex, loadModule, pagePython, WorkerClient, log, backgroundTasks: [], internals };

  // ---- 5. 'distributed-training' ------------------------------------------------------
  // The API object. Every method forwards to the page's TrainingController
  // (weei.api, bound to IndexedDB, localStorage and Workers by
  // weei.browser.page_main); nothing here decides anything. Calls go through
  // weei.browser.page_api.PageApi: call(name, argsJson, buffers) for async
  // methods, call_sync(name, argsJson) for synchronous ones; each returns an
  // envelope {ok, json | file | error}. A job's Files become ArrayBuffers in
  // embed/files.js (their names kept), after every size was checked.
  const TRAINING_STATE_FIELDS = () => ({
    ready: true, myPeerId: '', busy: true, preparing: false, transitioning: false, evaluating: false,
    peers: [], invitations: [], progress: {}, liveMetrics: {}, transfers: [], transferErrors: {},
    pausedContribution: false, activeWorkers: 0, backendPreference: 'auto',
    execution: { requested: 'auto', actual: 'unknown', phase: 'waiting', fallback: 'none' },
    maxLocalWorkers: navigator.hardwareConcurrency || 1, gpuMemoryBudgetMiB: 512, diagnostics: {}, savedJobs: [],
  });

  function weeiError(reason, message, kind = 'UsageError') {
    const error = new Error(message);
    error.name = 'WeeiError';
    error.reason = reason;
    error.kind = kind;
    return error;
  }

  function unwrap(envelope) {
    if (!envelope.ok) {
      const e = envelope.error || {};
      throw weeiError(e.reason || 'internal-error', e.message || 'unknown error', e.kind);
    }
    if (envelope.file) return envelope.file;
    return envelope.json === undefined || envelope.json === 'null' ? undefined : JSON.parse(envelope.json);
  }

  // The controller starts in the background too (as the page's Python
  // does), so a job interrupted by a reload continues without any call.
  core.backgroundTasks.push(() => {
    widgetsApi.get('distributed-training');
    internals.get('distributed-training').startApi()
      .catch((err) => console.warn('[weei] the training API could not start:', err));
  });

  registerWidgetApi('distributed-training', (core) => {
    let worker = null;
    const stats = { trainings: 0, lastTraining: null };

    // -- the page's controller ----------------------------------------------------
    const bridge = { api: null, promise: null, error: null, seconds: null, listening: false, slot: null };
    const listeners = new Set();

    function deliver(state) {
      for (const listener of Array.from(listeners)) {
        try {
          listener(structuredClone(state));
        } catch (err) {
          console.error('[weei] a subscribe() listener failed:', err);
        }
      }
    }

    function syncListening() {
      const want = listeners.size > 0;
      if (!bridge.api || want === bridge.listening) return;
      bridge.listening = want;
      bridge.api.listen(want);
    }

    // The room key: from the invite link's fragment (#room=KEY; a fragment reaches no HTTP log and
    // no Referer; a ?room= key was moved there above), else ?room= (where the move failed) or
    // data-room on the script tag. docs/signaling.md "Rooms and keys".
    const room = new URLSearchParams(location.hash.slice(1)).get('room')
      || new URLSearchParams(location.search).get('room') || (script && script.dataset.room) || null;
    function roomInvite() {
      if (!room) return null;
      const link = new URL(location.href);
      link.searchParams.delete('room');
      link.hash = `room=${encodeURIComponent(room)}`;
      return { key: room, invite: link.href };
    }
    let localPeerId = room ? '' : tabPeerId();

    // This tab's storage slot and local peer ID, held for its lifetime (embed/tabs.js, docs/api.md "Tabs").
    async function holdTab() {
      const tabs = await loadModule('embed/tabs.js');
      const held = await tabs.holdTab({ peerId: localPeerId, newPeerId: () => tabPeerId({ fresh: true }) });
      bridge.slot = held.slot;
      if (held.peerId !== localPeerId) { // a duplicated tab: the original holds the copied peer ID
        localPeerId = held.peerId;
        deliver(getState());
      }
      return tabs.namespaceOf(held.slot);
    }

    // The readers of a job's files (embed/files.js), imported at the first createJob or continueFromCheckpoint.
    let filesModule = null;
    function files() {
      if (!filesModule) {
        filesModule = loadModule('embed/files.js').then((m) => m.packageFiles(weeiError));
        filesModule.catch(() => { filesModule = null; }); // a failed fetch is tried again at the next call
      }
      return filesModule;
    }

    function startApi() {
      if (bridge.promise) return bridge.promise;
      const t0 = performance.now();
      bridge.promise = (async () => {
        const [{ session }, namespace] = await Promise.all([core.pagePython.start(), holdTab()]);
        const api = await session.open_api({
          namespace, // this tab's storage (see holdTab)
          // Peers meet in a room: ?room=CODE on the page, or data-room on the script tag.
          room,
          createWorker: () => new core.WorkerClient(),
          onState: (text) => deliver(JSON.parse(text)),
          // Tests shorten the Worker task deadlines (never set on a page without the test hooks).
          taskDeadlinesMs: window.__weeiTestHooks ? window.WEEI_TASK_DEADLINES_MS : undefined,
        });
        bridge.api = api;
        bridge.seconds = (performance.now() - t0) / 1000;
        core.log('API ready in', bridge.seconds, 's');
        syncListening();
        if (!bridge.listening) deliver(JSON.parse(api.get_state_json()));
        return api;
      })().catch((err) => {
        // A Python exception's message is its traceback: keep the last line.
        bridge.error = String(err && err.message || err).trim().split('\n').pop();
        const error = weeiError('python-unavailable', `Weei could not start in this page: ${bridge.error}`, 'InternalError');
        deliver(getState());
        throw error;
      });
      return bridge.promise;
    }

    async function callAsync(name, args = {}, buffers = undefined) {
      const api = await startApi();
      return unwrap(await api.call(name, JSON.stringify(args), buffers));
    }

    // A synchronous method answers at once when the controller runs. While
    // it is still starting (the seconds after weeiReady), the call waits for
    // it and the method returns a Promise of the same answer, so the API is
    // usable from weeiReady on: `await training.exportCheckpoint()` works
    // either way.
    function callSync(name, args = {}) {
      if (!bridge.api) {
        if (bridge.error) throw weeiError('python-unavailable', `Weei could not start in this page: ${bridge.error}`, 'InternalError');
        return startApi().then((api) => unwrap(api.call_sync(name, JSON.stringify(args))));
      }
      return unwrap(bridge.api.call_sync(name, JSON.stringify(args)));
    }

    function getState() {
      if (bridge.api) return JSON.parse(bridge.api.get_state_json());
      const state = TRAINING_STATE_FIELDS();
      state.myPeerId = localPeerId;
      if (bridge.error) {
        state.busy = false;
        state.error = `Weei could not start in this page: ${bridge.error}`;
      }
      return state;
    }

    function toFile(file, type) {
      return new File([file.bytes], file.name, { type });
    }

    // The debug log (a TrainingDebugLogFile) as the JSON file a person saves.
    function debugLogFile(log) {
      const stamp = String(log.exportedAt).replace(/[:.]/g, '-');
      return new File([JSON.stringify(log, null, 2)], `weei-debug-log-${stamp}.json`, { type: 'application/json' });
    }

    // -- the API object ------------------------------------------------------------------
    const api = {
      getState,
      subscribe(listener) {
        if (typeof listener !== 'function') throw weeiError('invalid-argument', 'subscribe() takes a function');
        listeners.add(listener);
        listener(getState());
        syncListening();
        if (!bridge.promise) startApi().catch(() => {});
        let active = true;
        return () => {
          if (!active) return;
          active = false;
          listeners.delete(listener);
          syncListening();
        };
      },
      async createJob(job) {
        const { args, buffers } = await (await files()).readPackage(job, 'createJob');
        return callAsync('createJob', args, buffers);
      },
      async continueFromCheckpoint(job) {
        const { args, buffers } = await (await files()).readContinuation(job);
        return callAsync('continueFromCheckpoint', args, buffers);
      },
      invite(peerId) { return callSync('invite', { peerId }); },
      decideInvitation(jobId, accepted) { return callAsync('decideInvitation', { jobId, accepted: !!accepted }); },
      start() { return callAsync('start'); },
      pause() { return callAsync('pause'); },
      resume() { return callAsync('resume'); },
      stop() { return callAsync('stop'); },
      updateSettings(settings) { return callAsync('updateSettings', { settings }); },
      // Warnings for legal settings that are likely mistakes, with the job's estimated time (docs/api.md).
      reviewSettings(settings, manifest) { return callSync('reviewSettings', { settings, manifest: manifest ?? null }); },
      runValidation() { return callAsync('runValidation'); },
      shuffleChunks() { return callAsync('shuffleChunks'); },
      exportCheckpoint() {
        return then(callSync('exportCheckpoint'), (file) => toFile(file, 'application/octet-stream'));
      },
      exportModule() {
        return then(callSync('exportModule'), (file) => (file ? toFile(file, 'application/wasm') : undefined));
      },
      leave() { return callAsync('leave'); },
      // The room this page meets its peers in and its invite link ({key, invite}), or null.
      getRoom() { return roomInvite(); },
      getDebugLog() { return callSync('getDebugLog'); },
      exportDebugLog() { return then(callSync('getDebugLog'), debugLogFile); },
      clearDebugLog() { return then(callSync('clearDebugLog'), () => undefined); },
      setMaxLocalWorkers(count) { return callAsync('setMaxLocalWorkers', { count }); },
      setGpuMemoryBudgetMiB(mib) { return callAsync('setGpuMemoryBudgetMiB', { mib }); },
      setBackendPreference(preference) { return callAsync('setBackendPreference', { preference }); },
      pauseContribution(paused) { return callAsync('pauseContribution', { paused: !!paused }); },
      listSavedJobs() { return callAsync('listSavedJobs'); },
      openSavedJob(jobId) { return callAsync('openSavedJob', { jobId }); },
      deleteSavedJob(jobId) { return callAsync('deleteSavedJob', { jobId }); },
      async enable(options = {}) {
        const where = core.url('widget.js');
        let module;
        try {
          module = await import(where);
        } catch (err) {
          throw weeiError('widget-unavailable', `the built-in window could not be loaded from ${where}: ${err && err.message || err}`);
        }
        if (typeof module.mountWidget !== 'function') {
          throw weeiError('widget-unavailable', `${where} does not export mountWidget(api, options)`);
        }
        // Until the API is up the window's controls are disabled and say "Starting Weei…".
        const starting = bridge.api ? null : startApi().then(() => {}, () => {});
        return module.mountWidget(api, { ...options, starting });
      },
    };

    // -- test hooks (not part of the API: see the header) ------------------------------
    function getWorker() {
      if (!worker) worker = new core.WorkerClient();
      return worker;
    }

    const testHooks = () => core.loadModule('embed/test_hooks.js');

    internals.set('distributed-training', {
      async trainOnce(modelId, options) {
        const summary = await (await testHooks()).trainOnce(core, getWorker(), modelId, options);
        stats.trainings += 1;
        stats.lastTraining = { modelId, seconds: summary.trainSeconds };
        return summary;
      },
      aggregate: async (spec) => (await testHooks()).aggregate(core, spec),
      worker: getWorker,
      startPagePython: () => core.pagePython.start().then(() => core.pagePython.seconds),
      startApi: () => startApi().then(() => bridge.seconds),
      // The embed script's own status (what getState() returned before the API).
      status: () => ({
        version: VERSION,
        baseUrl: core.BASE,
        pagePython: core.pagePython.state,
        pagePythonError: core.pagePython.error,
        pagePythonSnapshot: core.pagePython.snapshot,
        api: bridge.api ? 'ready' : (bridge.error ? 'failed' : (bridge.promise ? 'starting' : 'not-started')),
        // This tab's storage slot (null until the API starts): 0 is the database `weei`.
        slot: bridge.slot,
        apiError: bridge.error,
        apiSeconds: bridge.seconds,
        worker: worker ? (worker.startSeconds === null ? 'starting' : 'ready') : 'none',
        trainings: stats.trainings,
        lastTraining: stats.lastTraining,
      }),
      storageKeys: (store) => callAsync('debugStorageKeys', { store }),
      idle: () => callAsync('debugIdle'),
    });
    return api;
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
        idle(() => {
          core.pagePython.start().catch((err) => console.warn('[weei] page Python failed:', err));
          for (const task of core.backgroundTasks) task();
        });
      };
      if (document.readyState === 'complete') kick();
      else window.addEventListener('load', kick, { once: true });
    }
    return readyPromise;
  }

  window.loadWeei = loadWeei;
  window.weeiReady = loadWeei();

  if (window.WEEI_TEST_HOOKS === true || (script && script.hasAttribute('data-test-hooks'))) {
    window.__weeiTestHooks = {
      get(name) {
        return widgetsApi.get(name) ? internals.get(name) : undefined;
      },
    };
  }
})();
