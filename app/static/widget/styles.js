// The window's styles (inside its shadow root: the host page's styles do not reach in).

export const CSS = `
:host { all: initial; }
* { box-sizing: border-box; }
.win {
  position: fixed; top: 16px; right: 16px; z-index: 2147483000;
  width: min(700px, calc(100vw - 16px)); height: min(860px, calc(100vh - 32px));
  min-width: 320px; min-height: 160px;
  display: flex; flex-direction: column; overflow: hidden; resize: both;
  font: 13px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1d2430;
  background: #fbfcfd; border: 1px solid #c9d1dc; border-radius: 10px;
  box-shadow: 0 12px 36px rgba(20, 30, 50, .22), 0 2px 6px rgba(20, 30, 50, .12);
}
.head {
  display: flex; align-items: center; gap: 8px; padding: 7px 8px 7px 12px;
  background: linear-gradient(#2f4b73, #263d5e); color: #fff; cursor: move; user-select: none;
  touch-action: none;
}
.head:focus-visible { outline: 2px solid #9cc3ff; outline-offset: -2px; }
.head h2 { font-size: 14px; font-weight: 600; margin: 0; flex: 1; white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
.head .chip { background: rgba(255,255,255,.16); color: #fff; }
.head button { background: rgba(255,255,255,.12); color: #fff; border-color: rgba(255,255,255,.35); }
.head button:hover:not(:disabled) { background: rgba(255,255,255,.25); }
.body { flex: 1; overflow: auto; padding: 6px 10px 12px; }
details { border-bottom: 1px solid #e1e6ed; padding: 4px 0 8px; }
details:last-child { border-bottom: 0; }
summary { cursor: pointer; font-weight: 600; font-size: 13.5px; padding: 5px 2px; color: #22344f; }
summary:focus-visible { outline: 2px solid #4a8cf0; border-radius: 4px; }
details.settings { border: 0; padding: 0; }
details.settings > summary { font-size: 12px; text-transform: uppercase; letter-spacing: .04em; color: #5b6778; padding: 6px 0 2px; }
summary .note { font-weight: 400; color: #5b6778; margin-left: 6px; font-size: 12px; }
h3 { font-size: 12px; text-transform: uppercase; letter-spacing: .04em; color: #5b6778; margin: 10px 0 4px; }
p { margin: 4px 0; }
.muted { color: #5b6778; }
.small { font-size: 12px; }
.mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 12px; }
button {
  font: inherit; font-size: 12.5px; padding: 3px 10px; border-radius: 6px; cursor: pointer;
  border: 1px solid #aab6c6; background: #fff; color: #1d2430;
}
button:hover:not(:disabled) { background: #eef3fa; }
button:focus-visible, input:focus-visible, select:focus-visible { outline: 2px solid #4a8cf0; outline-offset: 1px; }
button:disabled { opacity: .45; cursor: default; }
button.primary { background: #2d6cdf; border-color: #2d6cdf; color: #fff; }
button.primary:hover:not(:disabled) { background: #2259bd; }
button.danger { color: #a3261b; border-color: #d9a19b; }
input, select {
  font: inherit; font-size: 12.5px; padding: 2px 6px; border: 1px solid #b9c3d0; border-radius: 5px;
  background: #fff; color: #1d2430; min-width: 0;
}
input[type=number] { width: 100%; }
input[type=file] { font-size: 12px; border: 0; padding: 0; width: 100%; }
input[type=checkbox] { margin: 0 5px 0 0; vertical-align: -2px; }
.row { display: flex; flex-wrap: wrap; align-items: center; gap: 6px; margin: 6px 0; }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(150px, 1fr)); gap: 6px 10px; margin: 6px 0; }
.grid label, .files label { display: flex; flex-direction: column; gap: 2px; font-size: 12px; color: #3b4658; }
.grid label.check { flex-direction: row; align-items: center; }
.grid .field { display: flex; flex-direction: column; gap: 2px; font-size: 12px; color: #3b4658; }
.files { display: grid; grid-template-columns: 1fr 1fr; gap: 6px 12px; margin: 6px 0; }
.hidden { display: none !important; }
.error { color: #a3261b; background: #fdeceb; border: 1px solid #f3c1bc; border-radius: 6px; padding: 4px 8px; margin: 6px 0; white-space: pre-wrap; }
.ok { color: #1d6b35; }
.warn { color: #8a5a00; background: #fff1d6; border-radius: 6px; padding: 2px 8px; margin: 4px 0; }
.chip { display: inline-block; font-size: 11.5px; padding: 0 7px; border-radius: 9px; background: #e6ebf2; color: #2b3a50; white-space: nowrap; }
.chip.running, .chip.training, .chip.live { background: #dff3e4; color: #1d6b35; }
.chip.paused, .chip.stale, .chip.loading { background: #fff1d6; color: #8a5a00; }
.chip.completed, .chip.received { background: #e1ecfb; color: #24508f; }
.chip.error, .chip.stopped { background: #fdeceb; color: #a3261b; }
.bar { position: relative; height: 14px; border-radius: 7px; background: #e4e9f0; overflow: hidden; min-width: 80px; flex: 1; }
.bar > i { position: absolute; inset: 0 auto 0 0; background: linear-gradient(90deg, #3b7be6, #5a9af5); border-radius: 7px; }
.bar.done > i { background: linear-gradient(90deg, #2f9a55, #4cbc73); }
.progress { display: grid; grid-template-columns: 120px 1fr auto; gap: 4px 8px; align-items: center; margin: 4px 0; }
.progress .lbl { font-size: 12px; color: #3b4658; }
.progress .val { font-size: 12px; font-variant-numeric: tabular-nums; text-align: right; white-space: nowrap; }
.tablewrap { overflow-x: auto; margin: 4px 0; max-height: 260px; overflow-y: auto; }
table { border-collapse: collapse; width: 100%; font-size: 12px; font-variant-numeric: tabular-nums; }
th { text-align: left; font-weight: 600; color: #3b4658; background: #eef2f7; position: sticky; top: 0; }
th, td { padding: 3px 6px; border-bottom: 1px solid #e4e9f0; vertical-align: top; }
td .sub { color: #5b6778; font-size: 11.5px; }
tr.me td:first-child { font-weight: 600; }
table.diagnostics td { white-space: nowrap; }
.tablewrap.wide { max-height: none; }
.card { border: 1px solid #dde3eb; border-radius: 8px; padding: 6px 10px; margin: 6px 0; background: #fff; }
.jobbox p { margin: 0 0 2px; }
.jobbox .row { margin: 4px 0 2px; }
.charts { display: grid; grid-template-columns: 1fr; gap: 8px; }
.chart { background: #fff; border: 1px solid #dde3eb; border-radius: 8px; padding: 4px 6px; }
.chart .title { display: flex; justify-content: space-between; font-size: 12px; font-weight: 600; color: #22344f; padding: 0 2px; }
.chart .title .dir { font-weight: 400; color: #5b6778; }
.chart svg { display: block; width: 100%; height: auto; }
.legend { display: flex; gap: 14px; font-size: 11.5px; color: #3b4658; padding: 0 2px 2px; }
.legend i { display: inline-block; width: 16px; height: 0; border-top: 2px solid #2d6cdf; vertical-align: middle; margin-right: 4px; }
.legend i.val { border-top: 2px dashed #e0751c; }
.kv { margin: 0; display: grid; grid-template-columns: max-content 1fr; gap: 1px 10px; font-size: 12px; }
.kv dt { color: #5b6778; }
.kv dd { margin: 0; overflow-wrap: anywhere; }
`;
