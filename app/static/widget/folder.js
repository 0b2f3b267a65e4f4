// A chosen model folder (folder picker or drag and drop), or the files of its data/, routed to the slots
// createJob takes: what `weei model build` writes is a folder, and people choose the folder.

// Bounds on what a dropped folder may make the page read: a model folder holds a few dozen files.
const MAX_FILES = 10000;
const MAX_DEPTH = 8;

const baseName = (path) => path.slice(path.lastIndexOf('/') + 1);

/** The names a package manifest gives its files (null members when it has none). */
function namesOf(manifestJson) {
  const m = manifestJson || {};
  const execution = m.execution || {};
  const gpu = (execution.backends || []).find((b) => b && b.kind === 'gpu');
  const archive = (gpu && gpu.shaderArchive) || execution.shaderArchive;
  const entries = (m.inlineJson && m.inlineJson['dataset-manifest.json']) || [];
  const data = new Set([...entries, ...(m.auxiliaryWeights || [])].map((e) => e && e.fileName).filter(Boolean));
  return { wasm: m.wasm && m.wasm.fileName, archive: archive && archive.fileName, data };
}

/** The files of data/ (or any list of data files): `validation.bin` is the validation file and
 *  `dataset-manifest.json` is left out (the package manifest carries it inline) unless the manifest names
 *  them as chunks; every other file is a dataset file, so createJob names one the manifest does not. */
export function routeDataFiles(files, manifestJson) {
  const { data } = namesOf(manifestJson);
  const out = { files: [], validation: null, ignored: [] };
  for (const file of files) {
    if (data.has(file.name)) out.files.push(file);
    else if (file.name === 'validation.bin') out.validation = file;
    else if (file.name === 'dataset-manifest.json') out.ignored.push(file.name);
    else out.files.push(file);
  }
  return out;
}

/** A model folder as [{file, path}] (path relative to the folder's parent, as webkitRelativePath is).
 *  Returns {wasm, manifest, manifestJson, files, validation, executionFiles, ignored}: the package's files
 *  by the names its manifest.json gives them; the rest (sources, sdk/, sample.csv) is ignored.
 *  Throws an Error with reason 'missing-file' when the folder holds no manifest.json. */
export async function routeFolder(entries) {
  // Paths relative to the chosen folder: without its own name, which the picker puts first.
  const tops = new Set(entries.map((e) => e.path.split('/')[0]));
  const strip = tops.size === 1 && entries.every((e) => e.path.includes('/'));
  const rel = entries.map((e) => ({ file: e.file, path: strip ? e.path.slice(e.path.indexOf('/') + 1) : e.path }));
  const at = (path) => rel.find((e) => e.path === path);
  const manifestEntry = at('manifest.json');
  if (!manifestEntry) {
    throw Object.assign(new Error('The folder holds no manifest.json: choose a model folder after `weei model build` ' +
      'made its package (model.wasm and manifest.json)'), { reason: 'missing-file' });
  }
  let manifestJson = null;
  try { manifestJson = JSON.parse(await manifestEntry.file.text()); } catch { /* createJob names the problem */ }
  const names = namesOf(manifestJson);
  const wasm = at(names.wasm || 'model.wasm');
  const archive = names.archive ? at(names.archive) : null;
  const out = { wasm: wasm ? wasm.file : null, manifest: manifestEntry.file, manifestJson, files: [], validation: null,
    executionFiles: archive ? [archive.file] : [], ignored: [] };
  const used = new Set([manifestEntry, wasm, archive]);
  // The data: data/ (where `weei data chunk` writes) or the folder itself.
  for (const e of rel) {
    if (used.has(e)) continue;
    const inData = e.path.startsWith('data/') && !e.path.slice(5).includes('/');
    const top = !e.path.includes('/');
    const name = baseName(e.path);
    if ((inData || top) && names.data.has(name)) out.files.push(e.file);
    else if ((inData || top) && name === 'validation.bin' && !out.validation) out.validation = e.file;
    else out.ignored.push(e.path);
  }
  return out;
}

/** The files a drop brings, as [{file, path}]: folders are read recursively (within MAX_FILES and
 *  MAX_DEPTH); a drop without entries (files only) gives the files by name. */
export async function droppedEntries(dataTransfer) {
  const items = [...(dataTransfer.items || [])];
  const roots = items.map((item) => (item.webkitGetAsEntry ? item.webkitGetAsEntry() : null)).filter(Boolean);
  if (!roots.length) return [...(dataTransfer.files || [])].map((file) => ({ file, path: file.name }));
  const out = [];
  const fileOf = (entry) => new Promise((resolve, reject) => entry.file(resolve, reject));
  const children = (dir) => new Promise((resolve, reject) => {
    const reader = dir.createReader();
    const all = [];
    // readEntries gives a batch at a time, an empty one at the end.
    const next = () => reader.readEntries((batch) => {
      if (!batch.length || all.length + batch.length > MAX_FILES) { all.push(...batch); resolve(all); } else { all.push(...batch); next(); }
    }, reject);
    next();
  });
  const walk = async (entry, path, depth) => {
    if (out.length >= MAX_FILES) throw Object.assign(new Error(`The dropped folder holds more than ${MAX_FILES} files`), { reason: 'too-many-files' });
    if (entry.isFile) { out.push({ file: await fileOf(entry), path }); return; }
    if (depth >= MAX_DEPTH) return; // deeper than a model folder goes: nothing of the package lives there
    for (const child of await children(entry)) await walk(child, `${path}/${child.name}`, depth + 1);
  };
  for (const root of roots) await walk(root, root.name, 0);
  return out;
}
