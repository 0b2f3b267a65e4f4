// The window's Checkpoints section.
// Methods of the window's Widget class (mixed into it by window.js): `this` is the Widget.

import { h, append, fmtNum, fmtBytes, fmtTime, setDisabled, saveFile } from './dom.js';

export class Checkpoints {
  /** The buttons stay the same elements (a rebuild between mouse down and up would swallow a click). */
  buildCheckpoints() {
    const c = (this.c = {});
    c.error = h('div', { class: 'error hidden', role: 'alert' });
    c.download = h('button', { type: 'button', class: 'primary', text: 'Download latest checkpoint' });
    c.download.addEventListener('click', () => this.act(c.download, c.error, async () => {
      const file = await this.api.exportCheckpoint();
      saveFile(this.root, file, 'checkpoint.weei-checkpoint');
    }));
    c.module = h('button', { type: 'button', name: 'downloadModule', text: 'Download module (.wasm, no weights)',
      title: 'The model\'s WebAssembly module: its code, without trained weights (those are in the checkpoint)' });
    c.module.addEventListener('click', () => this.act(c.module, c.error, async () => {
      const file = await this.api.exportModule();
      if (!file) throw new Error('This browser does not keep the model module of this job');
      saveFile(this.root, file, 'model.wasm');
    }));
    c.file = h('span', { class: 'small muted' });
    c.toolbar = h('div', { class: 'row' }, c.download, c.module, c.file);
    c.table = h('div');
    append(this.sections.checkpoints.content, c.toolbar, c.error, c.table);
  }

  /** The checkpoint of `round` as the imported ONNX file with its weights (exported in the host worker's Python). */
  onnxButton(round) {
    const button = h('button', { type: 'button', class: 'small', text: 'Download as ONNX', title: `Round ${round}'s weights in the imported ONNX file` });
    button.addEventListener('click', () => this.act(button, this.c.error, async () => {
      saveFile(this.root, await this.api.exportOnnx(round, this.onnxSource.file), 'model.onnx');
    }));
    return button;
  }

  renderCheckpoints(state, job) {
    const c = this.c;
    const cps = job ? job.checkpoints : [];
    const last = cps[cps.length - 1];
    c.toolbar.classList.toggle('hidden', !job);
    const participant = Boolean(job && job.role === 'participant');
    // A participant lists the coordinator's checkpoints (its checkpoint messages); the files stay there.
    c.download.classList.toggle('hidden', participant);
    setDisabled(c.download, !cps.length || !job || participant);
    setDisabled(c.module, !job || !job.hasModuleFile);
    c.file.textContent = last ? `${last.artifact.fileName} · ${fmtBytes(last.artifact.bytes)}`
      + (participant ? ' · the coordinator keeps the checkpoint files' : '') : '';
    this.sections.checkpoints.note.textContent = last ? `${cps.length}, latest round ${last.artifact.round}` : '';
    // Download as ONNX: for a job of the model this window imported from an ONNX file, whose checkpoints it keeps.
    const onnx = Boolean(job && !participant && this.onnxSource && job.info && job.info.id === this.onnxSource.modelId);
    const key = job ? [job.id, onnx, cps.length, cps.map((x) => (x.validationMetrics ? 'v' : '') + (x.validationError ? 'e' : '') + (x.fileKept === false ? 'r' : '')).join('')] : null;
    this.section('checkpoints', key, () => {
      if (!job) return h('p', { class: 'muted', text: 'No job.' });
      if (!cps.length) {
        return h('p', { class: 'muted', text: job.role === 'participant'
          ? 'The job\'s checkpoints appear here as the coordinator saves them.' : 'No checkpoints yet.' });
      }
      const metrics = (job.info && job.info.metrics) || [];
      const values = (obj) => metrics.map((m) => (obj && obj.values && typeof obj.values[m.id] === 'number'
        ? `${metrics.length > 1 ? m.label + ' ' : ''}${fmtNum(obj.values[m.id])}` : '')).filter(Boolean).join(' · ') || '—';
      const rows = cps.slice().reverse().slice(0, 200).map((x) => h('tr', {},
        h('td', { text: x.artifact.round }),
        h('td', { text: fmtNum(x.metrics ? x.metrics.examplesProcessed : undefined) }),
        h('td', { text: x.artifact.round === 0 ? '—' : values(x.metrics) }),
        h('td', { title: x.validationError || '' }, x.validationError ? h('span', { class: 'chip error', text: 'failed' }) : values(x.validationMetrics)),
        h('td', {}, fmtTime(x.createdAt), x.fileKept === false ? h('div', { class: 'sub', text: 'file removed (retention)' }) : null),
        ...(onnx ? [h('td', {}, this.onnxButton(x.artifact.round))] : [])));
      const label = metrics.length === 1 ? ` (${metrics[0].label})` : '';
      // Focusable: the table scrolls in its box, and keyboard users must be able to scroll it.
      return h('div', { class: 'tablewrap', tabindex: '0', role: 'region', 'aria-label': 'Checkpoints table' }, h('table', { class: 'checkpoints' },
        h('thead', {}, h('tr', {}, ['Round', 'Examples', `Metrics${label}`, 'Validation', 'Created', ...(onnx ? ['ONNX'] : [])]
          .map((t) => h('th', { text: t })))),
        h('tbody', {}, rows)));
    }, c.table);
  }
}
