// The window's Execution diagnostics section.
// Methods of the window's Widget class (mixed into it by window.js): `this` is the Widget.

import { h, missing, show, fmtNum, fmtMs, shortHash, copyButton } from './dom.js';
import { peerLabel } from './names.js';
import { peerCardsView } from './peercards.js';
import { gpuNote } from './status.js';

export class Diagnostics {
  renderDiagnostics(state, job) {
    const diag = state.diagnostics || {};
    const ended = Boolean(job && job.status === 'completed'); // the last snapshots are final, not live or stale
    const key = [diag, state.myPeerId, ended, state.peerNames];
    this.section('diagnostics', key, () => {
      const entries = Object.entries(diag);
      this.sections.diagnostics.note.textContent = entries.length ? `${entries.length} peer${entries.length === 1 ? '' : 's'}` : '';
      if (!entries.length) return h('p', { class: 'muted', text: 'No diagnostics yet: they appear once a peer takes part in a job.' });
      const rows = entries.map(([peer, d]) => {
        const env = d.environment || {};
        const ex = d.execution || {};
        const gpu = d.gpu || {};
        const a = d.assignment;
        const t = d.timings || {};
        const p = d.performance || {};
        const adapter = gpu.adapter && gpu.adapter !== 'unknown'
          ? [gpu.adapter.vendor, gpu.adapter.device || gpu.adapter.architecture].filter((x) => !missing(x)).join(' ') || gpu.adapter.description : null;
        const note = gpuNote(d); // one line, as information for the normal CPU fallback on a software GPU
        const timing = [['prep', t.preparationMs], ['compile', t.compilationMs], ['train', t.trainingMs], ['upload', t.uploadMs]]
          .filter(([, v]) => typeof v === 'number').map(([k, v]) => `${k} ${fmtMs(v)}`);
        const fresh = ended ? 'final' : d.stale ? `stale ${Math.round((d.ageMs || 0) / 1000)} s` : 'live';
        const stage = ended && d.stage !== 'error' ? 'finished' : d.stage;
        return h('tr', { class: peer === state.myPeerId ? 'me' : '', 'data-peer': peer },
          h('td', { title: peer }, peerLabel(state, peer, { you: 'this browser' }), copyButton(peer, 'peer ID'),
            d.connected === false ? h('div', { class: 'sub', text: 'disconnected' }) : null),
          h('td', {}, `${show(env.browser)} ${missing(env.browserVersion) ? '' : env.browserVersion}`.trim(),
            h('div', { class: 'sub', text: `${show(env.os)}${missing(env.logicalCores) ? '' : ` · ${env.logicalCores} cores`}` })),
          h('td', {}, show(ex.actual), ex.requested && ex.requested !== 'auto' && ex.requested !== ex.actual ? h('span', { class: 'sub', text: ` (asked ${ex.requested})` }) : null,
            h('div', { class: 'sub', text: show(ex.backend) }),
            ex.fallbackReason && !(note && !note.error) ? h('div', { class: 'sub wrap', text: `fallback: ${ex.fallbackReason}` }) : null),
          h('td', { text: `${show(ex.activeWorkers)} / ${show(ex.workerLimit)}` }),
          h('td', {}, gpu.webgpu === 'available' ? 'WebGPU' : 'no WebGPU', h('div', { class: 'sub', text: adapter || '—' }),
            h('div', { class: 'sub', text: `budget ${show(gpu.memoryBudgetMiB)} MiB` }), note ? h('div', { class: `sub wrap${note.error ? ' gpuerror' : ' gpuinfo'}`, text: note.error ? `error: ${note.text}` : note.text }) : null),
          h('td', {}, a ? `round ${a.round}` : '—', a ? h('div', { class: 'sub', text: `${show(a.chunkId)} · ${fmtNum(a.exampleCount)} ex` }) : null,
            a ? h('div', { class: 'sub', text: `batch ${show(a.batchSize)} · ${show(a.localEpochs)} ep · lr ${show(a.learningRate, fmtNum)}` }) : null),
          h('td', {}, h('span', { class: `chip ${stage === 'error' ? 'error' : stage === 'training' ? 'training' : stage === 'finished' ? 'completed' : ''}`, text: show(stage), title: show(d.stage) }),
            d.error ? h('div', { class: 'sub wrap', text: d.error }) : null),
          h('td', { class: 'small' }, timing.length ? timing.map((x) => h('div', { text: x })) : '—'),
          h('td', {}, p.currentExamplesPerSecond == null ? '—' : `${fmtNum(p.currentExamplesPerSecond, 3)}/s`,
            h('div', { class: 'sub', text: `avg ${p.averageExamplesPerSecond == null ? '—' : fmtNum(p.averageExamplesPerSecond, 3) + '/s'}` }),
            h('div', { class: 'sub', text: `${fmtNum(p.processedExamples || 0)} / ${show(p.totalExamples, fmtNum)}` })),
          h('td', {}, h('span', { class: `chip ${ended ? 'completed' : d.stale ? 'stale' : 'live'}`, text: fresh })));
      });
      const { text, hashes } = consistency(entries, state.myPeerId);
      const wrap = h('div', { class: 'tablewrap wide', tabindex: '0', role: 'region', 'aria-label': 'Diagnostics table (scrolls sideways)' }, h('table', { class: 'diagnostics' },
        h('thead', {}, h('tr', {}, ['Peer', 'Browser / OS', 'Mode', 'Workers', 'GPU', 'Assignment', 'Stage', 'Timings', 'Speed', 'Fresh']
          .map((t) => h('th', { text: t })))),
        h('tbody', {}, rows)));
      // The table is rebuilt as the diagnostics change (several times a second while training): where the
      // person scrolled it stays.
      const kept = this.diagScroll || [0, 0];
      wrap.addEventListener('scroll', () => { this.diagScroll = [wrap.scrollLeft, wrap.scrollTop]; });
      requestAnimationFrame(() => { wrap.scrollLeft = kept[0]; wrap.scrollTop = kept[1]; });
      return [peerCardsView(state, ended),
        h('p', { class: 'small consistency' }, text,
          hashes.map((sha) => copyButton(sha, hashes.length > 1 ? `model hash ${shortHash(sha)}` : 'model hash'))),
        // Wider than a narrow window: it scrolls inside its own box (focusable, so keys scroll it too).
        wrap,
      ];
    });
  }
}

// ---- consistency line ---------------------------------------------------------------------

function consistency(entries, me) {
  const models = new Map();
  const settings = new Map();
  const unknownModel = [];
  for (const [peer, d] of entries) {
    const name = peer === me ? 'this browser' : peer.slice(0, 10);
    if (d.model && d.model !== 'unknown' && d.model.wasmSha256) {
      models.set(d.model.wasmSha256, [...(models.get(d.model.wasmSha256) || []), name]);
    } else unknownModel.push(name);
    if (d.assignment) {
      const a = d.assignment;
      const k = `batch ${show(a.batchSize)} · local epochs ${show(a.localEpochs)} · learning rate ${missing(a.learningRate) ? 'model default' : fmtNum(a.learningRate)}`;
      settings.set(k, [...(settings.get(k) || []), name]);
    }
  }
  const parts = [];
  if (entries.length === 1) parts.push('One participant reports diagnostics');
  if (models.size === 1) parts.push(`${entries.length > 1 ? 'All use the same model' : 'Model'} ${shortHash([...models.keys()][0])}`);
  else if (models.size > 1) parts.push(`Different models: ${[...models].map(([sha, who]) => `${shortHash(sha)} (${who.join(', ')})`).join('; ')}`);
  if (unknownModel.length && entries.length > 1) parts.push(`model not known yet for ${unknownModel.join(', ')}`);
  if (settings.size === 1) parts.push(`${entries.length > 1 && [...settings.values()][0].length === entries.length ? 'same settings' : 'settings'}: ${[...settings.keys()][0]}`);
  else if (settings.size > 1) parts.push(`Different settings: ${[...settings].map(([k, who]) => `${k} (${who.join(', ')})`).join('; ')}`);
  else parts.push('no assignment yet to compare settings');
  const same = models.size <= 1 && settings.size <= 1 && !unknownModel.length;
  return { text: (entries.length > 1 ? (same ? '✓ ' : '⚠ ') : '') + parts.join(' · ') + '.', hashes: [...models.keys()] };
}
