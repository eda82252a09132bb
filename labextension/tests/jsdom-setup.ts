// jsdom has no DragEvent, which Lumino's drag-and-drop module (loaded with @lumino/widgets)
// extends as it loads: a plain mouse event stands in for it, as no test drags anything.
if (typeof (globalThis as { DragEvent?: unknown }).DragEvent === 'undefined') {
  (globalThis as { DragEvent?: unknown }).DragEvent = class DragEvent extends MouseEvent {};
}
