// The window's styles (inside its shadow root: the host page's styles do not reach in).

export const CSS = `
:host { all: initial; }
/* Colours are variables so the dark scheme (prefers-color-scheme) is one block below. */
:host {
  --fg: #1d2430; --bg: #fbfcfd; --border: #c9d1dc; --muted: #5b6778; --label: #3b4658; --heading: #22344f;
  --line: #e1e6ed; --btn-bg: #fff; --btn-border: #aab6c6; --btn-hover: #eef3fa; --input-bg: #fff; --input-border: #b9c3d0;
  --focus: #4a8cf0; --primary: #2d6cdf; --primary-hover: #2259bd; --danger: #a3261b; --danger-border: #d9a19b;
  --err-bg: #fdeceb; --err-border: #f3c1bc; --ok: #1d6b35;
  --chip-bg: #e6ebf2; --chip-fg: #2b3a50; --chip-ok-bg: #dff3e4; --chip-ok-fg: #1d6b35; --chip-warn-bg: #fff1d6; --chip-warn-fg: #8a5a00;
  --chip-info-bg: #e1ecfb; --chip-info-fg: #24508f; --chip-err-bg: #fdeceb; --chip-err-fg: #a3261b;
  --track: #e4e9f0; --th-bg: #eef2f7; --card-bg: #fff; --card-border: #dde3eb; --head-a: #2f4b73; --head-b: #263d5e;
  --train: #2d6cdf; --val: #c4600c; --grid: #e8ecf1; --axis: #9aa6b6; --tick: #4b5668; --shadow: rgba(20, 30, 50, .22);
}
@media (prefers-color-scheme: dark) {
  :host {
    --fg: #e3e8ef; --bg: #161b22; --border: #3a4556; --muted: #9eaabb; --label: #bcc6d3; --heading: #d3e2fa;
    --line: #2b3442; --btn-bg: #222a35; --btn-border: #4f5c70; --btn-hover: #2c3644; --input-bg: #0f141a; --input-border: #4f5c70;
    --focus: #7fb0ff; --primary: #2f66cc; --primary-hover: #3a74dc; --danger: #ff9d94; --danger-border: #7a3a34;
    --err-bg: #3a1d1b; --err-border: #6b2f2a; --ok: #7fd89c;
    --chip-bg: #2b3442; --chip-fg: #d3dbe6; --chip-ok-bg: #1c3a26; --chip-ok-fg: #8fe0a8; --chip-warn-bg: #3d3017; --chip-warn-fg: #f2c46b;
    --chip-info-bg: #1d2f4d; --chip-info-fg: #a9cbff; --chip-err-bg: #3a1d1b; --chip-err-fg: #ff9d94;
    --track: #2b3442; --th-bg: #202833; --card-bg: #1b222b; --card-border: #2f3a48; --head-a: #1f3354; --head-b: #182945;
    --train: #7aa8ff; --val: #f0a050; --grid: #26303c; --axis: #5d6a7c; --tick: #b0bac8; --shadow: rgba(0, 0, 0, .55);
    color-scheme: dark;
  }
}
* { box-sizing: border-box; }
.win {
  position: fixed; top: 16px; right: 16px; z-index: 2147483000;
  width: min(700px, calc(100vw - 16px)); height: min(860px, calc(100vh - 32px));
  min-width: 320px; min-height: 160px;
  display: flex; flex-direction: column; overflow: hidden; resize: both;
  font: 13px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg);
  background: var(--bg); border: 1px solid var(--border); border-radius: 10px;
  box-shadow: 0 12px 36px var(--shadow), 0 2px 6px rgba(20, 30, 50, .12);
}
.head {
  display: flex; align-items: center; gap: 8px; padding: 7px 8px 7px 12px;
  background: linear-gradient(var(--head-a), var(--head-b)); color: #fff; cursor: move; user-select: none;
  touch-action: none;
}
.head:focus-visible { outline: 2px solid #9cc3ff; outline-offset: -2px; }
.head h2 { font-size: 14px; font-weight: 600; margin: 0; flex: 1; white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
.head .chip { background: rgba(255,255,255,.16); color: #fff; }
.head button { background: rgba(255,255,255,.12); color: #fff; border-color: rgba(255,255,255,.35); }
.head button:hover:not(:disabled) { background: rgba(255,255,255,.25); }
.body { flex: 1; overflow: auto; padding: 6px 10px 12px; }
details { border-bottom: 1px solid var(--line); padding: 4px 0 8px; }
details:last-child { border-bottom: 0; }
summary { cursor: pointer; font-weight: 600; font-size: 13.5px; padding: 5px 2px; color: var(--heading); }
summary:focus-visible { outline: 2px solid var(--focus); border-radius: 4px; }
details.settings { border: 0; padding: 0; }
details.settings > summary { font-size: 12px; text-transform: uppercase; letter-spacing: .04em; color: var(--muted); padding: 6px 0 2px; }
summary .note { font-weight: 400; color: var(--muted); margin-left: 6px; font-size: 12px; }
h3 { font-size: 12px; text-transform: uppercase; letter-spacing: .04em; color: var(--muted); margin: 10px 0 4px; }
p { margin: 4px 0; }
.muted { color: var(--muted); }
.small { font-size: 12px; }
.mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 12px; }
button {
  font: inherit; font-size: 12.5px; padding: 3px 10px; border-radius: 6px; cursor: pointer;
  border: 1px solid var(--btn-border); background: var(--btn-bg); color: var(--fg);
}
button:hover:not(:disabled) { background: var(--btn-hover); }
button:focus-visible, input:focus-visible, select:focus-visible, .chart:focus-visible, .tablewrap:focus-visible { outline: 2px solid var(--focus); outline-offset: 1px; }
button:disabled { opacity: .45; cursor: not-allowed; filter: grayscale(1); }
button.primary { background: var(--primary); border-color: var(--primary); color: #fff; }
button.primary:hover:not(:disabled) { background: var(--primary-hover); }
button.danger { color: var(--danger); border-color: var(--danger-border); }
input, select {
  font: inherit; font-size: 12.5px; padding: 2px 6px; border: 1px solid var(--input-border); border-radius: 5px;
  background: var(--input-bg); color: var(--fg); min-width: 0;
}
input[type=number] { width: 100%; }
input[type=file] { font-size: 12px; border: 0; padding: 0; width: 100%; }
input[type=checkbox] { margin: 0 5px 0 0; vertical-align: -2px; }
.row { display: flex; flex-wrap: wrap; align-items: center; gap: 6px; margin: 6px 0; }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(150px, 1fr)); gap: 6px 10px; margin: 6px 0; }
.grid label, .files label { display: flex; flex-direction: column; gap: 2px; font-size: 12px; color: var(--label); }
.grid label.check { flex-direction: row; align-items: center; }
.grid .field { display: flex; flex-direction: column; gap: 2px; font-size: 12px; color: var(--label); }
.files { display: grid; grid-template-columns: 1fr 1fr; gap: 6px 12px; margin: 6px 0; }
.files.onnx { border: 1px solid var(--border); border-radius: 6px; padding: 6px 10px; min-width: 0; }
.files.onnx select, .files.onnx input { min-width: 0; max-width: 100%; }
.files.onnx legend, .files.onnx .row, .files.onnx .error { grid-column: 1 / -1; }
.privacy { border: 1px solid var(--border); border-radius: 6px; padding: 4px 10px; margin: 6px 0; min-width: 0; }
.privacy legend { font-size: 12px; color: var(--label); }
.privacy label.check, .privacy .hint { grid-column: 1 / -1; }
.privacy .hint { margin: -4px 0 2px; }
.hidden { display: none !important; }
.error { color: var(--danger); background: var(--err-bg); border: 1px solid var(--err-border); border-radius: 6px; padding: 4px 8px; margin: 6px 0; white-space: pre-wrap; }
.error .dismiss { float: right; margin: 0 0 2px 8px; padding: 1px 8px; font-size: 12px; }
.ok { color: var(--ok); }
.warn { color: var(--chip-warn-fg); background: var(--chip-warn-bg); border-radius: 6px; padding: 2px 8px; margin: 4px 0; }
.chip { display: inline-block; font-size: 11.5px; padding: 0 7px; border-radius: 9px; background: var(--chip-bg); color: var(--chip-fg); white-space: nowrap; }
.chip.running, .chip.training, .chip.live { background: var(--chip-ok-bg); color: var(--chip-ok-fg); }
.chip.paused, .chip.stale, .chip.loading { background: var(--chip-warn-bg); color: var(--chip-warn-fg); }
.chip.completed, .chip.received { background: var(--chip-info-bg); color: var(--chip-info-fg); }
.chip.error, .chip.stopped { background: var(--chip-err-bg); color: var(--chip-err-fg); }
.bar { position: relative; height: 14px; border-radius: 7px; background: var(--track); overflow: hidden; min-width: 80px; flex: 1; }
.bar > i { position: absolute; inset: 0 auto 0 0; background: linear-gradient(90deg, #3b7be6, #5a9af5); border-radius: 7px; }
.bar.done > i { background: linear-gradient(90deg, #2f9a55, #4cbc73); }
.progress { display: grid; grid-template-columns: 120px 1fr auto; gap: 4px 8px; align-items: center; margin: 4px 0; }
.progress .lbl { font-size: 12px; color: var(--label); }
.progress .val { font-size: 12px; font-variant-numeric: tabular-nums; text-align: right; white-space: nowrap; }
.tablewrap { overflow-x: auto; margin: 4px 0; max-height: 260px; overflow-y: auto; }
table { border-collapse: collapse; width: 100%; font-size: 12px; font-variant-numeric: tabular-nums; }
th { text-align: left; font-weight: 600; color: var(--label); background: var(--th-bg); position: sticky; top: 0; }
th, td { padding: 3px 6px; border-bottom: 1px solid var(--track); vertical-align: top; }
td .sub { color: var(--muted); font-size: 11.5px; }
tr.me td:first-child { font-weight: 600; }
table.diagnostics td { white-space: nowrap; }
/* Reasons and errors wrap (whole, never cut off) instead of widening their column. */
table.diagnostics td .sub.wrap { white-space: normal; min-width: 14em; max-width: 24em; overflow-wrap: anywhere; }
.tablewrap.wide { max-height: none; }
.card { border: 1px solid var(--card-border); border-radius: 8px; padding: 6px 10px; margin: 6px 0; background: var(--card-bg); }
.jobbox p { margin: 0 0 2px; }
.jobbox .row { margin: 4px 0 2px; }
.charts { display: grid; grid-template-columns: 1fr; gap: 8px; }
.chart { position: relative; background: var(--card-bg); border: 1px solid var(--card-border); border-radius: 8px; padding: 4px 6px; }
.chart .title { display: flex; justify-content: space-between; font-size: 12px; font-weight: 600; color: var(--heading); padding: 0 2px; }
.chart .title .dir { font-weight: 400; color: var(--muted); }
.chart svg { display: block; width: 100%; height: auto; }
.legend { display: flex; flex-wrap: wrap; gap: 2px 14px; font-size: 11.5px; color: var(--label); padding: 0 2px 2px; }
.legend i { display: inline-block; width: 16px; height: 0; border-top: 2px solid var(--train); vertical-align: middle; margin-right: 4px; }
.legend i.val, .tip .validation i { border-top: 2px dashed var(--val); }
.kv { margin: 0; display: grid; grid-template-columns: max-content 1fr; gap: 1px 10px; font-size: 12px; }
.kv dt { color: var(--muted); }
.kv dd { margin: 0; overflow-wrap: anywhere; }
.sr-only { position: absolute; width: 1px; height: 1px; margin: -1px; padding: 0; overflow: hidden; clip: rect(0 0 0 0); white-space: nowrap; border: 0; }
button.copy { font-size: 11px; padding: 0 6px; margin-left: 4px; vertical-align: 1px; }
label.inline { display: inline-flex; align-items: center; gap: 4px; font-size: 12px; color: var(--label); }
.chartbar input[type=range] { width: 110px; }
.chart svg text { font: 11px system-ui, sans-serif; fill: var(--tick); }
.chart svg text.unit { fill: var(--muted); }
.chart svg text.empty { font-size: 13px; fill: var(--muted); }
.chart .grid { stroke: var(--grid); }
.chart .axis, .chart .cursor { stroke: var(--axis); }
.chart .cursor { stroke-dasharray: 3 3; }
.chart path { fill: none; stroke-width: 2; stroke-linejoin: round; }
.chart path.raw { stroke-width: 1.5; opacity: .3; }
.chart path.train { stroke: var(--train); }
.chart path.validation { stroke: var(--val); stroke-dasharray: 5 4; }
.chart g.train, .chart .marks .train { fill: var(--train); }
.chart g.validation, .chart .marks .validation { fill: var(--val); }
.chart .marks circle { stroke: var(--card-bg); stroke-width: 2; }
.chart .band { fill: var(--primary); opacity: .15; }
.chart .hit { fill: transparent; cursor: crosshair; touch-action: pan-y; }
.tip { position: absolute; top: 26px; z-index: 1; pointer-events: none; white-space: nowrap; font-size: 11.5px; font-variant-numeric: tabular-nums;
  background: var(--card-bg); color: var(--fg); border: 1px solid var(--border); border-radius: 6px; padding: 3px 7px; box-shadow: 0 2px 8px var(--shadow); }
.tip .when { font-weight: 600; }
.tip i { display: inline-block; width: 12px; border-top: 2px solid var(--train); vertical-align: middle; margin-right: 4px; }
/* Narrow screens: the window takes the width; wide tables scroll inside their own box. */
@media (max-width: 520px) {
  .win { top: 8px; right: 8px; width: calc(100vw - 16px); height: calc(100vh - 16px); min-width: 0; }
  .files { grid-template-columns: 1fr; }
  .progress { grid-template-columns: minmax(70px, 90px) 1fr auto; }
}
`;
