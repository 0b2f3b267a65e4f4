// Weei embed script. One tag on any page, any origin:
//
//   <script src="http://127.0.0.1:8000/weei.js"></script>
//   <script>weeiReady.then((weei) => weei.widgetsApi.get('distributed-training'))</script>
//
// Defines window.loadWeei() and window.weeiReady (a promise of the API
// object, also set as window.weei). The API object exists at once: nothing
// here waits for Pyodide. The page's own Python (the TrainingController,
// aggregation) runs in the host worker (host.js, a module Worker with its own
// Pyodide), started lazily in the background after weeiReady: nothing of
// Pyodide runs on this thread, so start-up never blocks the page. Training
// runs in module Workers the host worker starts, each with its own Pyodide
// (worker.js).
//
// This file is what must exist at once (a classic script: the API object,
// getState() and the synchronous methods answer without waiting for any
// fetch, from what the host worker published). What only runs after an await
// is in ES modules beside it, from the same server, imported at first use
// (core.loadModule):
//   embed/tabs.js          this tab's storage slot and local peer ID (Web Locks)
//   embed/files.js         reading a job's Files, checked against the limits
//   embed/mirrors.js       what the host worker published: getState() and the synchronous methods answer from it
//   embed/rtc_bridge.js    the page's half of the WebRTC bridge (the host worker has no RTCPeerConnection)
//   embed/worker_client.js one training Worker (the host worker's and the test hooks')
//   embed/test_hooks.js    the test hooks that train or aggregate
//
// Layout:
//   1. base URL and small helpers
//   2. PagePython: the host worker, started lazily, and its messages
//   3. API registry: widgetsApi.get(name) -> factory per widget name
//   4. the 'distributed-training' API: the bridge to the TrainingController
//      in the host worker (weei.browser.page_api); every method forwards
//   5. loadWeei / weeiReady, and the test hooks
//
// Test hooks (train once in a Worker, aggregate, the embed script's status,
// storage keys) are not on the API object. They are reachable as
// window.__weeiTestHooks.get('distributed-training') only on a page that
// asks for them: window.WEEI_TEST_HOOKS = true before this script runs, or
// a data-test-hooks attribute on its <script> tag (index.html loads test-hooks.js,
// which sets WEEI_TEST_HOOKS only under weei serve --test-hooks).
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

  // Each widget API's internals (its test hooks and its start), by widget name.
  const internals = new Map();

  // ---- 2. The host worker ---------------------------------------------------------
  // The page's Python runs in the host worker (host.js: a module Worker with its own Pyodide and the
  // TrainingController), started on first use or when idle after weeiReady. This thread only exchanges
  // messages with it, and keeps what a Worker lacks: Web Storage (the worker holds a mirror of weei's keys
  // and sends each write here) and RTCPeerConnection (embed/rtc_bridge.js does what the worker's stand-ins
  // ask). Nothing of Pyodide runs on this thread, so start-up never blocks the page.
  let hostBlobUrl = null;
  const pagePython = {
    state: 'not-started', // not-started | starting | ready | failed
    error: null,
    seconds: null,
    snapshot: null, // restored from build.py's memory snapshot (weei-snapshot.bin)?
    promise: null,
    worker: null,
    listeners: new Set(), // (message) => void, for what is neither a reply nor WebRTC
    nextId: 1,
    pending: new Map(),
    rtc: null, // the page's half of the WebRTC bridge, imported at the first rtc message
    start() {
      if (this.promise) return this.promise;
      this.state = 'starting';
      this.promise = new Promise((resolve, reject) => {
        if (!hostBlobUrl) {
          // From a same-origin Blob URL (as WorkerClient's), so an embedding page of another origin can start it.
          const host = new URL(url('host.js'));
          if (globalThis.WEEI_NO_SNAPSHOT) host.searchParams.set('snapshot', 'no');
          hostBlobUrl = URL.createObjectURL(new Blob([`import ${JSON.stringify(host.href)};\n`], { type: 'text/javascript' }));
        }
        const worker = new Worker(hostBlobUrl, { type: 'module', name: 'weei-host' });
        this.worker = worker;
        const fail = (message) => {
          this.state = 'failed';
          this.error = message;
          reject(new Error(message));
          const envelope = { ok: false, error: { reason: 'python-unavailable', message, kind: 'InternalError' } };
          for (const resolveReply of this.pending.values()) resolveReply({ ok: false, error: message, envelope });
          this.pending.clear();
        };
        worker.onerror = (event) => {
          // Once started, an error event is an exception nothing in the worker caught (the worker runs on).
          if (this.state === 'ready') console.error('[weei] the host worker:', event.message);
          else fail(`the host worker failed: ${event.message || 'could not load host.js'}`);
        };
        worker.onmessage = (event) => {
          const message = event.data;
          if (message.type === 'reply') {
            const resolveReply = this.pending.get(message.id);
            this.pending.delete(message.id);
            if (resolveReply) resolveReply(message);
          } else if (message.type === 'rtc') {
            this.toRtc(message);
          } else if (message.type === 'booted') {
            this.seconds = message.seconds;
            this.snapshot = Boolean(message.snapshot);
            this.state = 'ready';
            log('page Python ready in', this.seconds, 's');
            resolve(this);
          } else if (message.type === 'boot-failed') {
            fail(message.message);
          } else {
            for (const listener of this.listeners) listener(message);
          }
        };
      });
      return this.promise;
    },
    toRtc(message) {
      if (!this.rtc) {
        const queued = [];
        this.rtc = { queued };
        loadModule('embed/rtc_bridge.js').then(({ rtcBridge }) => {
          const handle = rtcBridge((m, transfer = []) => this.worker.postMessage(m, transfer));
          this.rtc = { handle };
          for (const m of queued) handle(m);
        }, (err) => console.error('[weei] the WebRTC bridge could not be loaded:', err));
      }
      if (this.rtc.handle) this.rtc.handle(message);
      else this.rtc.queued.push(message);
    },
    post(message, transfer = []) {
      this.worker.postMessage(message, transfer);
    },
    // Resolves with the host worker's reply message.
    request(message, transfer = []) {
      const id = this.nextId++;
      return new Promise((resolve) => {
        this.pending.set(id, resolve);
        this.worker.postMessage({ ...message, id }, transfer);
      });
    },
  };

  // ---- 3. API registry ------------------------------------------------------------
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
  const core = { BASE, url, fetchOk, sha256Hex, loadModule, pagePython, log, backgroundTasks: [], internals };

  // ---- 4. 'distributed-training' ------------------------------------------------------
  // The API object. Every method forwards to the page's TrainingController
  // (weei.api, bound to IndexedDB, localStorage and Workers by
  // weei.browser.page_main) in the host worker; nothing here decides anything.
  // Calls are messages to weei.browser.page_api.PageApi there: call(name,
  // argsJson, buffers) for async methods (the buffers transferred),
  // call_sync(name, argsJson); each answers with an envelope {ok, json | file
  // | error}. getState() and the synchronous methods answer here, from what the
  // host worker published (its state and mirrors: docs/browser.md "The host
  // worker"). A job's Files become ArrayBuffers in embed/files.js (their names
  // kept), after every size was checked.
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
    if (envelope.files) return envelope.files;
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
    const bridge = { api: null, promise: null, error: null, seconds: null, slot: null };
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

    // What the host worker published (embed/mirrors.js), from the API's start on.
    let mirror = null;

    function startApi() {
      if (bridge.promise) return bridge.promise;
      const t0 = performance.now();
      bridge.promise = (async () => {
        const [host, namespace, { hostMirrors, storageEntries }] = await Promise.all([
          core.pagePython.start(), holdTab(), loadModule('embed/mirrors.js')]);
        mirror = hostMirrors({ host, namespace, weeiError, unwrap,
                               onState: (json) => { if (listeners.size) deliver(JSON.parse(json)); } });
        const opened = new Promise((resolve, reject) => {
          host.listeners.add((message) => {
            mirror.onMessage(message);
            if (message.type === 'opened') resolve();
            else if (message.type === 'open-failed') reject(new Error(message.message));
          });
        });
        host.post({
          type: 'open',
          hooks: {
            namespace, // this tab's storage (see holdTab)
            // Peers meet in a room: ?room=CODE on the page, or data-room on the script tag.
            room,
            // Tests shorten the Worker task deadlines (never set on a page without the test hooks).
            taskDeadlinesMs: window.__weeiTestHooks ? window.WEEI_TASK_DEADLINES_MS : undefined,
          },
          storage: { local: storageEntries('local'), session: storageEntries('session') },
        });
        await opened;
        const api = {
          call: async (name, args, buffers) => (await host.request({ type: 'call', name, args, buffers },
            buffers ? Object.values(buffers).flat().filter((b) => b instanceof ArrayBuffer) : [])).envelope,
          callSync: async (name, args) => (await host.request({ type: 'callSync', name, args })).envelope,
        };
        bridge.api = api;
        bridge.seconds = (performance.now() - t0) / 1000;
        core.log('API ready in', bridge.seconds, 's');
        deliver(mirror.state());
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

    // A synchronous method answers at once when the controller runs, from what the host worker published
    // (`answer`, on this thread). While it is still starting (the seconds after weeiReady), the call waits
    // for it and the method returns a Promise of the same answer, so the API is usable from weeiReady on:
    // `await training.exportCheckpoint()` works either way. Calls made before are answered in call order.
    function callSync(answer) {
      if (!bridge.api) {
        if (bridge.error) throw weeiError('python-unavailable', `Weei could not start in this page: ${bridge.error}`, 'InternalError');
        return startApi().then(answer);
      }
      return answer();
    }

    function getState() {
      const published = mirror && mirror.state();
      if (published) return published;
      const state = TRAINING_STATE_FIELDS();
      state.myPeerId = localPeerId;
      if (bridge.error) {
        state.busy = false;
        state.error = `Weei could not start in this page: ${bridge.error}`;
      }
      return state;
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
        if (!bridge.promise) startApi().catch(() => {});
        let active = true;
        return () => {
          if (!active) return;
          active = false;
          listeners.delete(listener);
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
      // An ONNX file and data files -> {wasm, manifest} Files of a package to create a job with (docs/onnx.md);
      // the import runs in the host worker's Python with the site's graph runtime.
      async importOnnx(request) {
        const [{ args, buffers }, runtime] = await Promise.all([
          (await files()).readOnnxImport(request), fetchOk('onnx/runtime.wasm').then((r) => r.arrayBuffer())]);
        buffers.runtime = runtime;
        const out = await callAsync('importOnnx', args, buffers);
        const file = (name, type) => { const f = out.find((x) => x.name === name); return new File([f.bytes], name, { type }); };
        return { wasm: file('model.wasm', 'application/wasm'), manifest: file('manifest.json', 'application/json') };
      },
      // The ONNX file `onnx` (the one imported) with the weights of this job's checkpoint of round `round`.
      async exportOnnx(round, onnx) {
        const buffer = await (await files()).read(onnx, 'onnx');
        const out = await callAsync('exportOnnx', { round }, { onnx: buffer });
        return new File([out.bytes], out.name, { type: 'application/octet-stream' });
      },
      invite(peerId) { return callSync(() => mirror.invite(peerId)); },
      decideInvitation(jobId, accepted) { return callAsync('decideInvitation', { jobId, accepted: !!accepted }); },
      start() { return callAsync('start'); },
      pause() { return callAsync('pause'); },
      resume() { return callAsync('resume'); },
      stop() { return callAsync('stop'); },
      updateSettings(settings) { return callAsync('updateSettings', { settings }); },
      // Warnings for legal settings that are likely mistakes, with the job's estimated time (docs/api.md).
      // Settings review runs in the controller (weei.core.job.settings_review): a Promise (docs/api.md).
      async reviewSettings(settings, manifest) {
        const api = await startApi();
        return unwrap(await api.callSync('reviewSettings', JSON.stringify({ settings, manifest: manifest ?? null })));
      },
      runValidation() { return callAsync('runValidation'); },
      shuffleChunks() { return callAsync('shuffleChunks'); },
      exportCheckpoint() { return callSync(() => mirror.checkpoint()); },
      exportModule() { return callSync(() => mirror.module()); },
      leave() { return callAsync('leave'); },
      // The room this page meets its peers in and its invite link ({key, invite}), or null.
      getRoom() { return roomInvite(); },
      getDebugLog() { return callSync(() => mirror.debugLog()); },
      exportDebugLog() { return callSync(() => debugLogFile(mirror.debugLog())); },
      clearDebugLog() { return callSync(() => mirror.clearDebugLog()); },
      setMaxLocalWorkers(count) { return callAsync('setMaxLocalWorkers', { count }); },
      setGpuMemoryBudgetMiB(mib) { return callAsync('setGpuMemoryBudgetMiB', { mib }); },
      setBackendPreference(preference) { return callAsync('setBackendPreference', { preference }); },
      // What the other peers and this tab's invitations call it (state.displayName; state.peerNames for all).
      setDisplayName(name) { return callAsync('setDisplayName', { name }); },
      // What the latest checkpoint says about one input: {example} or {prompt, maxBytes} (docs/api.md).
      tryCheckpoint(request = {}) { return callAsync('tryCheckpoint', { request }); },
      // Keep the newest `keepLast` checkpoint files of a job and its best (0: every one); bytes stored per job.
      setCheckpointRetention(keepLast) { return callAsync('setCheckpointRetention', { keepLast }); },
      getStorageUse() { return callAsync('getStorageUse'); },
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
    // A training Worker of the test hooks' own (embed/worker_client.js, as the host worker's).
    async function getWorker() {
      if (!worker) {
        const { WorkerClient } = await core.loadModule('embed/worker_client.js');
        if (!worker) worker = new WorkerClient();
      }
      return worker;
    }

    const testHooks = () => core.loadModule('embed/test_hooks.js');

    internals.set('distributed-training', {
      async trainOnce(modelId, options) {
        const summary = await (await testHooks()).trainOnce(core, await getWorker(), modelId, options);
        stats.trainings += 1;
        stats.lastTraining = { modelId, seconds: summary.trainSeconds };
        return summary;
      },
      aggregate: async (spec) => (await testHooks()).aggregate(core, spec),
      // A line of Python run in the host worker (its answer as text), and the host worker's start-up marks.
      hostPython: async (code) => (await core.pagePython.start().then((host) => host.request({ type: 'runPython', code }))).value,
      hostMarks: async () => (await core.pagePython.start().then((host) => host.request({ type: 'marks' }))).value,
      // A Pyodide on this page's own thread, for the tests of what runs there (test_engine): never the API's.
      mainThreadPython: async () => (await testHooks()).mainThreadPython(core),
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

  // ---- 5. loadWeei / weeiReady ----------------------------------------------------------
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
