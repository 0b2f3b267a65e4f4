"""The training Worker keeps compiled modules: a module loaded again, or
compiled by the page and shared with a second Worker, is not compiled again,
and trains bit-identically to a fresh instance (wasmtime)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from site_helpers import ROOT

MODELS = ROOT / "app" / "static" / "models"
FORMAT = "weei-digits-v1"
SETTINGS = {"localEpochs": 1, "batchSize": 16}

# Two Workers spoken to with worker_main's protocol. A: loadModel from bytes, two trains (two chunks, each from
# the previous weights), loadModel of the same bytes again, the same two trains. B: loadModel with the page's
# WebAssembly.Module, the same two trains. Then a loadModel whose module is not a WebAssembly.Module.
WORKERS_JS = """async ([chunkNames, seeds, settings]) => {
  const get = async (path) => (await fetch(new URL(path, location.href))).arrayBuffer();
  const start = () => {
    const worker = new Worker(new URL('worker.js', location.href), { type: 'module' });
    const pending = new Map();
    let next = 1;
    const ready = new Promise((resolve, reject) => {
      worker.onmessage = ({ data: m }) => {
        if (m.type === 'ready') resolve();
        else if (m.type === 'error') reject(new Error(m.message));
        else if (m.type === 'reply') { pending.get(m.id)(m); pending.delete(m.id); }
      };
    });
    const request = (op, fields, transfer = []) => new Promise((resolve) => {
      const id = next++;
      pending.set(id, resolve);
      worker.postMessage({ id, op, ...fields }, transfer);
    });
    return { worker, ready, request };
  };
  const hex = async (buffer) => Array.from(new Uint8Array(await crypto.subtle.digest('SHA-256', buffer)),
                                            (b) => b.toString(16).padStart(2, '0')).join('');
  const wasm = await get('models/digits-mlp/model.wasm');
  const chunks = await Promise.all(chunkNames.map((n) => get('models/digits-mlp/data/' + n)));
  const trainTwice = async (w) => {
    let weights = (await w.request('createInitialWeights', { seed: '5' })).weights;
    const out = [];
    for (let k = 0; k < chunks.length; k++) {
      const data = chunks[k].slice(0);
      const r = await w.request('train', { weights, data, format: 'weei-digits-v1', seed: seeds[k], settings },
                                [weights, data]);
      if (!r.ok) throw new Error(JSON.stringify(r.error));
      weights = r.weights;
      out.push(await hex(weights));
    }
    return out;
  };
  const load = async (w, fields) => {
    const r = await w.request('loadModel', fields);
    return r.ok ? r.compiled : r.error;
  };
  const a = start(), b = start();
  await Promise.all([a.ready, b.ready]);
  const result = {};
  result.aFirstLoad = await load(a, { wasm: wasm.slice(0) });
  result.aFirst = await trainTwice(a);
  result.aSecondLoad = await load(a, { wasm: wasm.slice(0) });
  result.aSecond = await trainTwice(a);
  const module = await WebAssembly.compile(wasm);
  result.bLoad = await load(b, { wasm: wasm.slice(0), module });
  result.b = await trainTwice(b);
  result.badModule = await load(b, { wasm: wasm.slice(0), module: 42 });
  a.worker.terminate();
  b.worker.terminate();
  return result;
}"""


def wasmtime_shas(chunks: list[Path], seeds: list[str]) -> list[str]:
    from weei.runtime import ModelRuntime, WasmtimeEngine

    runtime = ModelRuntime.load((MODELS / "digits-mlp" / "model.wasm").read_bytes(), WasmtimeEngine())
    weights = runtime.create_initial_weights(5)
    shas = []
    for chunk, seed in zip(chunks, seeds):
        runtime.load_model(weights)
        weights = runtime.train(data=chunk.read_bytes(), format=FORMAT, seed=int(seed), settings=SETTINGS).weights
        shas.append(hashlib.sha256(weights).hexdigest())
    return shas


def test_worker_compiles_a_module_once_and_shares_the_pages_module(weei_server: Any, page: Any) -> None:
    pg, log = page
    pg.goto(weei_server.url)
    chunks = sorted((MODELS / "digits-mlp" / "data").glob("training-*.bin"))[:2]
    seeds = ["11", "12"]
    out = pg.evaluate(WORKERS_JS, [[c.name for c in chunks], seeds, SETTINGS])
    expected = wasmtime_shas(chunks, seeds)
    assert out["aFirstLoad"] is True, "the first loadModel of a Worker compiles the bytes"
    assert out["aSecondLoad"] is False, "the same bytes again: the compiled module is reused"
    assert out["bLoad"] is False, "the page's WebAssembly.Module is used, not compiled again"
    assert out["aFirst"] == out["aSecond"] == out["b"] == expected
    assert out["badModule"]["kind"] == "usage" and out["badModule"]["reason"] == "invalid-request"
    assert not log.errors, log.errors


# The page's pool with two Workers whose WorkerClient records every loadModel: each Worker gets the module's bytes
# with one WebAssembly.Module, the same object for both (compiled once in the page), and trains like wasmtime.
POOL_JS = """async ([chunkNames, seeds, settings]) => {
  const get = async (path) => new Uint8Array(await (await fetch(new URL(path, location.href))).arrayBuffer());
  const { core } = weei._internal;
  const { pyodide } = await __weeiTestHooks.get('distributed-training').mainThreadPython();
  const { WorkerClient } = await core.loadModule('embed/worker_client.js');
  const loads = [];
  const createWorker = () => {
    const client = new WorkerClient();
    const request = client.request.bind(client);
    client.request = (op, fields, options) => {
      if (op === 'loadModel') loads.push({ bytes: fields.wasm.byteLength, module: fields.module });
      return request(op, fields, options);
    };
    return client;
  };
  const ns = pyodide.globals.get('dict')();
  ns.set('create_worker', createWorker);
  ns.set('wasm', await get('models/digits-mlp/model.wasm'));
  ns.set('chunks', await Promise.all(chunkNames.map((n) => get('models/digits-mlp/data/' + n))));
  ns.set('seeds', seeds);
  ns.set('settings', settings);
  const out = await pyodide.runPythonAsync(`
import hashlib
from weei.api.ports import WorkerTask
from weei.browser.workers import BrowserWorkerPool
from weei.runtime import ModelRuntime
from weei.browser.engine import BrowserEngine

module = wasm.to_bytes()
sha = hashlib.sha256(module).hexdigest()
engine = BrowserEngine()
runtime = ModelRuntime.load(module, engine)
weights = runtime.create_initial_weights(5)
engine.close()
pool = BrowserWorkerPool(create_worker, device_limit=2)
shas = []
for index in (0, 1):  # Worker 0 trains chunk 0, then Worker 1 trains chunk 1 from its weights
    task = WorkerTask("train", weights, {}, data=chunks[index].to_bytes(), format="weei-digits-v1",
                      seed=int(seeds[index]), settings=settings.to_py())
    weights = (await pool.run(index, sha, module, task)).weights
    shas.append(hashlib.sha256(weights).hexdigest())
pool.terminate()
shas
`, { globals: ns });
  const shas = out.toJs();
  out.destroy();
  ns.destroy();
  return { shas, loads: loads.length, withModule: loads.filter((l) => l.module instanceof WebAssembly.Module).length,
           sameModule: loads.length === 2 && loads[0].module === loads[1].module };
}"""


def test_the_pool_compiles_a_module_once_for_all_its_workers(weei_server: Any, page: Any) -> None:
    pg, log = page
    pg.goto(weei_server.url)
    chunks = sorted((MODELS / "digits-mlp" / "data").glob("training-*.bin"))[:2]
    seeds = ["11", "12"]
    out = pg.evaluate(POOL_JS, [[c.name for c in chunks], seeds, SETTINGS])
    assert out["loads"] == 2 and out["withModule"] == 2, out
    assert out["sameModule"], "both Workers must get the module the page compiled once"
    assert out["shas"] == wasmtime_shas(chunks, seeds)
    assert not log.errors, log.errors
