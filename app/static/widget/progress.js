// The window's Progress section: the job's bar with its estimated time, one bar per training peer
// (remote peers' from their progress messages), transfers, and a final state that reads as one.
// Methods of the window's Widget class (mixed into it by window.js): `this` is the Widget.

import { h, fmtNum, fmtBytes, fmtDuration, experienceOf } from './dom.js';
import { peerLabel } from './names.js';
import { EtaSmoother, elapsedText } from './status.js';

// What a peer is doing before its first progress report (diagnostics stage), in words.
const STAGE_TEXT = {
  waiting: 'waiting for work', receiving: 'receiving the model and data', preparing: 'loading the model',
  compiling: 'compiling GPU shaders', training: 'training', uploading: 'sending its update',
  awaitingAggregation: 'update sent; waiting for the round to close', error: 'failed',
};
const SLOT_TEXT = { loading: 'receiving files and loading', training: 'training', received: 'update received', stopped: 'stopped' };

/** The model's unit in its own words, singular or plural: "32 episodes", "1 episode". */
export function unitWords(job, count) {
  const exp = experienceOf(job && job.info);
  const label = exp && exp.unit ? String(exp.unit.label || exp.unit.id || 'units') : 'examples';
  const plural = label.toLowerCase();
  const one = exp && exp.unit && exp.unit.id ? String(exp.unit.id).toLowerCase() : plural.replace(/s$/, '');
  return typeof count === 'number' ? `${fmtNum(count)} ${count === 1 ? one : plural}` : plural;
}

export class Progress {
  renderProgress(state, job) {
    const diag = state.diagnostics || {};
    const stages = Object.fromEntries(Object.entries(diag).map(([p, d]) => [p, d && d.stage]));
    const key = job ? [job.status, job.role, job.progress, job.slots, job.checkpoints.length, job.settings && job.settings.epochs,
      job.incomplete, state.progress, state.transfers, state.transferErrors, state.estimatedRemainingMs, state.transitioning,
      state.evaluating, state.busy, stages, state.execution && state.execution.phase, job.privacy,
      job.status === 'running' ? Math.floor(Date.now() / 1000) : 0] : null; // the elapsed time ticks
    this.section('progress', key, () => {
      if (!job) return h('p', { class: 'muted', text: 'No job.' });
      const out = [];
      const last = job.checkpoints[job.checkpoints.length - 1];
      const exp = experienceOf(job.info);
      const done = job.status === 'completed';
      const bar = (label, value, max, text) => {
        const frac = max > 0 ? Math.max(0, Math.min(1, value / max)) : 0;
        return h('div', { class: 'progress' },
          h('span', { class: 'lbl', text: label }),
          h('div', { class: `bar${frac >= 1 ? ' done' : ''}`, role: 'progressbar', 'aria-label': label,
            'aria-valuemin': 0, 'aria-valuemax': max, 'aria-valuenow': Math.min(value, max) }, h('i', { style: `width:${(frac * 100).toFixed(1)}%` })),
          h('span', { class: 'val', text }));
      };

      if (done) {
        // The final state: success, said as such (an incomplete job says what is missing).
        const rounds = last ? last.artifact.round : 0;
        out.push(h('p', { class: job.incomplete ? 'warn' : 'ok', 'data-final': job.incomplete ? 'incomplete' : 'success',
          text: job.incomplete ? `Finished, but some work could not be trained (see the debug log) · ${rounds} rounds`
            : `✓ Training finished · ${rounds} round${rounds === 1 ? '' : 's'} · ${job.checkpoints.length} checkpoint${job.checkpoints.length === 1 ? '' : 's'}`
              + (job.role === 'participant' ? ' · thank you for taking part' : '') }));
      }
      const dp = job.privacy && job.privacy.dp;
      if (dp) {
        // ε spent so far and planned, from the coordinator's accountant (core/privacy/dp_accountant.py).
        const eps = (x) => (x === null ? '∞' : Number(x).toPrecision(3));
        out.push(h('p', { class: 'small', 'data-field': 'privacy',
          text: `Differential privacy: ε ${eps(dp.epsilon)} spent of ${eps(dp.plannedEpsilon)} planned at δ ${dp.delta} · ${dp.rounds} / ${dp.maxRounds} rounds${dp.noiseAt === 'participants' ? ' · noise added by the participants' : ''}` }));
      }
      if (exp) {
        const planned = job.settings && job.settings.epochs || 0;
        const rounds = last ? last.artifact.round : 0;
        const units = (job.settings && job.settings.experience && job.settings.experience.unitsPerAssignment)
          || (exp.unitsPerAssignment && exp.unitsPerAssignment.default);
        out.push(bar('Rounds', rounds, planned, `${fmtNum(rounds)} / ${fmtNum(planned)}`
          + (units ? ` · ${unitWords(job, units)} per round and peer` : '')));
      } else if (job.progress) {
        const p = job.progress;
        const passes = last && typeof last.datasetProgress === 'number' ? last.datasetProgress : p.datasetEpoch;
        out.push(bar('Dataset passes', passes, p.plannedEpochs, `${fmtNum(passes, 3)} / ${p.plannedEpochs}`));
        out.push(h('p', { class: 'small muted', text: `${p.remainingChunks} of ${p.totalChunks} chunks left in this pass · ${job.checkpoints.length} checkpoints` }));
      } else if (job.role === 'participant' && !done) {
        const rounds = last ? last.artifact.round : 0;
        out.push(h('p', { class: 'small muted', text: `The coordinator plans the work; this browser trains what it is given`
          + (last ? ` · latest checkpoint: round ${rounds}` : '') }));
      }
      const eta = state.estimatedRemainingMs ?? (job.progress && job.progress.estimatedRemainingMs);
      const flags = [];
      if (state.transitioning) flags.push('averaging updates into a checkpoint');
      if (state.evaluating) flags.push('validating');
      this.etaSmoother = this.etaSmoother || new EtaSmoother();
      const smooth = done ? null : this.etaSmoother.update(eta);
      const elapsed = job.status === 'ready' ? null : elapsedText(job);
      if (elapsed) flags.push(elapsed);
      if (!done && typeof smooth === 'number') flags.push(`about ${fmtDuration(smooth)} left at the measured speed`);
      else if (!done && job.status === 'running' && job.role === 'coordinator') flags.push('estimating the time left once the first progress arrives…');
      if (flags.length) out.push(h('p', { class: 'small', 'data-eta': typeof eta === 'number' ? eta : '', text: flags.join(' · ') }));

      if (!done) out.push(...this.peerBars(state, job, last));

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
      const lastRound = last ? last.artifact.round : 0;
      this.sections.progress.note.textContent = done ? 'finished'
        : exp ? `${lastRound} / ${job.settings.epochs} rounds`
          : job.progress ? `${fmtNum(last && typeof last.datasetProgress === 'number' ? last.datasetProgress : job.progress.datasetEpoch, 3)} / ${job.progress.plannedEpochs} passes`
            : (job.role === 'participant' && last ? `round ${lastRound}` : '');
      return out;
    });
  }

  /** One bar per peer training in the current round (a participant: its own). */
  peerBars(state, job, last) {
    const out = [h('h3', { text: `Current round${last ? ' ' + (last.artifact.round + 1) : ''}` })];
    const slots = job.slots || [];
    const progress = state.progress || {};
    const diag = state.diagnostics || {};
    const peers = new Set(slots.map((s) => s.peerId));
    for (const p of Object.keys(progress)) peers.add(p);
    if (job.role === 'participant') peers.add(state.myPeerId);
    if (!peers.size) {
      out.push(h('p', { class: 'small muted', text: job.status === 'running' ? 'Handing out the first assignments…' : 'No assignments.' }));
    }
    for (const peer of peers) {
      const slot = slots.find((s) => s.peerId === peer);
      const pr = progress[peer];
      const d = diag[peer];
      const stage = peer === state.myPeerId && state.execution ? state.execution.phase : d && d.stage;
      const received = slot && slot.status === 'received';
      const processed = pr ? pr.processedExamples : 0;
      const total = pr && pr.totalExamples ? pr.totalExamples : 0;
      const frac = received ? 1 : total ? Math.min(1, processed / total) : 0;
      const who = peerLabel(state, peer, { you: 'this browser' });
      // What: the chunk, or the model's units ("32 episodes") instead of an id like "units-64".
      const what = slot && slot.units ? unitWords(job, slot.units.count) : slot ? slot.chunkId : null;
      const doing = pr && !received ? null
        : received ? SLOT_TEXT.received : STAGE_TEXT[stage] || (slot ? SLOT_TEXT[slot.status] : null);
      const rate = pr && pr.recordsPerSecond;
      const left = rate && total > processed ? (1000 * (total - processed)) / rate : null;
      const text = [what, pr && !received ? `${fmtNum(processed)} / ${fmtNum(total)}` : null, doing,
        rate ? `${fmtNum(rate, 3)} ${unitWords(job)}/s` : null, left ? `${fmtDuration(left)} left` : null].filter(Boolean).join(' · ');
      out.push(h('div', { class: 'progress', title: peer, 'data-peer': peer },
        h('span', { class: 'lbl' }, who, ' ', slot ? h('span', { class: `chip ${slot.status}`, text: slot.status }) : null),
        h('div', { class: `bar${frac >= 1 ? ' done' : ''}`, role: 'progressbar', 'aria-label': `${who} progress`,
          'aria-valuemin': 0, 'aria-valuenow': received ? 1 : Math.min(processed, total), 'aria-valuemax': received ? 1 : total,
          'aria-valuetext': text || undefined },
        h('i', { style: `width:${(100 * frac).toFixed(1)}%` })),
        h('span', { class: 'val', text })));
      if (slot && slot.error) out.push(h('div', { class: 'warn', text: `${who}: ${slot.error}` }));
    }
    return out;
  }
}
