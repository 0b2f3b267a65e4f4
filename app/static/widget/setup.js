// The window's Job setup section: built-in demos, file choice, the settings form, job controls.
// Methods of the window's Widget class (mixed into it by window.js): `this` is the Widget.

import { h, append, fmtBytes, setDisabled, experienceOf, copyButton, errorText } from './dom.js';
import { routeFolder, routeDataFiles, droppedEntries } from './folder.js';

// The built-in reference packages are served next to the widget/ directory.
/** The settings a package brings none of starts from: `weei train`'s (demo/train.py DEFAULT_SETTINGS). */
export const PACKAGE_DEFAULTS = Object.freeze({ epochs: 1, localEpochs: 1, batchSize: 32, coordinatorParticipates: true,
  validationSchedule: { enabled: true, unit: 'round', every: 1 } });
/** The privacy fields' values before anyone edits them (docs/privacy.md's example; ε is shown as they change). */
const PRIVACY_DEFAULTS = Object.freeze({ clip: 1, noiseMultiplier: 1.1, delta: 1e-5, maxRounds: 30 });

const BASE = new URL('../', import.meta.url).href;

async function fetchFile(path, name, type = 'application/octet-stream') {
  const response = await fetch(new URL(path, BASE));
  if (!response.ok) throw new Error(`GET ${path}: HTTP ${response.status}`);
  return new File([await response.blob()], name, { type });
}

/** A built-in reference package, as File objects (as <input type=file> would give them). */
async function loadDemo(modelId) {
  const base = `models/${modelId}/`;
  const manifestFile = await fetchFile(base + 'manifest.json', 'manifest.json', 'application/json');
  const manifest = JSON.parse(await manifestFile.text());
  const wasm = await fetchFile(base + manifest.wasm.fileName, manifest.wasm.fileName, 'application/wasm');
  const entries = (manifest.inlineJson && manifest.inlineJson['dataset-manifest.json']) || [];
  const files = await Promise.all(entries.map((e) => fetchFile(base + 'data/' + e.fileName, e.fileName)));
  let validation = null;
  if (entries.length) {
    try { validation = await fetchFile(base + 'data/validation.bin', 'validation.bin'); } catch { validation = null; }
  }
  // A package with a GPU backend brings its WGSL archive: the job may then train on the GPU (backend setting).
  const execution = manifest.execution || {};
  const gpu = (execution.backends || []).find((b) => b.kind === 'gpu');
  const archive = (gpu && gpu.shaderArchive) || execution.shaderArchive;
  const executionFiles = archive ? [await fetchFile(base + archive.fileName, archive.fileName, 'application/json')] : [];
  return { wasm, manifest: manifestFile, manifestJson: manifest, files, validation, executionFiles };
}

export class Setup {
  buildSetup() {
    const s = this.sections.setup;
    const f = (this.f = {});
    const num = (name, label, attrs = {}) => {
      f[name] = h('input', { type: 'number', name, ...attrs });
      return (f[name + 'Label'] = h('label', {}, h('span', { text: label }), f[name]));
    };
    const fileInput = (name, label, attrs) => {
      f[name] = h('input', { type: 'file', name, ...attrs });
      return h('label', {}, h('span', { text: label }), f[name]);
    };

    f.demoDigits = h('button', { type: 'button', text: 'Digits MLP demo', title: 'A small dataset model: handwritten digits, 15 chunks and a validation file' });
    f.demoCartpole = h('button', { type: 'button', text: 'CartPole demo', title: 'A reinforcement learning model: no dataset, the model plays episodes' });
    f.demoTransformer = h('button', { type: 'button', text: 'Transformer demo',
      title: 'A 2.3 MB byte-level transformer on synthetic reasoning text: 55 chunks and a validation file' });
    f.selection = h('p', { class: 'small muted', text: 'Choose a model package, or load a built-in demo.' });
    f.demoError = h('div', { class: 'error hidden', role: 'alert' });

    const files = h('div', { class: 'files' },
      // What `weei model build` made, in one choice: module, manifest, data/ and validation.bin (folder.js).
      fileInput('folder', 'Model folder', { webkitdirectory: true, multiple: true,
        title: 'The folder weei model build made: model.wasm, manifest.json and data/ (or drop the folder on the window)' }),
      fileInput('wasm', 'Model module (.wasm)', { accept: '.wasm,application/wasm' }),
      fileInput('manifest', 'Manifest (.json)', { accept: '.json,application/json' }),
      fileInput('files', 'Dataset files (and auxiliary weights)', { multiple: true }),
      fileInput('validation', 'Validation file (optional)', {}),
      fileInput('checkpoint', 'Continue from checkpoint (optional)', { accept: '.weei-checkpoint' }),
      h('label', { class: 'check' }, h('span', {},
        (f.restore = h('input', { type: 'checkbox', name: 'restore' })), 'Restore the saved dataset progress')));

    // Bring an ONNX file (docs/onnx.md): imported in this page's Python into a package chosen as above;
    // the chosen dataset and validation files are its data.
    const select = (name, label, options) => {
      f[name] = h('select', { name, 'aria-label': label }, options.map(([value, text]) => h('option', { value, text })));
      return h('label', {}, h('span', { text: label }), f[name]);
    };
    f.onnxImport = h('button', { type: 'button', text: 'Import ONNX model',
      title: 'Make a package of the ONNX file with the chosen dataset files (no compiler needed)' });
    f.onnxError = h('div', { class: 'error hidden', role: 'alert' });
    const onnxBox = h('fieldset', { class: 'files onnx' }, h('legend', { class: 'small muted', text: 'Or bring an ONNX file (PyTorch, TensorFlow, JAX)' }),
      fileInput('onnx', 'ONNX model (.onnx)', { accept: '.onnx' }),
      select('onnxLoss', 'Loss', [['cross-entropy', 'cross-entropy (classes)'], ['mse', 'mean squared error'],
        ['next-token', 'next token (a language model)']]),
      select('onnxOptimizer', 'Optimizer', [['adam', 'Adam'], ['adamw', 'AdamW'], ['sgd', 'SGD']]),
      num('onnxLr', 'Model learning rate', { min: 0, step: 'any', value: 0.01, required: true }),
      select('onnxFormat', 'Data format', [['records', 'records (weei data chunk)'],
        ['digits', 'digits (weei-digits-v1)'], ['tokens', 'tokens (weei-bytes-v1)']]),
      h('div', { class: 'row' }, f.onnxImport), f.onnxError);

    // The advice is Weei's own measurement (docs/methods.md, "Where server momentum and server Adam help").
    f.method = h('select', { name: 'method', title: 'FedAvg unless you have measured otherwise: with the models\' ' +
      'local Adam at its default rate, FedAvgM 0.9 and FedAdam 0.01 ended above FedAvg\'s loss; FedAvgM with momentum ' +
      '0.5 and step 1.2 ended below it on every model measured, with local SGD or Adam; momentum 0.9 (and Nesterov) ' +
      'helps only when a round moves little (docs/methods.md)' },
      h('option', { value: 'fedavg', text: 'FedAvg (average)' }),
      h('option', { value: 'fedavgm', text: 'FedAvgM (momentum)' }),
      h('option', { value: 'fedadam', text: 'FedAdam' }));
    // Robust aggregation (docs/api.md, "Robust aggregation"): off unless set; any method.
    f.combine = h('select', { name: 'combine', 'aria-label': 'Combine', title: 'How the round\'s updates are combined, weight by weight' },
      h('option', { value: 'mean', text: 'mean (plain)' }),
      h('option', { value: 'trimmedMean', text: 'trimmed mean' }),
      h('option', { value: 'median', text: 'median' }));
    f.robustHelp = h('p', { class: 'small muted', text: 'Robust aggregation against bad updates: norm clip scales an update ' +
      'larger than that many times the round\'s median change down to it (3 is a good start); a trimmed mean or median ' +
      'ignores extreme values of each weight (one sort per weight: a few times slower than the plain mean). Both need ' +
      'most participants honest. Exclude after N removes a participant whose update was an outlier N rounds in a row.' });
    // Compressed updates (docs/api.md, "Compressed updates"): off unless chosen.
    f.compression = h('select', { name: 'compression', 'aria-label': 'Updates sent as',
      title: 'Participants send their change quantized to 8 or 4 bits, with a float32 scale per block of weights ' +
        '(about 3.9 or 7.8 times fewer bytes than float32; the final loss stayed within 1% of float32\'s, docs/methods.md)' },
      h('option', { value: '', text: 'float32 (off)' }),
      h('option', { value: 'int8', text: 'int8' }),
      h('option', { value: 'int4', text: 'int4' }));
    f.compressionDeflate = h('input', { type: 'checkbox', name: 'compressionDeflate' });
    f.nesterov = h('input', { type: 'checkbox', name: 'nesterov' });
    f.vunit = h('select', { name: 'validationUnit', 'aria-label': 'Validation unit' }, h('option', { value: 'round', text: 'rounds' }), h('option', { value: 'epoch', text: 'epochs' }));
    f.participates = h('input', { type: 'checkbox', name: 'coordinatorParticipates', checked: true });
    f.venabled = h('input', { type: 'checkbox', name: 'validationEnabled' });

    const grid = h('div', { class: 'grid' },
      num('epochs', 'Epochs', { min: 1, step: 1, value: 1, required: true }),
      num('units', 'Episodes per round', { min: 1, step: 1, value: 32 }),
      num('localEpochs', 'Local epochs', { min: 1, step: 1, value: 1, required: true }),
      num('batchSize', 'Batch size', { min: 1, step: 1, value: 32, required: true }),
      num('learningRate', 'Learning rate (optional)', { min: 0, step: 'any', placeholder: 'model default' }),
      h('label', {}, h('span', { text: 'Aggregation' }), f.method),
      num('serverLearningRate', 'Server learning rate (0–10)', { min: 0, max: 10, step: 'any', placeholder: '1' }),
      num('momentum', 'Momentum (0–<1)', { min: 0, max: 0.9999, step: 'any', placeholder: '0.9' }),
      (f.nesterovLabel = h('label', { class: 'check', title: 'aggregation.nesterov: the step looks ahead along the new ' +
        'velocity, start + η·(Δ + μ·v); DiLoCo\'s outer optimizer is η 0.7, μ 0.9 with Nesterov (docs/api.md)' },
        f.nesterov, 'Nesterov momentum')),
      num('beta1', 'β1 (0–<1)', { min: 0, max: 0.9999, step: 'any', placeholder: '0.9' }),
      num('beta2', 'β2 (0–<1)', { min: 0, max: 0.9999, step: 'any', placeholder: '0.99' }),
      num('epsilon', 'ε (0–1)', { min: 0, max: 1, step: 'any', placeholder: '0.001' }),
      num('normClip', 'Norm clip (× median, 1–1000)', { min: 1, max: 1000, step: 'any', placeholder: 'off',
        title: 'An update whose change is larger than this many times the round\'s median change is scaled down to it' }),
      h('label', {}, h('span', { text: 'Combine' }), f.combine),
      num('trim', 'Trim per end (0–<0.5)', { min: 0.01, max: 0.49, step: 'any', placeholder: '0.25',
        title: 'The fraction of values dropped at each end of every weight' }),
      num('excludeOutliersAfter', 'Exclude outlier after (rounds)', { min: 1, max: 1000, step: 1, placeholder: 'never',
        title: 'Exclude a participant from the job after its update was an outlier this many rounds in a row' }),
      h('label', {}, h('span', { text: 'Updates sent as' }), f.compression),
      num('compressionBlock', 'Weights per scale (8–65536)', { min: 8, max: 65536, step: 1, placeholder: '256',
        title: 'One float32 scale per this many weights: smaller blocks follow the change more closely and cost more bytes' }),
      (f.compressionDeflateLabel = h('label', { class: 'check', title: 'Lossless: a fifth fewer bytes with int8 on ' +
        'digits-mlp, 5% on the transformer, for 2 to 3 times the coordinator\'s CPU per update (docs/methods.md)' }, f.compressionDeflate, 'Deflate the codes')),
      h('label', { class: 'check' }, f.participates, 'Coordinator trains too'),
      h('label', { class: 'check' }, f.venabled, 'Validate'),
      h('div', { class: 'field' }, h('label', { for: 'weei-vevery', text: 'Validate every' }), h('span', { class: 'row', style: 'margin:0' },
        (f.vevery = h('input', { type: 'number', id: 'weei-vevery', name: 'validationEvery', min: 1, step: 1, value: 1, style: 'width:5em' })), f.vunit)));
    f.method.addEventListener('change', () => this.updateMethodFields());
    f.combine.addEventListener('change', () => this.updateMethodFields());
    f.compression.addEventListener('change', () => this.updateMethodFields());

    // settings.privacy (docs/privacy.md): off unless ticked; the core checks the combinations (showReview).
    const check = (name, label, hint) => {
      f[name] = h('input', { type: 'checkbox', name, 'aria-describedby': `weei-${name}-hint` });
      return [h('label', { class: 'check' }, f[name], label), h('p', { class: 'small muted hint', id: `weei-${name}-hint`, text: hint })];
    };
    f.noiseAt = h('select', { name: 'noiseAt', 'aria-label': 'Noise added by',
      title: 'The participants: each adds its share under the masks, so the coordinator never sees a noise-free sum' },
      h('option', { value: 'coordinator', text: 'the coordinator' }),
      h('option', { value: 'participants', text: 'the participants' }));
    f.plannedEpsilon = h('p', { class: 'small', 'data-field': 'plannedEpsilon', 'aria-live': 'polite' });
    f.privacyBox = h('fieldset', { class: 'privacy' }, h('legend', { text: 'Privacy' }),
      h('div', { class: 'grid' },
        ...check('secureAggregation', 'Secure aggregation', 'The coordinator sees only each round\'s sum, never one update'),
        num('secureClip', 'Participant clip (L2 norm)', { min: 0, max: 1000, step: 'any', value: PRIVACY_DEFAULTS.clip,
          title: 'Each participant scales its update down to this norm before masking it' }),
        num('threshold', 'Threshold (0.5–1)', { min: 0.5, max: 1, step: 'any', placeholder: '0.6',
          title: 'The share of a round\'s participants that must stay to its end for its sum to count' }),
        ...check('dp', 'Differential privacy', 'Bounds what the models reveal of any one participant (ε at δ)'),
        num('dpClip', 'DP clip (L2 norm)', { min: 0, step: 'any', value: PRIVACY_DEFAULTS.clip,
          title: 'Every update is clipped to this norm (with secure aggregation, by each participant)' }),
        num('noiseMultiplier', 'Noise multiplier σ (0–1000)', { min: 0, max: 1000, step: 'any', value: PRIVACY_DEFAULTS.noiseMultiplier,
          title: 'Gaussian noise of σ × clip on each round\'s sum: more noise, smaller ε, a noisier model' }),
        num('delta', 'δ (0–1)', { min: 0, max: 1, step: 'any', value: PRIVACY_DEFAULTS.delta,
          title: 'The probability the ε bound may fail: well below 1 / the number of participants' }),
        num('dpRounds', 'Rounds under DP (at most)', { min: 1, max: 1000000, step: 1, value: PRIVACY_DEFAULTS.maxRounds,
          title: 'The job ends after this many rounds, so ε stays within the plan' }),
        (f.noiseAtLabel = h('label', {}, h('span', { text: 'Noise added by' }), f.noiseAt))),
      f.plannedEpsilon);
    f.secureAggregation.addEventListener('change', () => this.updateMethodFields());
    f.dp.addEventListener('change', () => this.updateMethodFields());

    f.create = h('button', { type: 'button', class: 'primary', text: 'Create job' });
    f.apply = h('button', { type: 'button', text: 'Apply settings to job', title: 'updateSettings(): takes effect from the next round' });
    f.formError = h('div', { class: 'error hidden', role: 'alert' });
    // reviewSettings(): the estimated time and values far outside the model's defaults (confirmed by a second click).
    f.review = h('div', { class: 'review small hidden', role: 'status', 'data-review': '' });
    f.start = h('button', { type: 'button', class: 'primary', text: 'Start' });
    f.pause = h('button', { type: 'button', text: 'Pause' });
    f.resume = h('button', { type: 'button', class: 'primary', text: 'Resume' });
    f.stop = h('button', { type: 'button', class: 'danger', text: 'Stop' });
    f.shuffle = h('button', { type: 'button', text: 'Shuffle chunks' });
    f.validate = h('button', { type: 'button', text: 'Run validation' });
    f.controlError = h('div', { class: 'error hidden', role: 'alert' });
    f.jobLine = h('p', { class: 'small muted' });

    f.jobBox = h('div', { class: 'card jobbox' }, f.jobLine,
      h('div', { class: 'row' }, f.start, f.pause, f.resume, f.stop, f.shuffle, f.validate), f.controlError);
    f.choose = h('div', { class: 'choose' },
      h('div', { class: 'row' }, h('span', { class: 'small muted', text: 'Built-in demos:' }), f.demoDigits, f.demoCartpole, f.demoTransformer),
      f.selection, f.demoError, files, onnxBox);
    f.settingsBox = h('details', { class: 'settings', open: true }, h('summary', { text: 'Settings' }), grid, f.robustHelp, f.privacyBox);
    // The primary action stays outside the foldable settings: after a job the form folds away, and the
    // next demo or package must still show Create job.
    f.actions = h('div', { class: 'actions' }, h('div', { class: 'row' }, f.create, f.apply), f.review, f.formError);
    append(s.content, f.jobBox, f.choose, f.settingsBox, f.actions);

    const demo = (button, id, defaults) => button.addEventListener('click', () => this.act(button, f.demoError, async () => {
      f.selection.textContent = `Loading the ${button.textContent}…`;
      // Create job waits for the package: a click while it loads would find no module chosen.
      this.loadingDemo = true;
      this.keys = {};
      this.refresh();
      let pkg;
      try { pkg = await loadDemo(id); } finally { this.loadingDemo = false; }
      for (const name of ['folder', 'wasm', 'manifest', 'files', 'validation', 'checkpoint']) f[name].value = '';
      this.selection = { ...pkg, label: button.textContent };
      f.settingsBox.open = true;
      this.fillSettings(defaults, experienceOf(pkg.manifestJson));
      f.venabled.checked = Boolean(pkg.validation) || Boolean(experienceOf(pkg.manifestJson));
      this.describeSelection();
      this.confirmed = null;
      await this.showReview(); // the estimated time, when this browser has trained this model before
    }));
    // Short jobs: the coordinator validates every round of them anyway (SHORT_JOB_ROUNDS), the form says so.
    demo(f.demoDigits, 'digits-mlp', { epochs: 1, localEpochs: 1, batchSize: 32, coordinatorParticipates: true,
      validationSchedule: { enabled: true, unit: 'round', every: 1 } });
    demo(f.demoCartpole, 'cartpole-reinforce', { epochs: 20, localEpochs: 1, batchSize: 16, coordinatorParticipates: true,
      experience: { unitsPerAssignment: 32 }, validationSchedule: { enabled: true, unit: 'round', every: 1 } });
    demo(f.demoTransformer, 'byte-transformer', { epochs: 1, localEpochs: 1, batchSize: 8, coordinatorParticipates: true,
      validationSchedule: { enabled: true, unit: 'round', every: 1 } });

    const usePackage = (pkg, label) => {
      for (const name of ['folder', 'wasm', 'manifest', 'files', 'validation']) if (f[name].files !== pkg.from) f[name].value = '';
      Object.assign(this.selection, { wasm: pkg.wasm, manifest: pkg.manifest, manifestJson: pkg.manifestJson, files: pkg.files,
        validation: pkg.validation, executionFiles: pkg.executionFiles, ignored: pkg.ignored, label });
      f.settingsBox.open = true;
      // Another package starts from the defaults, not from the previous demo's or job's values.
      this.fillSettings(PACKAGE_DEFAULTS, experienceOf(pkg.manifestJson));
      f.venabled.checked = Boolean(pkg.validation) || Boolean(experienceOf(pkg.manifestJson));
      this.describeSelection();
    };
    const useData = (chosen) => {
      const routed = routeDataFiles(chosen, this.selection.manifestJson);
      Object.assign(this.selection, { files: routed.files, ignored: routed.ignored, label: '' });
      if (routed.validation) { this.selection.validation = routed.validation; f.venabled.checked = true; }
      this.describeSelection();
    };
    const useEntries = async (entries, from, label) => {
      const names = entries.map((e) => e.path.split('/').slice(-2).join('/'));
      // A folder or files with a manifest.json are a package; data files alone are the dataset.
      if (names.some((n) => n === 'manifest.json' || n.endsWith('/manifest.json'))) {
        usePackage({ ...(await routeFolder(entries)), from }, label);
      } else {
        useData(entries.map((e) => e.file));
      }
    };
    f.folder.addEventListener('change', () => this.act(null, f.demoError, async () => {
      const chosen = [...f.folder.files];
      if (!chosen.length) return;
      const entries = chosen.map((file) => ({ file, path: file.webkitRelativePath || file.name }));
      await useEntries(entries, f.folder.files, `folder ${entries[0].path.split('/')[0]}`);
    }));
    // Dropping the model folder (or its files) anywhere on the window chooses it as the picker would.
    this.win.addEventListener('dragover', (e) => {
      if (e.dataTransfer && [...e.dataTransfer.types].includes('Files')) { e.preventDefault(); e.dataTransfer.dropEffect = 'copy'; }
    });
    this.win.addEventListener('drop', (e) => {
      if (!e.dataTransfer || ![...e.dataTransfer.types].includes('Files')) return;
      e.preventDefault();
      const dropped = e.dataTransfer;
      const entries = droppedEntries(dropped); // read now: the DataTransfer empties after this event
      this.act(null, f.demoError, async () => {
        const all = await entries;
        if (!all.length) return;
        const top = all[0].path.includes('/') ? `folder ${all[0].path.split('/')[0]}` : 'dropped files';
        await useEntries(all, null, top);
      });
    });
    f.wasm.addEventListener('change', () => { this.selection.wasm = f.wasm.files[0] || null; this.selection.label = ''; this.describeSelection(); });
    f.files.addEventListener('change', () => useData([...f.files.files]));
    f.validation.addEventListener('change', () => { this.selection.validation = f.validation.files[0] || null; this.describeSelection(); });
    f.checkpoint.addEventListener('change', () => this.describeSelection());
    f.manifest.addEventListener('change', async () => {
      const file = f.manifest.files[0] || null;
      this.selection.manifest = file;
      this.selection.manifestJson = null;
      this.selection.executionFiles = [];
      this.selection.label = '';
      if (file) {
        try { this.selection.manifestJson = JSON.parse(await file.text()); } catch { /* createJob names the problem */ }
      }
      this.fillSettings(PACKAGE_DEFAULTS, experienceOf(this.selection.manifestJson));
      this.describeSelection();
    });

    f.onnxImport.addEventListener('click', () => this.act(f.onnxImport, f.onnxError, async () => {
      const onnx = f.onnx.files[0];
      if (!onnx) throw Object.assign(new Error('Choose the ONNX model (.onnx)'), { reason: 'missing-file' });
      const lr = Number(f.onnxLr.value);
      if (f.onnxLr.value.trim() === '' || !(lr > 0)) throw Object.assign(new Error('The model learning rate must be above 0'), { reason: 'bad-setting' });
      const batchSize = Number(f.batchSize.value) || 32;
      f.selection.textContent = `Importing ${onnx.name}…`;
      const pkg = await this.api.importOnnx({ onnx, files: this.selection.files, loss: f.onnxLoss.value,
        optimizer: f.onnxOptimizer.value, learningRate: lr, batchSize, dataFormat: f.onnxFormat.value });
      const manifestJson = JSON.parse(await pkg.manifest.text());
      f.wasm.value = f.manifest.value = '';
      Object.assign(this.selection, { wasm: pkg.wasm, manifest: pkg.manifest, manifestJson, executionFiles: pkg.executionFiles,
        label: `${onnx.name} (imported)` });
      // Kept for Download as ONNX beside this model's checkpoints (the export rewrites this very file).
      this.onnxSource = { modelId: manifestJson.execution.modelId, file: onnx };
      this.fillSettings(null, null);
      this.describeSelection();
    }));

    f.create.addEventListener('click', () => this.act(f.create, f.formError, async () => {
      if (await this.confirmSettings('create', this.selection.manifestJson)) await this.createJob();
    }));
    f.apply.addEventListener('click', () => this.act(f.apply, f.formError, async () => {
      if (await this.confirmSettings('apply', null)) await this.api.updateSettings(this.readSettings());
    }));
    // A changed value is reviewed again (notes show at once; a confirmation given for other values lapses).
    f.settingsBox.addEventListener('change', () => { this.confirmed = null; this.showReview(); });
    // The planned ε follows the privacy fields as they are typed in, not only when one is left.
    f.privacyBox.addEventListener('input', () => {
      clearTimeout(this.reviewTimer);
      this.reviewTimer = setTimeout(() => { this.confirmed = null; this.showReview(); }, 250);
    });
    const control = (button, fn) => button.addEventListener('click', () => this.act(button, f.controlError, fn));
    control(f.start, () => this.api.start());
    control(f.pause, () => this.api.pause());
    control(f.resume, () => this.api.resume());
    // Stop ends the job for good: the first click asks, a second within 8 s stops.
    f.stop.addEventListener('click', () => this.act(f.stop, f.controlError, async () => {
      if (!this.stopAsked) {
        this.stopAsked = true;
        f.stop.textContent = 'Confirm stop';
        f.controlError.textContent = 'Stop ends the job: its chunks stay untrained. Click Confirm stop to end it.';
        f.controlError.classList.remove('hidden');
        clearTimeout(this.stopTimer);
        this.stopTimer = setTimeout(() => { this.stopAsked = false; f.stop.textContent = 'Stop'; f.controlError.classList.add('hidden'); }, 8000);
        return;
      }
      clearTimeout(this.stopTimer);
      this.stopAsked = false;
      f.stop.textContent = 'Stop';
      await this.api.stop();
    }));
    control(f.shuffle, () => this.api.shuffleChunks());
    control(f.validate, () => this.api.runValidation());
    this.fillSettings(null, null);
  }

  /** The review of the form's settings: null when the API has none or the form does not parse,
   *  `{settings, refused}` with the core's SettingsError when it refuses them. */
  async reviewForm(manifest) {
    if (typeof this.api.reviewSettings !== 'function') return null;
    let settings;
    try { settings = this.readSettings(); } catch { return null; }
    try {
      return { settings, review: await this.api.reviewSettings(settings, manifest) };
    } catch (err) {
      // The settings' own refusal; anything else (the API still starting) is Create job's to report.
      return err && err.kind === 'SettingsError' ? { settings, refused: err } : null;
    }
  }

  /** Show the review's warnings and planned ε, or the core's refusal naming the field, under the form;
   *  returns reviewForm's answer. */
  async showReview(manifest = this.selection.manifestJson) {
    const f = this.f;
    const job = this.state && this.state.job;
    const seq = (this.reviewSeq = (this.reviewSeq || 0) + 1);
    const out = await this.reviewForm(job && job.role === 'coordinator' && job.status !== 'completed' ? null : manifest);
    if (seq !== this.reviewSeq) return out; // a later edit's review shows instead
    const review = out && out.review;
    const warnings = review ? review.warnings : [];
    f.review.replaceChildren(...warnings.map((w) => h('div', { class: w.level === 'confirm' ? 'warn' : 'muted', 'data-field': w.field },
      w.level === 'confirm' ? '⚠ ' : '', h('b', { text: w.field }), `: ${w.message}`)));
    f.review.classList.toggle('hidden', !warnings.length);
    // A refusal shows where Create job would show it; the edit that resolves it takes it away.
    if (out && out.refused) {
      f.formError.textContent = f.formError.dataset.refusal = errorText(out.refused);
      f.formError.classList.remove('hidden');
    } else if (f.formError.dataset.refusal && f.formError.textContent === f.formError.dataset.refusal) {
      f.formError.textContent = f.formError.dataset.refusal = '';
      f.formError.classList.add('hidden');
    }
    const dp = review && review.privacy && review.privacy.dp;
    f.plannedEpsilon.textContent = !dp ? '' : dp.plannedEpsilon === null ? 'Planned ε: infinite (σ 0 clips but adds no noise)'
      : `Planned ε ≤ ${Number(dp.plannedEpsilon).toPrecision(3)} at δ ${dp.delta} over at most ${dp.maxRounds} rounds`;
    return out;
  }

  /** Before `what` ('create' or 'apply'): settings the core refuses are named, settings that need a
   *  confirmation are shown and the button asks for a second click with the same values; returns whether to go on. */
  async confirmSettings(what, manifest) {
    const out = await this.showReview(manifest);
    // A refused form still goes to the API, which refuses it again by name: state.error and the log say so too.
    if (out && out.refused) return true;
    if (!out || !out.review.needsConfirmation) return true;
    const key = JSON.stringify([what, out.settings]);
    if (this.confirmed === key) { this.confirmed = null; return true; }
    this.confirmed = key;
    this.f.review.prepend(h('div', { class: 'warn', text: `These values are far outside the usual: check them, or click ${what === 'create' ? 'Create anyway' : 'Apply anyway'} to go on.` }));
    return false;
  }

  describeSelection() {
    const sel = this.selection;
    const f = this.f;
    const parts = [];
    parts.push(sel.wasm ? `${sel.wasm.name} (${fmtBytes(sel.wasm.size)})` : 'no model');
    parts.push(sel.manifest ? sel.manifest.name : 'no manifest');
    const exp = experienceOf(sel.manifestJson);
    if (exp) parts.push(`experience model (${exp.unit && exp.unit.label || 'units'}), no dataset`);
    else parts.push(`${sel.files.length} dataset file${sel.files.length === 1 ? '' : 's'} (${fmtBytes(sel.files.reduce((a, x) => a + x.size, 0))})`);
    if (sel.validation) parts.push(`validation ${sel.validation.name}`);
    if (sel.ignored && sel.ignored.length) {
      parts.push(`not used: ${sel.ignored.slice(0, 3).join(', ')}${sel.ignored.length > 3 ? ` and ${sel.ignored.length - 3} more` : ''}`);
    }
    if (sel.executionFiles && sel.executionFiles.length) parts.push(`WGSL archive ${sel.executionFiles[0].name} (GPU)`);
    if (f.checkpoint.files[0]) parts.push(`from checkpoint ${f.checkpoint.files[0].name}`);
    f.selection.textContent = (sel.label ? `${sel.label}: ` : '') + parts.join(' · ');
    f.selection.classList.remove('muted');
  }

  /** Show Epochs, or Rounds and units per round, and fill values from `settings` if given. */
  fillSettings(settings, experience) {
    const f = this.f;
    this.experience = experience;
    f.epochsLabel.firstChild.textContent = experience ? 'Rounds' : 'Epochs';
    f.unitsLabel.classList.toggle('hidden', !experience);
    f.vunit.options[1].disabled = Boolean(experience);
    if (experience) {
      const upa = experience.unitsPerAssignment || {};
      f.unitsLabel.firstChild.textContent = `${(experience.unit && experience.unit.label) || 'Units'} per round`;
      if (upa.minimum) f.units.min = upa.minimum;
      if (upa.maximum) f.units.max = upa.maximum;
      if (!(settings && settings.experience) && upa.default) f.units.value = upa.default;
      if (f.vunit.value === 'epoch') f.vunit.value = 'round';
    }
    if (settings) {
      const set = (el, v) => { el.value = v === undefined || v === null ? '' : v; };
      set(f.epochs, settings.epochs ?? settings.rounds);
      set(f.localEpochs, settings.localEpochs);
      set(f.batchSize, settings.batchSize);
      set(f.learningRate, settings.learningRate);
      f.participates.checked = settings.coordinatorParticipates !== false;
      if (settings.experience) set(f.units, settings.experience.unitsPerAssignment);
      const agg = settings.aggregation || { method: 'fedavg' };
      f.method.value = agg.method;
      for (const k of ['serverLearningRate', 'momentum', 'beta1', 'beta2', 'epsilon', 'normClip', 'trim', 'excludeOutliersAfter']) set(f[k], agg[k]);
      f.combine.value = agg.combine || 'mean';
      f.nesterov.checked = agg.nesterov === 1;
      const compression = settings.compression || {};
      f.compression.value = compression.kind || '';
      set(f.compressionBlock, compression.block);
      f.compressionDeflate.checked = Boolean(compression.deflate);
      // A restored or continued job's privacy fills back too: Apply must send the privacy it was created with.
      const privacy = settings.privacy || {};
      const dp = privacy.dp || {};
      f.secureAggregation.checked = Boolean(privacy.secureAggregation);
      set(f.secureClip, privacy.clip ?? PRIVACY_DEFAULTS.clip);
      set(f.threshold, privacy.threshold);
      f.dp.checked = Boolean(privacy.dp);
      set(f.dpClip, dp.clip ?? PRIVACY_DEFAULTS.clip);
      set(f.noiseMultiplier, dp.noiseMultiplier ?? PRIVACY_DEFAULTS.noiseMultiplier);
      set(f.delta, dp.delta ?? PRIVACY_DEFAULTS.delta);
      set(f.dpRounds, dp.maxRounds ?? PRIVACY_DEFAULTS.maxRounds);
      f.noiseAt.value = dp.noiseAt || 'coordinator';
      const vs = settings.validationSchedule;
      f.venabled.checked = Boolean(vs && vs.enabled);
      if (vs) { f.vunit.value = vs.unit; set(f.vevery, vs.every); }
    }
    this.updateMethodFields();
  }

  updateMethodFields() {
    const f = this.f;
    const m = f.method.value;
    const shown = { fedavg: [], fedavgm: ['serverLearningRate', 'momentum'], fedadam: ['serverLearningRate', 'beta1', 'beta2', 'epsilon'] }[m];
    for (const k of ['serverLearningRate', 'momentum', 'beta1', 'beta2', 'epsilon']) {
      f[k + 'Label'].classList.toggle('hidden', !shown.includes(k));
    }
    f.nesterovLabel.classList.toggle('hidden', m !== 'fedavgm');
    f.serverLearningRate.placeholder = m === 'fedadam' ? '0.01' : '1';
    f.trimLabel.classList.toggle('hidden', f.combine.value !== 'trimmedMean');
    f.compressionBlockLabel.classList.toggle('hidden', !f.compression.value);
    f.compressionDeflateLabel.classList.toggle('hidden', !f.compression.value);
    const secure = f.secureAggregation.checked;
    const dp = f.dp.checked;
    // With DP on, participants clip to the DP clip (a second clip could only conflict with it).
    f.secureClipLabel.classList.toggle('hidden', !secure || dp);
    f.thresholdLabel.classList.toggle('hidden', !secure);
    for (const k of ['dpClip', 'noiseMultiplier', 'delta', 'dpRounds', 'noiseAt']) f[k + 'Label'].classList.toggle('hidden', !dp);
    f.noiseAt.options[1].disabled = !secure;
    if (!secure) f.noiseAt.value = 'coordinator';
  }

  /** The form as TrainingSettings. Empty optional fields are left out (the defaults apply). */
  readSettings() {
    const f = this.f;
    const int = (el, what) => {
      const v = Number(el.value);
      if (el.value.trim() === '' || !Number.isInteger(v) || v < 1) throw Object.assign(new Error(`${what} must be a whole number of 1 or more`), { reason: 'invalid-setting' });
      return v;
    };
    const opt = (el) => (el.value.trim() === '' ? undefined : Number(el.value));
    const settings = {
      epochs: int(f.epochs, this.experience ? 'Rounds' : 'Epochs'),
      localEpochs: int(f.localEpochs, 'Local epochs'),
      batchSize: int(f.batchSize, 'Batch size'),
      coordinatorParticipates: f.participates.checked,
    };
    const lr = opt(f.learningRate);
    if (lr !== undefined) settings.learningRate = lr;
    if (this.experience) settings.experience = { unitsPerAssignment: int(f.units, this.f.unitsLabel.firstChild.textContent) };
    const method = f.method.value;
    const agg = { method };
    const keys = { fedavg: [], fedavgm: ['serverLearningRate', 'momentum'], fedadam: ['serverLearningRate', 'beta1', 'beta2', 'epsilon'] }[method];
    for (const k of [...keys, 'normClip']) { const v = opt(f[k]); if (v !== undefined) agg[k] = v; }
    if (method === 'fedavgm' && f.nesterov.checked) agg.nesterov = 1;
    if (f.combine.value !== 'mean') agg.combine = f.combine.value;
    if (f.combine.value === 'trimmedMean') { const v = opt(f.trim); if (v !== undefined) agg.trim = v; }
    const after = opt(f.excludeOutliersAfter);
    if (after !== undefined) agg.excludeOutliersAfter = after;
    if (Object.keys(agg).length > 1 || method !== 'fedavg') settings.aggregation = agg;
    if (f.compression.value) {
      settings.compression = { kind: f.compression.value };
      const block = opt(f.compressionBlock);
      if (block !== undefined) settings.compression.block = block;
      if (f.compressionDeflate.checked) settings.compression.deflate = true;
    }
    // Only what is ticked is sent (untouched, the settings are what they were without this section); an empty
    // required field is left out, so the core's refusal names it.
    const put = (obj, key, el) => { const v = opt(el); if (v !== undefined) obj[key] = v; };
    const privacy = {};
    if (f.secureAggregation.checked) {
      privacy.secureAggregation = true;
      if (!f.dp.checked) put(privacy, 'clip', f.secureClip);
      put(privacy, 'threshold', f.threshold);
    }
    if (f.dp.checked) {
      const dp = (privacy.dp = {});
      for (const [key, el] of [['clip', f.dpClip], ['noiseMultiplier', f.noiseMultiplier], ['delta', f.delta], ['maxRounds', f.dpRounds]]) put(dp, key, el);
      if (f.noiseAt.value === 'participants') dp.noiseAt = 'participants';
    }
    if (Object.keys(privacy).length) settings.privacy = privacy;
    settings.validationSchedule = { enabled: f.venabled.checked, unit: f.vunit.value, every: int(f.vevery, 'Validate every') };
    return settings;
  }

  async createJob() {
    const sel = this.selection;
    const settings = this.readSettings();
    if (!sel.wasm) throw Object.assign(new Error('Choose the model module (.wasm) or a demo'), { reason: 'missing-file' });
    if (!sel.manifest) throw Object.assign(new Error('Choose the manifest (.json)'), { reason: 'missing-file' });
    const request = { wasm: sel.wasm, manifest: sel.manifest, files: sel.files, settings };
    if (sel.validation) request.validation = sel.validation;
    const checkpoint = this.f.checkpoint.files[0];
    if (checkpoint) {
      await this.api.continueFromCheckpoint({ ...request, checkpoint, datasetMode: this.f.restore.checked ? 'resume' : 'new' });
    } else {
      if (sel.executionFiles && sel.executionFiles.length) request.executionFiles = sel.executionFiles;
      await this.api.createJob(request);
    }
  }

  renderSetup(state, job) {
    const f = this.f;
    if (job && job.id !== this.filledFor) {
      this.filledFor = job.id;
      if (job.role === 'coordinator' && job.settings) this.fillSettings(job.settings, experienceOf(job.info));
      // The form is for creating a job: once there is one, it folds away (it still applies settings).
      f.settingsBox.open = job.status === 'completed';
    }
    const coordinator = job && job.role === 'coordinator';
    const active = job && job.status !== 'completed';
    const busy = Boolean(state.preparing) || this.starting || Boolean(this.loadingDemo);
    setDisabled(f.create, busy || Boolean(active));
    const pending = this.confirmed ? JSON.parse(this.confirmed)[0] : null;
    f.create.textContent = this.starting ? 'Starting Weei…' : state.preparing ? 'Preparing…'
      : pending === 'create' ? 'Create anyway' : (f.checkpoint.files[0] ? 'Continue from checkpoint' : 'Create job');
    f.apply.textContent = pending === 'apply' ? 'Apply anyway' : 'Apply settings to job';
    f.demoDigits.disabled = f.demoCartpole.disabled = f.demoTransformer.disabled = busy;
    f.apply.classList.toggle('hidden', !(coordinator && active));
    setDisabled(f.start, !(coordinator && job.status === 'ready'));
    setDisabled(f.pause, !(coordinator && job.status === 'running'));
    setDisabled(f.resume, !(coordinator && job.status === 'paused'));
    setDisabled(f.stop, !(coordinator && (job.status === 'running' || job.status === 'paused')));
    const exp = job && experienceOf(job.info);
    setDisabled(f.shuffle, !(coordinator && active && !exp));
    const canValidate = coordinator && !job.validationUnavailable && !state.evaluating
      && (exp ? Boolean(job.info.capabilities && job.info.capabilities.evaluation) : true);
    setDisabled(f.validate, !canValidate);
    f.validate.textContent = state.evaluating ? 'Validating…' : 'Run validation';
    f.choose.classList.toggle('hidden', Boolean(active));
    f.create.classList.toggle('hidden', Boolean(active));
    f.jobBox.classList.toggle('hidden', !job);
    f.settingsBox.classList.toggle('hidden', Boolean(active && !coordinator));
    f.actions.classList.toggle('hidden', Boolean(active && !coordinator));
    if (job) {
      const info = job.info || {};
      const bits = [`${info.name || info.id || 'model'}${info.version ? ' ' + info.version : ''}`,
        `job ${job.id}`, job.role, job.status];
      if (job.shuffled) bits.push('chunks shuffled');
      if (job.incomplete) bits.push('finished before every chunk was trained');
      if (job.validationUnavailable) bits.push('validation file missing from browser storage');
      // Rebuilt only when it changes: the copy button must survive between mouse down and up.
      const line = bits.join(' · ');
      if (f.jobLine.dataset.line !== line) { f.jobLine.dataset.line = line; f.jobLine.replaceChildren(line, copyButton(job.id, 'job ID')); }
    }
    this.sections.setup.note.textContent = job ? `${job.status}` : '';
  }
}
