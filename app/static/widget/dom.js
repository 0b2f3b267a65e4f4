// Shared helpers of the window: DOM building, formatting, files.

const SVG_NS = 'http://www.w3.org/2000/svg';

/** h('div', {class: 'x', onclick: f, text: 'hi'}, child, ...) → element. */
export function h(tag, props = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === 'text') el.textContent = value;
    else if (key === 'class') el.className = value;
    // Through the CSSOM, not a style attribute: a Content-Security-Policy without 'unsafe-inline' (the
    // landing page's) refuses style attributes but not this.
    else if (key === 'style') el.style.cssText = value;
    else if (key.startsWith('on') && typeof value === 'function') el.addEventListener(key.slice(2), value);
    else if (key in el && typeof value !== 'string') el[key] = value;
    else if (key === 'value' || key === 'checked' || key === 'disabled') el[key] = value;
    else el.setAttribute(key, value === true ? '' : String(value));
  }
  append(el, children);
  return el;
}

export function append(el, ...children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export function svg(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value !== undefined && value !== null) el.setAttribute(key, String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/** 'unknown', null and undefined are missing data: shown as a dash, never as a reason. */
export const missing = (v) => v === undefined || v === null || v === 'unknown' || v === '';
export const show = (v, fmt = String) => (missing(v) ? '—' : fmt(v));

export function fmtNum(v, digits = 4) {
  if (typeof v !== 'number' || !Number.isFinite(v)) return show(v);
  if (Number.isInteger(v) && Math.abs(v) < 1e9) return v.toLocaleString('en-US');
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e6)) return v.toExponential(2);
  return Number(v.toPrecision(digits)).toString();
}

export function fmtBytes(n) {
  if (typeof n !== 'number' || !Number.isFinite(n)) return show(n);
  if (n < 1024) return `${n} B`;
  const units = ['KiB', 'MiB', 'GiB', 'TiB'];
  let v = n / 1024;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
  return `${v < 10 ? v.toFixed(1) : Math.round(v)} ${units[i]}`;
}

export function fmtMs(ms) {
  if (typeof ms !== 'number' || !Number.isFinite(ms)) return show(ms);
  if (ms < 1000) return `${Math.round(ms)} ms`;
  return fmtDuration(ms);
}

export function fmtDuration(ms) {
  if (typeof ms !== 'number' || !Number.isFinite(ms)) return show(ms);
  const s = ms / 1000;
  if (s < 60) return `${s < 10 ? s.toFixed(1) : Math.round(s)} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min ${Math.round(s - m * 60)} s`;
  return `${Math.floor(m / 60)} h ${m % 60} min`;
}

export function fmtTime(ms) {
  if (typeof ms !== 'number' || !Number.isFinite(ms) || ms <= 0) return '—';
  const d = new Date(ms);
  const today = new Date().toDateString() === d.toDateString();
  return today ? d.toLocaleTimeString() : d.toLocaleString();
}

/** Disable a button per the state, but never re-enable one whose command is still running. */
export function setDisabled(button, disabled) {
  button.disabled = Boolean(disabled) || button.dataset.running === '1';
}

export const shortHash = (sha) => (missing(sha) ? '—' : String(sha).slice(0, 12) + '…');

export function errorText(err) {
  if (!err) return '';
  const message = String(err.message || err);
  const reason = err.reason;
  return reason && !message.includes(reason) ? `${message} (reason: ${reason})` : message;
}

export function saveFile(root, file, fallbackName) {
  const href = URL.createObjectURL(file);
  const a = h('a', { href, download: file.name || fallbackName, style: 'display:none' });
  root.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(href), 60_000);
}
/** The workSource of a package manifest or model info, if it is an experience model. */
export function experienceOf(source) {
  const ws = source && !Array.isArray(source) ? source.workSource : null;
  return ws && ws.kind === 'experience' ? ws : null;
}

// ---- copy, announce ------------------------------------------------------------------------

/** Put `text` on the clipboard. navigator.clipboard exists only in a secure context (https,
 *  localhost); a page served over plain http on a LAN address gets the older execCommand path. */
export async function copyText(text, root = document) {
  if (navigator.clipboard && window.isSecureContext) {
    try { await navigator.clipboard.writeText(text); return; } catch { /* permission refused: try the old way */ }
  }
  const area = h('textarea', { value: text, readonly: true, 'aria-hidden': 'true', style: 'position:fixed;opacity:0;left:0;top:0' });
  (root.host ? root : document.body).append(area);
  area.select();
  const ok = document.execCommand('copy');
  area.remove();
  if (!ok) throw new Error('The browser refused to copy: select the text and copy it by hand');
}

/**
 * copyButton(text, what, {label, name, primary, select}) → a button that puts exactly `text` on the
 * clipboard: a string, or a function read at each click (a value that changes, such as this peer's ID;
 * nothing to copy yet: nothing happens). `what` names it ("peer ID"): the default small "Copy" button is
 * labelled "Copy <what>" for screen readers, a button with its own `label` ("Copy invite link") is
 * named by it. It says "Copied" (or why not) for 1.5 s and announces that through the window's live
 * region when there is one. Where copying is refused, `select` (an input holding the text) is selected
 * and the button says "Press Ctrl+C", so the person copies it by hand. The window rebuilds a section
 * whenever its data changes (the diagnostics every second): a button made for the same thing within
 * those 1.5 s says what the old one said, so the answer does not vanish with the rebuild.
 */
const FEEDBACK_MS = 1500;
const recentFeedback = new Map(); // `${what}\n${value}` -> { text, title, until }

export function copyButton(text, what, { label = 'Copy', name = null, primary = false, select = null } = {}) {
  const read = () => String((typeof text === 'function' ? text() : text) || '');
  const small = label === 'Copy';
  const titleOf = () => (read() ? `Copy ${what}: ${read()}` : `Copy ${what}`);
  const button = h('button', {
    type: 'button', class: small ? 'copy' : (primary ? 'primary' : null), name, text: label,
    'aria-label': small ? `Copy ${what}` : null, title: titleOf(), 'data-copy': typeof text === 'string' ? text : null,
  });
  let shownUntil = 0;
  // The accessible name must contain the visible text (WCAG 2.5.3): it changes with the button's answer.
  const name_ = (said) => { if (small) button.setAttribute('aria-label', `${said} ${what}`); };
  const show = (said, title, until) => {
    button.textContent = said;
    button.title = title;
    name_(said);
    shownUntil = until;
    setTimeout(() => { // a second click within the 1.5 s keeps its own answer for its full time
      if (performance.now() + 1 >= shownUntil) { button.textContent = label; button.title = titleOf(); name_(label); }
    }, until - performance.now());
  };
  const recent = recentFeedback.get(`${what}\n${read()}`);
  if (recent && recent.until > performance.now()) show(recent.text, recent.title, recent.until);
  button.addEventListener('click', async (e) => {
    e.stopPropagation();
    const value = read();
    if (!value) return;
    if (select) select.select();
    let said;
    try { await copyText(value, button.getRootNode()); said = 'Copied'; } catch (err) { said = errorText(err); }
    const ok = said === 'Copied';
    const feedback = { text: ok ? 'Copied' : (select ? 'Press Ctrl+C' : 'Not copied'), title: ok ? `Copied ${what}` : said,
      until: performance.now() + FEEDBACK_MS };
    for (const [key, old] of recentFeedback) if (old.until <= performance.now()) recentFeedback.delete(key);
    recentFeedback.set(`${what}\n${value}`, feedback);
    show(feedback.text, feedback.title, feedback.until);
    announce(button, ok ? `${what} copied` : said);
  });
  return button;
}

/** A visually hidden polite live region: status changes are read out by screen readers. */
export function liveRegion() {
  return h('div', { class: 'sr-only', role: 'status', 'aria-live': 'polite', 'aria-atomic': 'true' });
}

/** Say `message` in the (first) live region of the window that holds `el` (no-op outside one). */
export function announce(el, message) {
  const root = el && el.getRootNode && el.getRootNode();
  const live = root && root.querySelector ? root.querySelector('[role=status][aria-live]') : null;
  if (live && message && live.textContent !== message) live.textContent = message;
}
