// Weei's built-in window for the 'distributed-training' API (its stable URL):
//
//   import { mountWidget } from '<weei server>/widget.js';
//   const widget = mountWidget(api, { container, onClose });   // widget.close()
//
// The window is one ES module per section, in widget/ (see widget/window.js).
export { mountWidget } from './widget/window.js';
