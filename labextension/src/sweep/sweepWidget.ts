/**
 * The anywidget ES module of jupyter_cluster.show_runs(): draws the `data`
 * trait (the sweep table's rows and curves, see model.ts) with SweepView.
 * Bundled by `jlpm build:widget` into jupyter_cluster/widgets/static/sweep.js.
 */
import { isDark } from '../common/dom';
import { IRenderProps, bindWidget } from '../charts/widgetHost';
import type { ISweep } from './model';
import type { ISweepViewState } from './view';
import { SweepView } from './view';

function render({ model, el }: IRenderProps): () => void {
  const view = new SweepView(el, { dark: isDark(), height: Number(model.get('chart_height')) || 280 });
  // the user's sort, filter, grouping and ticks live in the model: a re-rendered output keeps them
  return bindWidget<ISweepViewState>(model, {
    draw: data => {
      const sweep = data as ISweep | undefined;
      view.update(sweep && Array.isArray(sweep.rows) ? sweep : { rows: [], curves: {} });
    },
    setDark: dark => view.setDark(dark),
    setState: state => view.setState(state),
    listen: save => (view.onState = save),
    dispose: () => view.dispose()
  });
}

export default { render };
