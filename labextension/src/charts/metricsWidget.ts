/**
 * The anywidget ES module of jupyter_cluster.show_metrics(): draws the `data`
 * trait (the shared metrics data model) with the chart code in charts.ts.
 * Bundled by `jlpm build:widget` into jupyter_cluster/widgets/static/metrics.js.
 */
import { IChartsState, IMetricsModel, MetricsCharts, emptyModel, isDark } from './charts';

/** The part of anywidget's model API this module uses. */
interface IWidgetModel {
  get(name: string): unknown;
  set(name: string, value: unknown): void;
  save_changes(): void;
  on(event: string, callback: () => void): void;
  off(event: string, callback: () => void): void;
}

interface IRenderProps {
  model: IWidgetModel;
  el: HTMLElement;
}

function render({ model, el }: IRenderProps): () => void {
  const height = Number(model.get('chart_height')) || 260;
  const charts = new MetricsCharts(el, { height });
  let pending = false;
  // several trait changes within one frame are drawn once
  const redraw = (): void => {
    if (pending) {
      return;
    }
    pending = true;
    requestAnimationFrame(() => {
      pending = false;
      const data = model.get('data') as IMetricsModel | undefined;
      charts.update(data && data.scalars ? data : emptyModel(String(model.get('topic') ?? '')));
    });
  };
  // the toolbar's choices live in the model (when it has the trait): a re-rendered output keeps them
  const saved = model.get('view_state') as Partial<IChartsState> | undefined;
  if (saved && typeof saved === 'object' && Object.keys(saved).length) {
    charts.setViewState(saved);
  }
  if (saved !== undefined) {
    charts.onViewState = state => {
      model.set('view_state', state);
      model.save_changes();
    };
  }
  redraw();
  model.on('change:data', redraw);
  // JupyterLab marks its theme on <body>; charts drawn before a theme switch are re-styled
  const theme = new MutationObserver(() => charts.setDark(isDark()));
  theme.observe(document.body, { attributes: true, attributeFilter: ['data-jp-theme-light'] });
  return () => {
    theme.disconnect();
    model.off('change:data', redraw);
    charts.dispose();
  };
}

export default { render };
