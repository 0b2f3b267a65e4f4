// The window's Saved jobs section.
// Methods of the window's Widget class (mixed into it by window.js): `this` is the Widget.

import { h, append, fmtTime, setDisabled } from './dom.js';

export class Saved {
  buildSaved() {
    const v = (this.v = { cells: new Map() });
    v.error = h('div', { class: 'error hidden', role: 'alert' });
    v.leave = h('button', { type: 'button', text: 'Leave job', title: 'The job stops here and stays in Saved jobs' });
    v.leave.addEventListener('click', () => this.act(v.leave, v.error, () => this.api.leave()));
    v.table = h('div');
    append(this.sections.saved.content,
      h('div', { class: 'row' }, v.leave, h('span', { class: 'small muted', text: 'Jobs and checkpoints are kept in this browser (IndexedDB).' })),
      v.error, v.table);
  }

  renderSaved(state, job) {
    const v = this.v;
    const saved = state.savedJobs || [];
    setDisabled(v.leave, !job);
    this.sections.saved.note.textContent = saved.length ? String(saved.length) : '';
    // Rows (and their buttons) are rebuilt only when the list changes; round and time update in place.
    const key = [saved.map((s) => [s.id, s.model, s.status, s.active]), job ? [job.id, job.status] : null];
    this.section('saved', key, () => {
      v.cells.clear();
      if (!saved.length) return h('p', { class: 'muted', text: 'No saved jobs.' });
      const rows = saved.map((s) => {
        const open = h('button', { type: 'button', text: 'Open', disabled: s.active || Boolean(job && job.status !== 'completed') });
        const del = h('button', { type: 'button', class: 'danger', text: 'Delete', disabled: Boolean(job && job.id === s.id) });
        open.addEventListener('click', () => this.act(open, v.error, () => this.api.openSavedJob(s.id)));
        del.addEventListener('click', () => {
          if (!window.confirm(`Delete saved job ${s.id} and its checkpoints from this browser?`)) return;
          this.act(del, v.error, () => this.api.deleteSavedJob(s.id));
        });
        const round = h('td');
        const updated = h('td');
        v.cells.set(s.id, { round, updated });
        return h('tr', { 'data-job': s.id },
          h('td', {}, s.model || '—', h('div', { class: 'sub mono', text: s.id })),
          h('td', {}, h('span', { class: `chip ${s.status}`, text: s.status }), s.active ? h('div', { class: 'sub', text: 'active' }) : null),
          round, updated,
          h('td', {}, h('div', { class: 'row', style: 'margin:0' }, open, del)));
      });
      return h('div', { class: 'tablewrap' }, h('table', { class: 'saved' },
        h('thead', {}, h('tr', {}, ['Model', 'Status', 'Round', 'Updated', ''].map((t) => h('th', { text: t })))),
        h('tbody', {}, rows)));
    }, v.table);
    for (const s of saved) {
      const cells = v.cells.get(s.id);
      if (!cells) continue;
      cells.round.textContent = s.round;
      cells.updated.textContent = fmtTime(s.updatedAt);
    }
  }
}
