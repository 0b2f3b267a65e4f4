// Storage in the Saved jobs section: bytes per saved job (getStorageUse), the browser's quota
// (navigator.storage.estimate), a warning before it is full, and the checkpoint retention setting.
// Methods of the window's Widget class (mixed into it by window.js): `this` is the Widget.

import { h, append, fmtBytes, fmtNum } from './dom.js';

// Warn when the browser's storage for this site is this full.
export const WARN_FRACTION = 0.8;
const REFRESH_MS = 5000;

/** The warning for `usage` of `quota` bytes, or null below WARN_FRACTION (or when unknown). */
export function quotaWarning(usage, quota) {
  if (!(quota > 0) || !(usage >= 0) || usage / quota < WARN_FRACTION) return null;
  return `Storage is ${Math.round((100 * usage) / quota)} % full (${fmtBytes(usage)} of ${fmtBytes(quota)}): `
    + 'delete saved jobs or keep fewer checkpoint files, or the next checkpoint may not be saved.';
}

export class StorageUse {
  buildStorage() {
    const u = (this.u = { at: 0, key: null, running: false });
    u.keep = h('input', { type: 'number', name: 'keepCheckpoints', min: 0, max: 100000, step: 1, style: 'width:5em',
      'aria-label': 'Checkpoint files to keep' });
    u.error = h('div', { class: 'error hidden', role: 'alert' });
    u.keep.addEventListener('change', () => this.act(null, u.error, () => this.api.setCheckpointRetention(Number(u.keep.value))));
    u.warn = h('p', { class: 'warn hidden', role: 'alert', 'data-field': 'quotaWarning' });
    u.line = h('p', { class: 'small', 'data-field': 'storageLine' });
    u.jobs = h('div', { class: 'small muted', 'data-field': 'storageJobs' });
    u.box = h('div', { class: 'storage' }, h('h3', { text: 'Storage' }), u.warn, u.line, u.jobs,
      h('p', { class: 'row small' }, h('label', {}, 'Keep the newest ', u.keep, ' checkpoint files of a job and its best (0: all)')),
      u.error);
    append(this.sections.saved.content, u.box);
  }

  renderStorage(state, job) {
    const u = this.u;
    const retention = state.checkpointRetention;
    if (retention && this.root.activeElement !== u.keep) u.keep.value = retention.keepLast;
    const key = JSON.stringify([(state.savedJobs || []).map((s) => [s.id, s.round]), job && job.checkpoints.length]);
    if ((key !== u.key || Date.now() - u.at > 4 * REFRESH_MS) && !u.running && Date.now() - u.at > REFRESH_MS) {
      u.key = key;
      this.refreshStorage();
    }
  }

  async refreshStorage() {
    const u = this.u;
    u.running = true;
    u.at = Date.now();
    try {
      const [use, estimate] = await Promise.all([this.api.getStorageUse(),
        navigator.storage && navigator.storage.estimate ? navigator.storage.estimate().catch(() => null) : null]);
      const warning = estimate ? quotaWarning(estimate.usage, estimate.quota) : null;
      u.warn.textContent = warning || '';
      u.warn.classList.toggle('hidden', !warning);
      u.line.textContent = `Weei keeps ${fmtBytes(use.totalBytes)} here`
        + (estimate && estimate.quota ? ` · this site uses ${fmtBytes(estimate.usage)} of ${fmtBytes(estimate.quota)} the browser allows` : '');
      const saved = new Map((this.state && this.state.savedJobs || []).map((s) => [s.id, s]));
      u.jobs.replaceChildren(...Object.entries(use.jobs).map(([id, j]) => h('div', { 'data-job': id },
        `${(saved.get(id) && saved.get(id).model) || id}: ${fmtNum(j.checkpoints)} checkpoints, ${fmtNum(j.files)} with their file `
        + `(${fmtBytes(j.checkpointBytes)}) · files ${fmtBytes(j.artifactBytes)}`)));
    } catch { /* the next change asks again */ } finally {
      u.running = false;
    }
  }
}
