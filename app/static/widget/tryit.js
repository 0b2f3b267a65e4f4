// The window's "Try the model" section: what the latest checkpoint says about one input, through the
// API's tryCheckpoint (the model's own evaluate: docs/abi.md "Trying a model"). Digits classifies a
// held-out image of the job's validation file; the byte transformer completes a prompt.
// Methods of the window's Widget class (mixed into it by window.js): `this` is the Widget.

import { h, append, fmtNum } from './dom.js';

/** A probability as one format throughout: "97.4 %", "0.8 %", "<0.1 %". */
export const fmtPct = (p) => (p < 0.0005 ? '<0.1 %' : `${(100 * p).toFixed(1)} %`);

const DIGITS = 'weei-digits-v1';
const BYTES = 'weei-bytes-v1';

/** The try-it view this job's model has ('digits', 'text'), or null. */
export function tryKind(job) {
  const formats = ((job && job.info && job.info.dataFormats) || []).map((f) => (typeof f === 'string' ? f : f && f.id));
  return formats.includes(DIGITS) ? 'digits' : formats.includes(BYTES) ? 'text' : null;
}

export class TryIt {
  buildTryIt() {
    const t = (this.t = { example: 0 });
    t.error = h('div', { class: 'error hidden', role: 'alert' });
    t.note = h('p', { class: 'small muted' });
    t.result = h('div', { class: 'tryresult', 'aria-live': 'polite' });
    t.next = h('button', { type: 'button', name: 'tryAnother', class: 'primary', text: 'Classify a held-out image' });
    t.next.addEventListener('click', () => this.tryDigit(t.example++));
    t.prompt = h('input', { type: 'text', name: 'tryPrompt', maxlength: 200, 'aria-label': 'Prompt', placeholder: 'add 12+35=' });
    t.complete = h('button', { type: 'button', name: 'tryComplete', class: 'primary', text: 'Complete' });
    t.complete.addEventListener('click', () => this.tryText({ prompt: t.prompt.value }));
    t.sample = h('button', { type: 'button', name: 'tryExample', text: 'Example prompt' });
    t.sample.addEventListener('click', () => this.tryText({ example: t.example++ }));
    t.prompt.addEventListener('keydown', (e) => { if (e.key === 'Enter') { e.preventDefault(); t.complete.click(); } });
    t.digits = h('div', { class: 'row' }, t.next);
    t.text = h('div', { class: 'row tryprompt' }, t.prompt, t.complete, t.sample);
    append(this.sections.tryit.content, t.note, t.digits, t.text, t.error, t.result);
  }

  renderTryIt(state, job) {
    const t = this.t;
    const kind = tryKind(job);
    const cps = job ? job.checkpoints : [];
    const last = cps[cps.length - 1];
    const ready = Boolean(job && job.role === 'coordinator' && last && kind);
    t.digits.classList.toggle('hidden', !ready || kind !== 'digits');
    t.text.classList.toggle('hidden', !ready || kind !== 'text');
    t.note.textContent = !job ? 'Create or open a job: its latest checkpoint can be tried here.'
      : job.role !== 'coordinator' ? 'The coordinator keeps the checkpoints: try the model there.'
        : !kind ? 'This model\'s data format has no try-it view (Weei has one for weei-digits-v1 and weei-bytes-v1).'
          : !last ? 'Try the model once the first checkpoint is saved.'
            : `Round ${last.artifact.round}'s checkpoint, run through the model's own evaluate in this browser.`;
    this.sections.tryit.note.textContent = ready ? `round ${last.artifact.round}` : '';
  }

  async tryDigit(example) {
    const t = this.t;
    const out = await this.act(t.next, t.error, () => this.api.tryCheckpoint({ example }));
    if (!out) return;
    const best = out.probabilities[out.predicted];
    const grid = h('div', { class: 'digit', role: 'img', 'aria-label': `8 by 8 image of a ${out.label}` },
      out.pixels.map((v) => h('i', { style: `opacity:${(0.06 + 0.94 * v / 16).toFixed(3)}` })));
    const bars = h('div', { class: 'probs' }, out.probabilities.map((p, d) => h('div', { class: `prob${d === out.predicted ? ' best' : ''}` },
      h('span', { text: String(d) }), h('b', { style: `width:${(100 * p).toFixed(1)}%` }), h('span', { text: fmtPct(p) }))));
    const right = out.predicted === out.label;
    t.result.replaceChildren(h('div', { class: 'trydigit', 'data-example': out.example }, grid,
      h('div', {}, h('p', { class: right ? 'ok' : 'warn', 'data-field': 'verdict',
        text: `Held-out image ${out.example + 1} of ${out.examples}: a ${out.label}. The model says ${out.predicted} (${fmtPct(best)})${right ? ' ✓' : ' ✗'}` }),
      bars)));
  }

  async tryText(request) {
    const t = this.t;
    const out = await this.act(t.complete, t.error, () => this.api.tryCheckpoint({ maxBytes: 24, ...request }));
    if (!out) return;
    t.prompt.value = out.prompt;
    t.result.replaceChildren(h('p', { class: 'trytext' }, h('span', { class: 'mono', text: out.prompt }),
      h('mark', { class: 'mono', 'data-field': 'completion', text: out.completion.replace(/\n$/, '⏎') })),
    h('p', { class: 'small muted', text: `Greedy, byte by byte: ${fmtNum(out.evaluateCalls)} evaluate calls on round ${out.round}'s weights.` }));
  }
}

export const TRY_CSS = `
.tryprompt input { flex: 1; min-width: 10em; font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
.trydigit { display: flex; gap: 14px; align-items: flex-start; flex-wrap: wrap; margin-top: 8px; }
.digit { display: grid; grid-template-columns: repeat(8, 12px); grid-auto-rows: 12px; gap: 1px; padding: 4px;
  background: var(--card-bg); border: 1px solid var(--card-border); border-radius: 6px; }
.digit i { background: var(--fg); border-radius: 1px; }
.probs { display: grid; gap: 2px; min-width: 12em; }
.prob { display: grid; grid-template-columns: 1.2em 8em 4em; white-space: nowrap; align-items: center; gap: 6px; font-size: 12px; }
.prob b { display: block; height: 8px; background: var(--axis); border-radius: 2px; min-width: 1px; }
.prob.best b { background: var(--primary); }
.prob.best span { font-weight: 600; }
.trytext { margin-top: 8px; overflow-wrap: anywhere; white-space: pre-wrap; }
.trytext mark { background: var(--chip-ok-bg); color: var(--chip-ok-fg); border-radius: 3px; padding: 0 2px; }
`;
