// Weei's Python start-up, shared by the page (weei.js imports it) and the
// training Workers (worker.js): Pyodide from the Weei server, on the page
// restored from the memory snapshot build.py makes (weei-snapshot.bin: the
// interpreter started and weei's modules imported, see
// tools/pyodide_snapshot.mjs), the weei package unpacked, then the caller's
// modules imported.
//
// On the page this runs on the main thread, so it never does two phases in
// one task: `pause` (a macrotask yield on the page) runs between them, inside
// Pyodide's loader too (splitModule), and the page stays responsive. What is
// left in single tasks is each step itself (docs/browser.md "Start-up").
// Without the snapshot (a site built without it, or one Pyodide refuses) it
// starts Pyodide the ordinary way.

const PY_DIR = '/weei-py';

async function fetchBytes(url, optional = false) {
  const response = await fetch(url);
  if (!response.ok) {
    if (optional) return null;
    throw new Error(`GET ${url}: HTTP ${response.status}`);
  }
  return response.arrayBuffer();
}

// Phases on the performance timeline (what a profile of the start-up is read against).
const mark = (name) => performance.mark(name);

// The weei package into PY_DIR. weei-py.zip is read here, not by Python's
// zipfile: inflating it in Python is one long task (a second and more on a
// busy machine), DecompressionStream inflates off the main thread. The zip is
// build.py's own (pack_weei): local headers carry the sizes, entries are
// stored or deflated.
async function inflate(bytes) {
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream('deflate-raw'));
  return new Uint8Array(await new Response(stream).arrayBuffer());
}

async function readZip(buffer) {
  const view = new DataView(buffer);
  const files = [];
  const names = new TextDecoder();
  for (let at = 0; at + 30 <= buffer.byteLength && view.getUint32(at, true) === 0x04034b50;) {
    if (view.getUint16(at + 6, true) & 8) throw new Error('weei-py.zip: sizes after the data are not supported');
    const method = view.getUint16(at + 8, true);
    const size = view.getUint32(at + 18, true);
    const nameLength = view.getUint16(at + 26, true);
    const extraLength = view.getUint16(at + 28, true);
    const name = names.decode(new Uint8Array(buffer, at + 30, nameLength));
    const start = at + 30 + nameLength + extraLength;
    const data = new Uint8Array(buffer, start, size);
    if (method !== 0 && method !== 8) throw new Error(`weei-py.zip: ${name}: compression method ${method}`);
    files.push([name, method === 8 ? inflate(data) : data]);
    at = start + size;
  }
  if (!files.length) throw new Error('weei-py.zip: no files');
  return Promise.all(files.map(async ([name, data]) => [name, await data]));
}

// Files written per task: the sources and the snapshot's bytecode of weei's
// modules (tools/pyodide_snapshot.mjs), which goes beside them in __pycache__.
const WRITE_BATCH = 32;

async function unpack(pyodide, archive, pause) {
  const files = await readZip(archive);
  await pause();
  // Only a restored snapshot has weei imported, and its bytecode.
  const cache = pyodide.runPython("import sys\ngetattr(sys.modules.get('weei'), '__weei_pycache__', None)");
  if (cache) {
    for (const [name, data] of Object.entries(cache.toJs({ dict_converter: Object.fromEntries }))) files.push([name, data]);
    cache.destroy();
  }
  for (let i = 0; i < files.length; i++) {
    if (i && i % WRITE_BATCH === 0) await pause();
    const path = `${PY_DIR}/${files[i][0]}`;
    pyodide.FS.mkdirTree(path.slice(0, path.lastIndexOf('/')));
    pyodide.FS.writeFile(path, files[i][1]);
  }
  await pause();
  // A restored snapshot has PY_DIR on sys.path already, and its `random` was
  // seeded when the snapshot was made: seed it again here.
  pyodide.runPython(`import random, sys\nif ${JSON.stringify(PY_DIR)} not in sys.path: sys.path.insert(0, ${JSON.stringify(PY_DIR)})\nrandom.seed()`);
}

// Pyodide's loader runs the runtime's start in few tasks: instantiating the wasm module and linking
// it (receiveInstance), starting the runtime, restoring the snapshot and bootstrapping Python would
// otherwise follow each other without a yield. Wrapping the runtime's factory (loadPyodide's
// createPyodideModule option) puts a pause between each two of them:
//   - loadPyodide's configuration and the runtime's factory run in separate tasks;
//   - the instance goes to the runtime in the task after it is made;
//   - a last preRun step (after the file system is set up) waits for a task of its own;
//   - the snapshot's memory is copied in here, in a task of its own, and loadPyodide's own restore
//     (the next step, synchronous with Python's bootstrap) only hands back what this one read.
// What is left in one task is each step itself; the longest is Python's bootstrap (finalizeBootstrap).
function splitModule(createModule, pause, snapshot) {
  return async (settings) => {
    mark('weei:configured');
    await pause();
    const instantiate = settings.instantiateWasm;
    if (instantiate) {
      settings.instantiateWasm = (imports, done) => instantiate(imports, (instance, module) => {
        mark('weei:instance');
        pause().then(() => done(instance, module));
      });
    }
    settings.preRun = [...settings.preRun, async (Module) => {
      Module.addRunDependency('weei-pause');
      try {
        mark('weei:linked');
        await pause();
      } finally {
        Module.removeRunDependency('weei-pause');
      }
    }];
    const Module = await createModule(settings);
    mark('weei:runtime');
    await pause();
    if (snapshot) {
      const bytes = ArrayBuffer.isView(snapshot) ? snapshot : new Uint8Array(snapshot);
      // The runtime's module defines its own memory (480 pages), so loadPyodide's INITIAL_MEMORY does
      // not size it, and restoreSnapshot copies the heap without growing it: a snapshot whose heap
      // grew past that (weei imports more than it did) failed with "offset is out of bounds".
      const heap = bytes.length - new Uint32Array(bytes.buffer, bytes.byteOffset, 4)[1];
      if (Module.HEAP8.length < heap && !Module.growMemory(heap)) throw new Error(`cannot grow the memory to ${heap} bytes`);
      const restore = Module.API.restoreSnapshot;
      const config = restore(bytes);
      Module.API.restoreSnapshot = () => config;
      mark('weei:memory');
      await pause();
    }
    return Module;
  };
}

/** A yield to the event loop (a new task), so input and rendering run in between. */
export function nextTask() {
  if (globalThis.scheduler && typeof scheduler.yield === 'function') return scheduler.yield();
  return new Promise((resolve) => setTimeout(resolve, 0));
}

/**
 * Start Python and import `modules` one by one (a pause between two);
 * resolves {pyodide, main (the last module), snapshot (restored from it?), seconds}.
 * base: the Weei server's base URL (ends with '/'). pause: awaited between phases.
 * useSnapshot: false starts Pyodide the ordinary way (see worker.js).
 */
export async function startPython(base, modules, { pause = async () => {}, useSnapshot = true } = {}) {
  const t0 = performance.now();
  mark('weei:boot');
  const [{ loadPyodide }, snapshot, archive] = await Promise.all([
    import(new URL('pyodide/pyodide.mjs', base).href),
    useSnapshot ? fetchBytes(new URL('weei-snapshot.bin', base).href, true).catch(() => null) : null,
    fetchBytes(new URL('weei-py.zip', base).href),
  ]);
  mark('weei:fetched');
  await pause();
  const indexURL = new URL('pyodide/', base).href;
  // Pyodide's runtime module, evaluated in a task of its own (loadPyodide would import it in the same
  // task that instantiates it), then handed to loadPyodide through its createPyodideModule option.
  const { default: createModule } = await import(new URL('pyodide.asm.mjs', indexURL).href);
  mark('weei:asm');
  await pause();
  let pyodide;
  let restored = false;
  if (snapshot) {
    try {
      pyodide = await loadPyodide({ indexURL, _loadSnapshot: snapshot, createPyodideModule: splitModule(createModule, pause, snapshot) });
      restored = true;
    } catch (err) { // another Pyodide build than the snapshot's: start it the ordinary way
      console.warn('[weei] the Pyodide snapshot could not be restored, starting without it:', err);
    }
  }
  if (!pyodide) pyodide = await loadPyodide({ indexURL, createPyodideModule: splitModule(createModule, pause, null) });
  mark('weei:pyodide');
  await unpack(pyodide, archive, pause);
  mark('weei:unpacked');
  let main = null;
  for (const name of modules) {
    await pause();
    main = pyodide.pyimport(name);
    mark(`weei:import ${name}`);
  }
  return { pyodide, main, snapshot: restored, seconds: (performance.now() - t0) / 1000 };
}
