/**
 * The anywidget ES module of jupyter_cluster.show_metrics(): draws the `data`
 * trait (the shared metrics data model) with the chart code in charts.ts.
 * Bundled by `jlpm build:widget` into jupyter_cluster/widgets/static/metrics.js.
 */
import { IChartsState, IMetricsModel, MetricsCharts, emptyModel } from './charts';
import { IRenderProps, bindWidget } from './widgetHost';

function render({ model, el }: IRenderProps): () => void {
  const height = Number(model.get('chart_height')) || 260;
  const charts = new MetricsCharts(el, { height });
  return bindWidget<IChartsState>(model, {
    draw: data => {
      const m = data as IMetricsModel | undefined;
      charts.update(m && m.scalars ? m : emptyModel(String(model.get('topic') ?? '')));
    },
    setDark: dark => charts.setDark(dark),
    setState: state => charts.setViewState(state),
    listen: save => (charts.onViewState = save),
    dispose: () => charts.dispose()
  });
}

export default { render };
