// The window's Debug log section.
// Methods of the window's Widget class (mixed into it by window.js): `this` is the Widget.

import { h, append, errorText, saveFile } from './dom.js';

export class DebugLog {
  buildDebug() {
    const g = (this.g = {});
    g.count = h('span', { class: 'small', text: '—' });
    g.download = h('button', { type: 'button', text: 'Download' });
    g.clear = h('button', { type: 'button', class: 'danger', text: 'Clear' });
    g.error = h('div', { class: 'error hidden', role: 'alert' });
    g.download.addEventListener('click', () => this.act(g.download, g.error, async () => {
      saveFile(this.root, await this.api.exportDebugLog(), 'weei-debug-log.json');
    }));
    g.clear.addEventListener('click', () => this.act(g.clear, g.error, async () => {
      await this.api.clearDebugLog();
      this.debugCountAt = 0;
    }));
    this.sections.debug.el.addEventListener('toggle', () => { this.debugCountAt = 0; this.schedule(); });
    append(this.sections.debug.content,
      h('div', { class: 'row' }, g.count, g.download, g.clear),
      h('p', { class: 'small muted', text: 'The last 1,000 events of this browser profile, across jobs and reloads. No dataset contents or weights.' }),
      g.error);
  }

  async renderDebug() {
    // getDebugLog() copies up to 1,000 events: count them only while the section is open, at most every 2 s.
    if (!this.sections.debug.el.open || Date.now() - this.debugCountAt < 2000 || this.debugCounting) return;
    this.debugCounting = true;
    this.debugCountAt = Date.now();
    try {
      const log = await this.api.getDebugLog();
      const n = log && log.events ? log.events.length : 0;
      this.g.count.textContent = `${n.toLocaleString('en-US')} event${n === 1 ? '' : 's'}`;
      this.sections.debug.note.textContent = String(n);
    } catch (err) {
      this.g.count.textContent = `— (${errorText(err)})`;
    } finally {
      this.debugCounting = false;
    }
  }
}
