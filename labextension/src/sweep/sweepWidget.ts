/**
 * The anywidget ES module of jupyter_cluster.show_runs(): draws the `data`
 * trait (the sweep table's rows and curves, see model.ts) with SweepView.
 * Bundled by `jlpm build:widget` into jupyter_cluster/widgets/static/sweep.js.
 */
import { isDark } from '../charts/dom';
import type { ISweep } from './model';
import type { ISweepViewState } from './view';
import { SweepView } from './view';

/** The part of anywidget's model API this module uses. */
interface IWidgetModel {
  get(name: string): unknown;
  set(name: string, value: unknown): void;
  save_changes(): void;
  on(event: string, callback: () => void): void;
  off(event: string, callback: () => void): void;
}

function render({ model, el }: { model: IWidgetModel; el: HTMLElement }): () => void {
  const view = new SweepView(el, { dark: isDark(), height: Number(model.get('chart_height')) || 280 });
  let pending = false;
  const redraw = (): void => {
    if (pending) {
      return;
    }
    pending = true;
    requestAnimationFrame(() => {
      pending = false;
      const data = model.get('data') as ISweep | undefined;
      view.update(data && Array.isArray(data.rows) ? data : { rows: [], curves: {} });
    });
  };
  // the user's sort, filter, grouping and ticks live in the model: a re-rendered output keeps them
  const saved = model.get('view_state') as Partial<ISweepViewState> | undefined;
  if (saved && typeof saved === 'object' && Object.keys(saved).length) {
    view.setState(saved);
  }
  view.onState = state => {
    model.set('view_state', state);
    model.save_changes();
  };
  redraw();
  model.on('change:data', redraw);
  const theme = new MutationObserver(() => view.setDark(isDark()));
  theme.observe(document.body, { attributes: true, attributeFilter: ['data-jp-theme-light'] });
  return () => {
    theme.disconnect();
    model.off('change:data', redraw);
    view.dispose();
  };
}

export default { render };
