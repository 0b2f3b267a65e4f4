// The test hooks of the 'distributed-training' API that do work (weei.js keeps the rest, and imports this
// module at the first call): train a model once in a Worker, aggregate one round in the page's Python, a
// Pyodide on the page's own thread for tests of what runs there.
// Reachable only on a page that asks for the test hooks (weei.js's header); `core` is weei.js's.

async function modelPackage(core, modelId) {
  const base = `models/${encodeURIComponent(modelId)}/`;
  const manifest = await (await core.fetchOk(base + 'manifest.json')).json();
  const wasm = await (await core.fetchOk(base + manifest.wasm.fileName)).arrayBuffer();
  return { base, manifest, wasm };
}

// Test hook: train `modelId` once in a Worker (`client`, a WorkerClient): start weights from
// createInitialWeights(initSeed) (or `weights`), one dataset chunk
// (index `chunk`, default 0) or an experience range.
export async function trainOnce(core, client, modelId, options = {}) {
  const {
    initSeed = '0', seed = '1', chunk = 0, experience = null, weights = null,
    settings = { localEpochs: 1, batchSize: 32 }, returnWeights = false,
  } = options;
  const t0 = performance.now();
  const workerStartSeconds = await client.ready;
  const pkg = await modelPackage(core, modelId);
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
  return summary;
}

// Test hook: aggregate one round in the page's Python (WasmKernel over the browser engine, in the host
// worker). See page_main.PageSession.debug_aggregate.
export async function aggregate(core, spec) {
  const host = await core.pagePython.start();
  const reply = await host.request({ type: 'aggregate', spec });
  if (!reply.ok) throw new Error(reply.error);
  const out = reply.value;
  return {
    weightsSha256: await core.sha256Hex(out.weights),
    stateSha256: out.state ? await core.sha256Hex(out.state) : null,
    stateStep: out.stateStep,
    seconds: out.seconds,
    weights: out.weights,
    state: out.state,
  };
}

// Test hook: a Pyodide on the page's main thread (boot.mjs, weei's modules imported), started once. The API
// never uses it (its Python runs in the host worker); tests of what Python does on a page's thread do.
let mainThread = null;
export function mainThreadPython(core) {
  if (!mainThread) {
    mainThread = import(core.url('boot.mjs')).then(({ startPython, nextTask }) => startPython(
      core.BASE, ['weei.browser.webgpu', 'weei.browser.page_main'],
      { pause: nextTask, useSnapshot: !globalThis.WEEI_NO_SNAPSHOT }));
  }
  return mainThread;
}
