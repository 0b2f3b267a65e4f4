// Reading a job's files for createJob and continueFromCheckpoint (weei.js imports this module at the
// first such call): every File's presence and size is checked against the spec's limits before any is
// read, names are kept, and the result is the call's arguments and its ArrayBuffers (docs/api.md).

// The spec's limits (weei.core.limits): checkpoints and modules (and every other file) 256 MB,
// an auxiliary weights file 2 GiB.
const MAX_FILE_BYTES = 256 * 1000 * 1000;
const MAX_AUXILIARY_BYTES = 2 * 1024 ** 3;

/** The readers, throwing weeiError(reason, message, kind) (weei.js's named errors). */
export function packageFiles(weeiError) {
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

  // {checkpoint, wasm, manifest, files, ..., datasetMode} -> call arguments and ArrayBuffers.
  async function readContinuation(job) {
    if (!job || typeof job !== 'object') throw weeiError('invalid-argument', 'continueFromCheckpoint() takes an object');
    const checkpoint = requireFile(job.checkpoint, 'checkpoint');
    const [{ args, buffers }, checkpointBuffer] = await Promise.all([
      readPackage(job, 'continueFromCheckpoint'), read(checkpoint)]);
    buffers.checkpoint = checkpointBuffer;
    args.datasetMode = job.datasetMode;
    return { args, buffers };
  }

  // importOnnx({onnx, files, loss, optimizer, learningRate, batchSize, dataFormat, modelId}) -> call arguments and
  // ArrayBuffers (weei.browser.onnx_form checks the words; the graph runtime and WGSL kernels are added by the caller).
  async function readOnnxImport(request) {
    if (!request || typeof request !== 'object') throw weeiError('invalid-argument', 'importOnnx() takes an object');
    const onnx = requireFile(request.onnx, 'onnx');
    const files = request.files === undefined ? [] : request.files;
    if (!files || typeof files[Symbol.iterator] !== 'function') throw weeiError('invalid-argument', 'files must be a list of Files');
    const list = Array.from(files, (f, i) => requireFile(f, `files[${i}]`));
    const [onnxBuffer, ...fileBuffers] = await Promise.all([read(onnx), ...list.map(read)]);
    const args = {
      onnxName: fileName(onnx, 'model.onnx'), fileNames: list.map((f, i) => fileName(f, `file-${i}`)),
      loss: request.loss, optimizer: request.optimizer, learningRate: request.learningRate,
      batchSize: request.batchSize, dataFormat: request.dataFormat, modelId: request.modelId ?? null,
    };
    return { args, buffers: { onnx: onnxBuffer, files: fileBuffers } };
  }

  return { readPackage, readContinuation, readOnnxImport, read: (blob, what) => read(requireFile(blob, what)) };
}
