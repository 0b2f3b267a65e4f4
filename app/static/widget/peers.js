// The window's Peers & invitations section.
// Methods of the window's Widget class (mixed into it by window.js): `this` is the Widget.

import { h, append, show, fmtBytes, experienceOf } from './dom.js';

export class Peers {
  buildPeersDevice() {
    const d = (this.d = {});
    d.pause = h('input', { type: 'checkbox', name: 'pauseContribution' });
    d.workers = h('input', { type: 'number', name: 'maxLocalWorkers', min: 1, max: 64, step: 1, style: 'width:5em' });
    d.gpu = h('input', { type: 'number', name: 'gpuMemoryBudgetMiB', min: 0, step: 64, style: 'width:7em' });
    d.backend = h('select', { name: 'backendPreference' }, ['auto', 'cpu', 'gpu', 'hybrid'].map((v) => h('option', { value: v, text: v })));
    d.error = h('div', { class: 'error hidden', role: 'alert' });
    d.line = h('p', { class: 'small muted' });
    d.pause.addEventListener('change', () => this.act(null, d.error, () => this.api.pauseContribution(d.pause.checked)));
    d.workers.addEventListener('change', () => this.act(null, d.error, () => this.api.setMaxLocalWorkers(Number(d.workers.value))));
    d.gpu.addEventListener('change', () => this.act(null, d.error, () => this.api.setGpuMemoryBudgetMiB(Number(d.gpu.value))));
    d.backend.addEventListener('change', () => this.act(null, d.error, () => this.api.setBackendPreference(d.backend.value)));
    d.peersBox = h('div');
    d.partsBox = h('div');
    d.invBox = h('div');
    append(this.sections.peers.content, this.buildRoom(), d.peersBox, d.partsBox, d.invBox,
      h('h3', { text: 'This device' }),
      h('div', { class: 'row' },
        h('label', {}, d.pause, 'Pause my contribution'),
        h('label', {}, 'Workers per device ', d.workers),
        h('label', {}, 'GPU budget (MiB) ', d.gpu),
        h('label', {}, 'Backend ', d.backend)),
      d.line, d.error);
  }

  // The room and its invite link (the key is in the fragment), with a Copy button.
  buildRoom() {
    const room = typeof this.api.getRoom === 'function' ? this.api.getRoom() : null;
    if (!room) return h('p', { class: 'small muted', text: 'Not in a room: this browser trains alone. Open an invite link to join one.' });
    const link = h('input', { type: 'text', name: 'inviteLink', readonly: true, value: room.invite, style: 'width:100%' });
    const note = h('span', { class: 'small muted' });
    const copy = h('button', { type: 'button', name: 'copyInvite', text: 'Copy invite link' });
    copy.addEventListener('click', async () => {
      link.select();
      try {
        await navigator.clipboard.writeText(room.invite);
        note.textContent = ' copied';
      } catch (err) {
        note.textContent = ' select the link and copy it';
      }
    });
    return h('div', {}, h('h3', { text: 'Room' }),
      h('p', { class: 'small', text: 'Anyone with this link can join the room and its jobs:' }),
      link, h('div', { class: 'row' }, copy, note));
  }

  renderPeers(state, job) {
    const d = this.d;
    const focused = this.root.activeElement;
    if (focused !== d.workers) d.workers.value = state.maxLocalWorkers ?? '';
    if (focused !== d.gpu) d.gpu.value = state.gpuMemoryBudgetMiB ?? '';
    d.backend.value = state.backendPreference || 'auto';
    d.pause.checked = Boolean(state.pausedContribution);
    const ex = state.execution || {};
    const lw = job && job.localWorkers;
    d.line.textContent = `Workers running: ${show(state.activeWorkers)}`
      + (lw ? ` · this job can use ${lw.effective} (device allows ${lw.capacity})` : '')
      + ` · mode ${show(ex.actual)}${ex.fallback && ex.fallback !== 'none' ? ` (fallback: ${ex.fallback})` : ''}`;

    const peers = state.peers || [];
    const participants = (job && job.participants) || {};
    const invitations = state.invitations || [];
    this.sections.peers.note.textContent = [peers.length ? `${peers.length} connected` : '',
      invitations.length ? `${invitations.length} invitation${invitations.length > 1 ? 's' : ''}` : ''].filter(Boolean).join(' · ');
    const coordinator = job && job.role === 'coordinator' && job.status !== 'completed';

    // Connected peers with Invite buttons: rebuilt only when who can be invited changes.
    this.section('peers.list', [peers, coordinator, Object.keys(participants)], () => {
      const errorEl = h('div', { class: 'error hidden', role: 'alert' });
      const out = [h('h3', { text: 'Connected peers' })];
      if (!peers.length) out.push(h('p', { class: 'small muted', text: 'No other browser is connected to you.' }));
      for (const peer of peers) {
        const invite = h('button', { type: 'button', text: participants[peer] ? 'Invited' : 'Invite', disabled: !coordinator || Boolean(participants[peer]) });
        invite.addEventListener('click', () => this.act(invite, errorEl, () => this.api.invite(peer)));
        out.push(h('div', { class: 'row' }, h('span', { class: 'mono', text: peer }), invite));
      }
      out.push(errorEl);
      return out;
    }, d.peersBox);

    this.section('peers.parts', [job && job.id, participants, state.myPeerId], () => {
      const parts = Object.entries(participants);
      if (!job) return null;
      return [h('h3', { text: 'Participants' }),
        !parts.length ? h('p', { class: 'small muted', text: 'Nobody yet.' }) : h('div', { class: 'tablewrap' }, h('table', { class: 'participants' },
          h('thead', {}, h('tr', {}, ['Peer', 'State', 'Connected', 'Approved', 'Paused'].map((t) => h('th', { text: t })))),
          h('tbody', {}, parts.map(([peer, p]) => { const finished = job.status === 'completed' && p.state === 'stopped'; return h('tr', {},
            h('td', { class: 'mono', title: peer, text: peer === state.myPeerId ? 'this browser' : peer.slice(0, 16) }),
            // A member of a finished job is 'stopped' in the spec's terms: said as success, not as a red stop.
            h('td', {}, h('span', { class: `chip ${finished ? 'completed' : p.state}`, text: finished ? 'finished' : p.state, title: p.state }),
              p.excluded ? h('span', { class: 'chip error', text: 'excluded', title: 'an outlier round after round (aggregation.excludeOutliersAfter)' }) : null),
            h('td', { text: p.connected ? 'yes' : 'no' }), h('td', { text: p.approved || finished ? 'yes' : 'no' }),
            h('td', { text: p.paused ? 'yes' : 'no' })); }))))];
    }, d.partsBox);

    this.section('peers.inv', invitations.map(([id]) => id), () => {
      const out = [h('h3', { text: 'Invitations' })];
      if (!invitations.length) out.push(h('p', { class: 'small muted', text: 'No pending invitation.' }));
      for (const [jobId, entry] of invitations) out.push(this.invitationCard(jobId, entry));
      return out;
    }, d.invBox);
  }

  /** What the participant sees before accepting: the model, its module and hash, the data size, the settings. */
  invitationCard(jobId, entry) {
    const inv = (entry && entry.invitation) || entry || {};
    const info = inv.modelInfo || {};
    const mod = inv.module || {};
    const s = inv.settings || {};
    const err = h('div', { class: 'error hidden', role: 'alert' });
    const accept = h('button', { type: 'button', class: 'primary', text: 'Accept' });
    const decline = h('button', { type: 'button', text: 'Decline' });
    accept.addEventListener('click', () => this.act(accept, err, () => this.api.decideInvitation(jobId, true)));
    decline.addEventListener('click', () => this.act(decline, err, () => this.api.decideInvitation(jobId, false)));
    const exp = experienceOf(info);
    const agg = s.aggregation ? [s.aggregation.method, ...Object.entries(s.aggregation).filter(([k]) => k !== 'method').map(([k, x]) => `${k} ${x}`)].join(' ') : 'fedavg';
    const settingsText = [s.epochs !== undefined ? `${exp ? 'rounds' : 'epochs'} ${s.epochs}` : null,
      s.localEpochs !== undefined ? `local epochs ${s.localEpochs}` : null, s.batchSize !== undefined ? `batch ${s.batchSize}` : null,
      `learning rate ${s.learningRate !== undefined ? s.learningRate : 'model default'}`,
      s.experience ? `${s.experience.unitsPerAssignment} ${(exp && exp.unit && exp.unit.label || 'units').toLowerCase()} per round` : null,
      agg].filter(Boolean).join(' · ');
    return h('div', { class: 'card invitation', 'data-job': jobId },
      h('dl', { class: 'kv' },
        h('dt', { text: 'Model' }), h('dd', { text: `${info.name || '—'} (${info.id || '—'} ${info.version || ''})` }),
        h('dt', { text: 'From' }), h('dd', { class: 'mono', text: inv.coordinator || '—' }),
        h('dt', { text: 'Module' }), h('dd', { text: `${mod.fileName || ''} ${fmtBytes(mod.bytes)}` }),
        h('dt', { text: 'SHA-256' }), h('dd', { class: 'mono', text: show(mod.sha256) }),
        h('dt', { text: 'Data' }), h('dd', { text: exp ? 'none: the model plays episodes' : fmtBytes(inv.dataBytes) }),
        h('dt', { text: 'Settings' }), h('dd', { text: settingsText }),
        h('dt', { text: 'Job' }), h('dd', { class: 'mono', text: jobId })),
      h('p', { class: 'small muted', text: 'Nothing is downloaded before you accept. Only use models you trust: the module runs in your browser.' }),
      h('div', { class: 'row' }, accept, decline), err);
  }
}
