/**
 * The anywidget ES module of jupyter_cluster.show_runs(): draws the `data`
 * trait (the sweep table's rows and curves, see model.ts) with SweepView.
 * Bundled by `jlpm build:widget` into jupyter_cluster/widgets/static/sweep.js.
 */
import { isDark } from '../charts/dom';
import type { ISweep } from './model';
import { SweepView } from './view';

/** The part of anywidget's model API this module uses. */
interface IWidgetModel {
  get(name: string): unknown;
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
