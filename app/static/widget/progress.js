// The window's Progress section.
// Methods of the window's Widget class (mixed into it by window.js): `this` is the Widget.

import { h, fmtNum, fmtBytes, fmtDuration, experienceOf } from './dom.js';

export class Progress {
  renderProgress(state, job) {
    const key = job ? [job.status, job.progress, job.slots, job.checkpoints.length, job.settings && job.settings.epochs,
      state.progress, state.transfers, state.transferErrors, state.estimatedRemainingMs, state.transitioning,
      state.evaluating, state.busy] : null;
    this.section('progress', key, () => {
      if (!job) return h('p', { class: 'muted', text: 'No job.' });
      const out = [];
      const last = job.checkpoints[job.checkpoints.length - 1];
      const exp = experienceOf(job.info);
      const bar = (label, value, max, text) => {
        const frac = max > 0 ? Math.max(0, Math.min(1, value / max)) : 0;
        return h('div', { class: 'progress' },
          h('span', { class: 'lbl', text: label }),
          h('div', { class: `bar${frac >= 1 ? ' done' : ''}`, role: 'progressbar', 'aria-label': label,
            'aria-valuemin': 0, 'aria-valuemax': max, 'aria-valuenow': value }, h('i', { style: `width:${(frac * 100).toFixed(1)}%` })),
          h('span', { class: 'val', text }));
      };
      if (exp) {
        const planned = job.settings && job.settings.epochs || 0;
        const done = last ? last.artifact.round : 0;
        out.push(bar('Rounds', done, planned, `${done} / ${planned}`));
      } else if (job.progress) {
        const p = job.progress;
        const passes = last && typeof last.datasetProgress === 'number' ? last.datasetProgress : p.datasetEpoch;
        out.push(bar('Dataset passes', passes, p.plannedEpochs, `${fmtNum(passes, 3)} / ${p.plannedEpochs}`));
        out.push(h('p', { class: 'small muted', text: `${p.remainingChunks} of ${p.totalChunks} chunks left in this pass · ${job.checkpoints.length} checkpoints` }));
      } else if (job.role === 'participant') {
        out.push(h('p', { class: 'small muted', text: 'The coordinator reports the dataset progress; this browser trains the chunks it is given.' }));
      }
      const eta = state.estimatedRemainingMs ?? (job.progress && job.progress.estimatedRemainingMs);
      const flags = [];
      if (state.transitioning) flags.push('averaging updates into a checkpoint');
      if (state.evaluating) flags.push('validating');
      if (typeof eta === 'number') flags.push(`about ${fmtDuration(eta)} left`);
      if (flags.length) out.push(h('p', { class: 'small', text: flags.join(' · ') }));

      out.push(h('h3', { text: `Current round${last ? ' ' + (last.artifact.round + 1) : ''}` }));
      const slots = job.slots || [];
      const progress = state.progress || {};
      const peers = new Set(slots.map((s) => s.peerId));
      for (const p of Object.keys(progress)) peers.add(p);
      if (!peers.size) {
        out.push(h('p', { class: 'small muted', text: job.status === 'running' ? 'Waiting for assignments…' : 'No assignments.' }));
      }
      for (const peer of peers) {
        const slot = slots.find((s) => s.peerId === peer);
        const pr = progress[peer];
        const done = pr ? pr.processedExamples : (slot && slot.status === 'received' ? 1 : 0);
        const total = pr && pr.totalExamples ? pr.totalExamples : (slot && slot.status === 'received' ? 1 : 0);
        const who = peer === state.myPeerId ? 'this browser' : peer.slice(0, 10);
        const text = [slot && slot.chunkId, pr ? `${fmtNum(pr.processedExamples)}${pr.totalExamples ? ' / ' + fmtNum(pr.totalExamples) : ''}` : null,
          pr && pr.recordsPerSecond ? `${fmtNum(pr.recordsPerSecond, 3)}/s` : null].filter(Boolean).join(' · ');
        out.push(h('div', { class: 'progress', title: peer },
          h('span', { class: 'lbl' }, who, ' ', slot ? h('span', { class: `chip ${slot.status}`, text: slot.status }) : null),
          h('div', { class: 'bar', role: 'progressbar', 'aria-label': `${who} progress`, 'aria-valuenow': done, 'aria-valuemax': total || 0 },
            h('i', { style: `width:${total ? Math.min(100, (100 * done) / total).toFixed(1) : 0}%` })),
          h('span', { class: 'val', text })));
        if (slot && slot.error) out.push(h('div', { class: 'error', text: `${who}: ${slot.error}` }));
      }

      const transfers = state.transfers || [];
      const terrs = Object.entries(state.transferErrors || {});
      if (transfers.length || terrs.length) {
        out.push(h('h3', { text: 'Transfers' }));
        for (const t of transfers) {
          out.push(bar(`${t.direction === 'send' ? '↑ to' : '↓ from'} ${t.peerId.slice(0, 8)}`, t.bytes, t.totalBytes,
            `${fmtBytes(t.bytes)} / ${fmtBytes(t.totalBytes)} · ${fmtBytes(t.bytesPerSecond)}/s`
            + (typeof t.remainingSeconds === 'number' ? ` · ${fmtDuration(t.remainingSeconds * 1000)} left` : '')));
        }
        for (const [id, message] of terrs) out.push(h('div', { class: 'error', text: `Transfer ${id}: ${message}` }));
      }
      this.sections.progress.note.textContent = exp
        ? `${last ? last.artifact.round : 0} / ${job.settings.epochs} rounds`
        : job.progress ? `${fmtNum(last && typeof last.datasetProgress === 'number' ? last.datasetProgress : job.progress.datasetEpoch, 3)} / ${job.progress.plannedEpochs} passes` : '';
      return out;
    });
  }
}
