// Status that tells the truth (issue 24, item 11): the header's words, the elapsed time and a smoothed
// estimate of the time left, and the normal CPU fallback on a software GPU said once, as information.

import { fmtDuration } from './dom.js';

const WAITING_STATES = new Set(['approved', 'modelLoaded']);

/** The header's status: "coordinator · waiting for Start" before Start, "participant · accepted, waiting for
 * Start" until the first round is done, else the role and the job's status. */
export function statusText(state, job) {
  if (!job) return null;
  const role = job.role === 'participant' ? 'participant' : 'coordinator';
  if (role === 'coordinator' && job.status === 'ready') return 'coordinator · waiting for Start';
  if (role === 'participant' && job.status !== 'completed') {
    const me = (job.participants || {})[state.myPeerId];
    const trained = (job.checkpoints || []).some((c) => c.artifact && c.artifact.round > 0);
    if (me && WAITING_STATES.has(me.state) && !trained) return 'participant · accepted, waiting for Start';
  }
  return `${role} · ${job.status}`;
}

/** A peer's GPU facts in one line: {text, error}. A software adapter that `auto` passes over is the normal
 * CPU path, said as information; other GPU failures stay errors. Null when there is nothing to say. */
export function gpuNote(d) {
  const gpu = (d && d.gpu) || {};
  const ex = (d && d.execution) || {};
  const init = typeof gpu.initializationError === 'string' && gpu.initializationError !== 'unknown' ? gpu.initializationError : null;
  const fallback = typeof ex.fallbackReason === 'string' ? ex.fallbackReason : null;
  const text = init || fallback;
  if (!text) return null;
  if (/software-adapter/.test(text)) {
    const adapter = gpu.adapter && gpu.adapter !== 'unknown' ? (gpu.adapter.device || gpu.adapter.description || gpu.adapter.vendor) : null;
    const name = /swiftshader/i.test(`${adapter} ${text}`) ? 'SwiftShader' : adapter || 'a software GPU';
    return { text: `${name}, a software renderer: auto trains on the CPU; choose gpu to force it`, error: false };
  }
  // Any other failure is an error of the GPU, said beside it; the Mode column says what it fell back to.
  return init ? { text: init, error: true } : null;
}

/** After a round on the GPU, how it compares with this device's CPU on the same model: "GPU 2.8× slower than the
 * CPU here (41 vs 115 examples/s)" when it was slower; null when it was not, or with no CPU figure to compare
 * with. The figures are the device's last assignment in each mode (examples over the whole train call,
 * `state.execution.examplesPerSecond`): the CPU one comes from an earlier CPU assignment of the same model. */
export function gpuSpeedNote(execution) {
  const ex = execution || {};
  const speeds = ex.examplesPerSecond || {};
  const gpu = ex.actual === 'gpu' || ex.actual === 'hybrid' ? speeds[ex.actual] : undefined;
  const cpu = speeds.cpu;
  if (!(gpu > 0) || !(cpu > 0) || gpu >= cpu) return null;
  const ratio = cpu / gpu;
  const rate = (v) => (v >= 100 ? String(Math.round(v)) : v.toPrecision(2));
  return `GPU ${ratio < 10 ? ratio.toFixed(1) : Math.round(ratio)}× slower than the CPU here (${rate(gpu)} vs ${rate(cpu)} examples/s)`;
}

/** The time left, smoothed: each estimate moves the shown one a fifth of the way, and the shown one counts
 * down with the clock in between, so it neither jumps between 19 s and 1 min nor stands still. */
export class EtaSmoother {
  constructor() { this.value = null; this.at = 0; this.raw = null; }

  update(raw, now = Date.now()) {
    if (typeof raw !== 'number' || !Number.isFinite(raw)) { this.value = null; this.raw = null; return null; }
    if (this.value === null) this.value = raw;
    else if (raw !== this.raw) this.value = 0.8 * Math.max(0, this.value - (now - this.at)) + 0.2 * raw;
    else this.value = Math.max(0, this.value - (now - this.at));
    this.raw = raw;
    this.at = now;
    return this.value;
  }
}

/** "elapsed 3 min 2 s", from the job's first checkpoint (round 0, saved at creation) to now or its last. */
export function elapsedText(job, now = Date.now()) {
  const cps = (job && job.checkpoints) || [];
  if (!cps.length || typeof cps[0].createdAt !== 'number') return null;
  const end = job.status === 'completed' ? cps[cps.length - 1].createdAt : now;
  return `elapsed ${fmtDuration(Math.max(0, end - cps[0].createdAt))}`;
}
