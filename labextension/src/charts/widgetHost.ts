/**
 * The wiring the notebook widgets share (metricsWidget.ts and
 * sweep/sweepWidget.ts, each bundled on its own for anywidget): the part of
 * anywidget's model API they use, and one function that ties a view to its
 * model: draws the `data` trait (several changes within one frame once),
 * restores and keeps the user's choices in the `view_state` trait (so a
 * re-rendered output keeps them), and follows JupyterLab's theme.
 */
import { isDark } from '../common/dom';

/** The part of anywidget's model API the widgets use. */
export interface IWidgetModel {
  get(name: string): unknown;
  set(name: string, value: unknown): void;
  save_changes(): void;
  on(event: string, callback: () => void): void;
  off(event: string, callback: () => void): void;
}

/** What anywidget hands a widget's render(). */
export interface IRenderProps {
  model: IWidgetModel;
  el: HTMLElement;
}

/** A view as bindWidget() drives it; `S` is the user's choices it keeps. */
export interface IWidgetView<S> {
  /** draw the `data` trait's value (the view checks its shape) */
  draw(data: unknown): void;
  setDark(dark: boolean): void;
  /** restore choices saved in `view_state` */
  setState(state: Partial<S>): void;
  /** call `save` whenever the user changed a choice */
  listen(save: (state: S) => void): void;
  dispose(): void;
}

/**
 * Tie `view` to `model`; returns the clean-up anywidget calls when the
 * output goes.  A model without the `view_state` trait (an older kernel
 * side) draws without keeping choices.
 */
export function bindWidget<S>(model: IWidgetModel, view: IWidgetView<S>): () => void {
  // the frame of a pending redraw (0: none); several trait changes within one frame are drawn once
  let frame = 0;
  const redraw = (): void => {
    if (frame) {
      return;
    }
    frame = requestAnimationFrame(() => {
      frame = 0;
      view.draw(model.get('data'));
    });
  };
  const saved = model.get('view_state') as Partial<S> | undefined;
  if (saved && typeof saved === 'object' && Object.keys(saved).length) {
    view.setState(saved);
  }
  if (saved !== undefined) {
    view.listen(state => {
      model.set('view_state', state);
      model.save_changes();
    });
  }
  redraw();
  model.on('change:data', redraw);
  // JupyterLab marks its theme on <body>: what was drawn before a theme switch is drawn again in the new one
  const theme = new MutationObserver(() => view.setDark(isDark()));
  theme.observe(document.body, { attributes: true, attributeFilter: ['data-jp-theme-light'] });
  return () => {
    theme.disconnect();
    model.off('change:data', redraw);
    // an output removed between a change and its frame: the frame must not draw into the disposed view
    cancelAnimationFrame(frame);
    frame = 0;
    view.dispose();
  };
}
