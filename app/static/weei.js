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
//   5. the 'distributed-training' API: every method forwards to the page's
//      TrainingController (weei.browser.page_api)
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
  const core = { BASE, url, fetchOk, sha256Hex, pagePython, WorkerClient, log, backgroundTasks: [], internals };

  // ---- 5. 'distributed-training' ------------------------------------------------------
  // The API object. Every method forwards to the page's TrainingController
  // (weei.api, bound to IndexedDB, localStorage and Workers by
  // weei.browser.page_main); nothing here decides anything. Calls go through
  // weei.browser.page_api.PageApi: call(name, argsJson, buffers) for async
  // methods, call_sync(name, argsJson) for synchronous ones; each returns an
  // envelope {ok, json | file | error}. Files become ArrayBuffers here (their
  // names kept), after every size was checked.
  // The spec's limits (weei.core.limits): checkpoints and modules (and every other file) 256 MB,
  // an auxiliary weights file 2 GiB.
  const MAX_FILE_BYTES = 256 * 1000 * 1000;
  const MAX_AUXILIARY_BYTES = 2 * 1024 ** 3;
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
    // no Referer), else ?room= or data-room on the script tag. docs/signaling.md "Rooms and keys".
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

    // Each tab is its own peer with its own storage namespace: slot 0 is the
    // IndexedDB database `weei` (and the bare localStorage keys), slot N the
    // database `weei-tab-N` (keys prefixed `weei-tab-N:`). A slot is held by a
    // Web Lock for the tab's lifetime, so two controllers never continue the
    // same saved job; the tab keeps its slot across reloads (sessionStorage),
    // and a new tab takes the lowest free one (so a tab opened after the
    // others closed finds the saved jobs of slot 0). docs/api.md "Tabs".
    const SLOT_KEY = 'weei.tabSlot';
    const slotLock = (n) => `weei.distributed-training.slot-${n}`;
    const namespaceOf = (n) => (n === 0 ? '' : `weei-tab-${n}`);

    // true: held for the tab's lifetime; false: taken (or waited long enough: AbortSignal.timeout rejects
    // with a TimeoutError); null: no locks here.
    function tryHold(name, options) {
      const forever = () => new Promise(() => {});
      return new Promise((answer) => {
        navigator.locks.request(name, options, (lock) => {
          answer(Boolean(lock));
          return lock ? forever() : undefined;
        }).catch((err) => answer(err && (err.name === 'AbortError' || err.name === 'TimeoutError') ? false : null));
      });
    }
    // Waits a little for a lock the tab's previous document held: a reload's old document lets go as it unloads.
    const waitLittle = () => (typeof AbortSignal.timeout === 'function' ? { signal: AbortSignal.timeout(1500) } : { ifAvailable: true });
    const hasLocks = () => Boolean(navigator.locks && typeof navigator.locks.request === 'function');

    // The local peer ID (a tab without a room) is held by a Web Lock too: a duplicated tab copied the
    // original's sessionStorage, and with it the peer ID the original still holds, so it makes its own.
    // Resolved before the page's Python reads the ID (page_main._peer_id); until then getState() says
    // the copied one.
    async function holdPeerId() {
      if (!localPeerId || !hasLocks()) return;
      if (await tryHold(`weei.distributed-training.peer-${localPeerId}`, waitLittle()) !== false) return;
      localPeerId = tabPeerId({ fresh: true });
      if (localPeerId) await tryHold(`weei.distributed-training.peer-${localPeerId}`, { ifAvailable: true });
      deliver(getState());
    }

    function holdSlot() {
      let remembered = null;
      try { remembered = Number.parseInt(sessionStorage.getItem(SLOT_KEY), 10); } catch { /* no sessionStorage */ }
      const mine = Number.isInteger(remembered) && remembered >= 0 ? remembered : null;
      const keep = (n) => {
        try { sessionStorage.setItem(SLOT_KEY, String(n)); } catch { /* no sessionStorage */ }
        bridge.slot = n;
        return n;
      };
      // Without Web Locks (not a secure context) there is no guard: the remembered slot, else 0.
      if (!hasLocks()) return Promise.resolve(keep(mine ?? 0));
      return (async () => {
        // A reload: the old document's lock goes as it unloads, so wait a little for our slot.
        // A duplicated tab copied sessionStorage: the original still holds the slot; take another.
        if (mine !== null) {
          const held = await tryHold(slotLock(mine), waitLittle());
          if (held !== false) return keep(mine); // held, or unguarded
        }
        for (let n = 0; ; n += 1) {
          const held = n === mine ? false : await tryHold(slotLock(n), { ifAvailable: true });
          if (held) return keep(n);
          if (held === null) {
            console.warn('[weei] no Web Locks here: this tab shares its storage with other tabs');
            return keep(mine ?? 0);
          }
        }
      })();
    }

    function startApi() {
      if (bridge.promise) return bridge.promise;
      const t0 = performance.now();
      bridge.promise = (async () => {
        const [{ session }, slot] = await Promise.all([core.pagePython.start(), holdSlot(), holdPeerId()]);
        const api = await session.open_api({
          namespace: namespaceOf(slot), // this tab's storage (see holdSlot)
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

    // -- files ----------------------------------------------------------------------
    function fileName(blob, fallback) {
      return typeof blob.name === 'string' && blob.name ? blob.name : fallback;
    }

    function requireFile(value, what, limit = MAX_FILE_BYTES) {
      if (!(value instanceof Blob)) throw weeiError('missing-file', `${what}: a File is required`, 'ManifestError');
      if (value.size > limit) {
        const label = limit === MAX_AUXILIARY_BYTES ? '2 GiB' : '256 MB';
        throw weeiError('file-too-large', `${fileName(value, what)}: ${value.size} bytes is over the ${label} limit`, 'ManifestError');
      }
      return value;
    }

    // The file names a package lists as auxiliary weights slots: they may be up to 2 GiB.
    // A manifest that does not parse lists none; Python reports why it does not parse.
    async function auxiliaryNames(manifest) {
      try {
        const slots = JSON.parse(await manifest.text()).auxiliaryWeights;
        return new Set(Array.isArray(slots) ? slots.map((s) => s && s.fileName).filter((n) => typeof n === 'string') : []);
      } catch (err) {
        return new Set();
      }
    }

    async function read(blob) {
      try {
        return await blob.arrayBuffer();
      } catch (err) {
        throw weeiError('file-unreadable', `${fileName(blob, 'a file')}: could not be read (${err && err.message || err})`, 'ManifestError');
      }
    }

    // {wasm, manifest, files, validation?, executionFiles?} -> call arguments
    // and ArrayBuffers. Every size is checked before anything is read.
    async function readPackage(job, method) {
      if (!job || typeof job !== 'object') throw weeiError('invalid-argument', `${method}() takes an object`);
      const wasm = requireFile(job.wasm, 'wasm');
      const manifest = requireFile(job.manifest, 'manifest');
      const files = job.files === undefined ? [] : job.files;
      if (!files || typeof files[Symbol.iterator] !== 'function') throw weeiError('invalid-argument', 'files must be a list of Files');
      const auxiliary = await auxiliaryNames(manifest);
      const list = Array.from(files, (f, i) => requireFile(f, `files[${i}]`,
        f instanceof Blob && auxiliary.has(fileName(f, '')) ? MAX_AUXILIARY_BYTES : MAX_FILE_BYTES));
      const names = list.map((f, i) => fileName(f, `file-${i}`));
      const duplicate = names.find((n, i) => names.indexOf(n) !== i);
      if (duplicate !== undefined) throw weeiError('duplicate-file', `${duplicate}: selected twice`, 'ManifestError');
      const validation = job.validation == null ? null : requireFile(job.validation, 'validation');
      // executionFiles: the package's WGSL archive (checked in Python against its shaderArchive).
      const execution = job.executionFiles == null ? [] : Array.from(job.executionFiles, (f, i) => requireFile(f, `executionFiles[${i}]`));
      const [wasmBuffer, manifestBuffer, validationBuffer, ...rest] = await Promise.all([
        read(wasm), read(manifest), validation ? read(validation) : null, ...list.map(read), ...execution.map(read),
      ]);
      const fileBuffers = rest.slice(0, list.length);
      const args = {
        wasmName: fileName(wasm, 'model.wasm'), fileNames: names, settings: job.settings,
        validationName: validation ? fileName(validation, 'validation') : null,
        executionNames: execution.map((f, i) => fileName(f, `execution-${i}`)),
      };
      const buffers = { wasm: wasmBuffer, manifest: manifestBuffer, files: fileBuffers, execution: rest.slice(list.length) };
      if (validationBuffer) buffers.validation = validationBuffer;
      return { args, buffers };
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
        const { args, buffers } = await readPackage(job, 'createJob');
        return callAsync('createJob', args, buffers);
      },
      async continueFromCheckpoint(job) {
        if (!job || typeof job !== 'object') throw weeiError('invalid-argument', 'continueFromCheckpoint() takes an object');
        const checkpoint = requireFile(job.checkpoint, 'checkpoint');
        const [{ args, buffers }, checkpointBuffer] = await Promise.all([
          readPackage(job, 'continueFromCheckpoint'), read(checkpoint)]);
        buffers.checkpoint = checkpointBuffer;
        args.datasetMode = job.datasetMode;
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

    internals.set('distributed-training', {
      trainOnce,
      aggregate,
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
