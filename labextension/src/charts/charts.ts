/**
 * Metric charts, written once: used by the notebook widget (metricsWidget.ts,
 * bundled to jupyter_cluster/widgets/static/metrics.js) and by the sidebar panel.
 *
 * Input is the shared metrics data model (see IMetricsModel), already
 * downsampled on the Python side.  Each scalar value gets one line chart with
 * one line per series; each vector value gets a heatmap over steps with a
 * colour scale (one series at a time, picked from a menu).
 */
import * as echarts from 'echarts/core';
import { HeatmapChart, LineChart } from 'echarts/charts';
import {
  DataZoomComponent,
  GridComponent,
  LegendComponent,
  TitleComponent,
  TooltipComponent,
  VisualMapComponent
} from 'echarts/components';
import { CanvasRenderer } from 'echarts/renderers';

echarts.use([
  LineChart,
  HeatmapChart,
  GridComponent,
  TooltipComponent,
  LegendComponent,
  VisualMapComponent,
  DataZoomComponent,
  TitleComponent,
  CanvasRenderer
]);

/** One point of a line: [step, value]; null values leave a gap. */
export type Point = [number, number | null];

/** A vector value of one series: one row per step. */
export interface IVectorSeries {
  steps: number[];
  rows: (number | null)[][];
}

/** The shared metrics data model (mirrors TopicStore.model() in jupyter_cluster/events.py). */
export interface IMetricsModel {
  topic: string;
  /** value name -> series key ("member=3", or "all") -> points */
  scalars: { [value: string]: { [series: string]: Point[] } };
  /** value name -> series key -> rows over steps */
  vectors: { [value: string]: { [series: string]: IVectorSeries } };
  /** reports that were sent but never arrived */
  dropped: number;
  /** reports received (optional) */
  received?: number;
}

export interface IChartOptions {
  /** height of each chart in pixels */
  height?: number;
  /** series above which the legend scrolls and the tooltip shows one line only */
  manySeries?: number;
}

/** An empty model, e.g. before the first data arrives. */
export function emptyModel(topic = ''): IMetricsModel {
  return { topic, scalars: {}, vectors: {}, dropped: 0, received: 0 };
}

function isDark(): boolean {
  const body = typeof document !== 'undefined' ? document.body : null;
  return !!body && body.getAttribute('data-jp-theme-light') === 'false';
}

interface IPanel {
  root: HTMLElement;
  chart: echarts.EChartsType;
  /** keys of the series drawn (line charts) */
  drawn: string;
  select?: HTMLSelectElement;
}

/** Summary line: topic, received and (in red) dropped reports. */
export function statusText(model: IMetricsModel): string {
  const received = model.received ?? 0;
  const nSeries = new Set<string>();
  for (const bySeries of Object.values(model.scalars)) {
    Object.keys(bySeries).forEach(k => nSeries.add(k));
  }
  for (const bySeries of Object.values(model.vectors)) {
    Object.keys(bySeries).forEach(k => nSeries.add(k));
  }
  return `${model.topic}: ${received.toLocaleString()} reports, ${nSeries.size} series`;
}

/** Option for one scalar value's line chart. */
export function lineOption(
  name: string,
  bySeries: { [series: string]: Point[] },
  manySeries = 12
): echarts.EChartsCoreOption {
  const keys = Object.keys(bySeries).sort(naturalCompare);
  const many = keys.length > manySeries;
  return {
    animation: false,
    backgroundColor: 'transparent',
    title: { text: name, left: 'center', top: 0, textStyle: { fontSize: 12 } },
    tooltip: many ? { trigger: 'item' } : { trigger: 'axis', axisPointer: { type: 'line' }, confine: true },
    legend: {
      show: keys.length > 1,
      type: 'scroll',
      bottom: 0,
      textStyle: { fontSize: 10 }
    },
    grid: { left: 56, right: 16, top: 28, bottom: keys.length > 1 ? 48 : 28 },
    xAxis: { type: 'value', name: 'step', nameLocation: 'end', min: 'dataMin', max: 'dataMax' },
    yAxis: { type: 'value', scale: true },
    dataZoom: [{ type: 'inside', filterMode: 'none' }],
    series: keys.map(key => ({
      id: key,
      name: key,
      type: 'line',
      data: bySeries[key],
      showSymbol: bySeries[key].length < 2,
      symbolSize: 4,
      sampling: 'lttb',
      large: true,
      connectNulls: false,
      lineStyle: { width: many ? 1 : 1.5 },
      emphasis: { focus: 'series' }
    }))
  };
}

/** Option for one vector value's heatmap (steps across, vector index down). */
export function heatmapOption(name: string, series: string, data: IVectorSeries): echarts.EChartsCoreOption {
  const width = data.rows.reduce((m, r) => Math.max(m, r.length), 0);
  const cells: [number, number, number][] = [];
  let lo = Infinity;
  let hi = -Infinity;
  data.rows.forEach((row, i) => {
    row.forEach((v, j) => {
      if (v !== null && Number.isFinite(v)) {
        cells.push([i, j, v]);
        lo = Math.min(lo, v);
        hi = Math.max(hi, v);
      }
    });
  });
  if (!Number.isFinite(lo)) {
    lo = 0;
    hi = 1;
  } else if (lo === hi) {
    hi = lo + 1;
  }
  return {
    animation: false,
    backgroundColor: 'transparent',
    title: { text: `${name} (${series})`, left: 'center', top: 0, textStyle: { fontSize: 12 } },
    tooltip: {
      position: 'top',
      formatter: (p: unknown) => {
        const v = (p as { value: [number, number, number] }).value;
        return `step ${data.steps[v[0]]}, index ${v[1]}: ${v[2].toPrecision(4)}`;
      }
    },
    grid: { left: 56, right: 80, top: 28, bottom: 28 },
    xAxis: { type: 'category', name: 'step', data: data.steps.map(s => String(s)) },
    yAxis: {
      type: 'category',
      name: 'index',
      data: Array.from({ length: width }, (_, j) => String(j))
    },
    visualMap: {
      min: lo,
      max: hi,
      calculable: true,
      orient: 'vertical',
      right: 0,
      top: 'middle',
      itemHeight: 120,
      inRange: { color: ['#440154', '#3b528b', '#21918c', '#5ec962', '#fde725'] }
    },
    series: [{ id: 'cells', type: 'heatmap', data: cells, progressive: 10000 }]
  };
}

function naturalCompare(a: string, b: string): number {
  return a.localeCompare(b, undefined, { numeric: true });
}

/**
 * Charts of one metrics topic inside `host`.  Call update() with every new
 * model; charts are created, updated in place (zoom kept) or removed.
 */
export class MetricsCharts {
  readonly node: HTMLElement;
  private readonly status: HTMLElement;
  private readonly grid: HTMLElement;
  private readonly panels = new Map<string, IPanel>();
  private readonly options: Required<IChartOptions>;
  private readonly resizer: ResizeObserver | null;
  private model: IMetricsModel = emptyModel();

  constructor(host: HTMLElement, options: IChartOptions = {}) {
    this.options = { height: options.height ?? 260, manySeries: options.manySeries ?? 12 };
    this.node = document.createElement('div');
    this.node.className = 'jc-metrics';
    this.status = document.createElement('div');
    this.status.className = 'jc-metrics-status';
    this.status.style.cssText = 'font-size: 12px; margin: 2px 0 6px 0;';
    this.grid = document.createElement('div');
    this.grid.className = 'jc-metrics-grid';
    this.grid.style.cssText = 'display: grid; grid-template-columns: repeat(auto-fill, minmax(360px, 1fr)); gap: 8px;';
    this.node.append(this.status, this.grid);
    host.appendChild(this.node);
    this.resizer =
      typeof ResizeObserver !== 'undefined'
        ? new ResizeObserver(() => this.panels.forEach(p => p.chart.resize()))
        : null;
    this.resizer?.observe(this.node);
  }

  /** Draw `model` (the whole current state of the topic). */
  update(model: IMetricsModel): void {
    this.model = model;
    this.status.textContent = statusText(model);
    if (model.dropped > 0) {
      const dropped = document.createElement('span');
      dropped.style.color = '#d9534f';
      dropped.textContent = `, ${model.dropped.toLocaleString()} dropped`;
      this.status.appendChild(dropped);
    }
    const wanted = new Set<string>();
    for (const name of Object.keys(model.scalars).sort(naturalCompare)) {
      const id = `scalar:${name}`;
      wanted.add(id);
      this.updateLine(id, name, model.scalars[name]);
    }
    for (const name of Object.keys(model.vectors).sort(naturalCompare)) {
      const id = `vector:${name}`;
      wanted.add(id);
      this.updateHeatmap(id, name, model.vectors[name]);
    }
    for (const [id, panel] of this.panels) {
      if (!wanted.has(id)) {
        panel.chart.dispose();
        panel.root.remove();
        this.panels.delete(id);
      }
    }
    if (this.panels.size === 0) {
      this.status.textContent = `${statusText(model)} (waiting for reports)`;
    }
  }

  /** Remove every chart and the DOM this object made. */
  dispose(): void {
    this.resizer?.disconnect();
    this.panels.forEach(p => p.chart.dispose());
    this.panels.clear();
    this.node.remove();
  }

  private panel(id: string, withSelect: boolean): IPanel {
    const existing = this.panels.get(id);
    if (existing) {
      return existing;
    }
    const root = document.createElement('div');
    root.className = 'jc-metrics-panel';
    let select: HTMLSelectElement | undefined;
    if (withSelect) {
      select = document.createElement('select');
      select.style.cssText = 'font-size: 11px; margin-bottom: 2px;';
      select.addEventListener('change', () => {
        const name = id.slice('vector:'.length);
        const bySeries = this.model.vectors[name];
        if (bySeries) {
          this.updateHeatmap(id, name, bySeries);
        }
      });
      root.appendChild(select);
    }
    const box = document.createElement('div');
    box.style.cssText = `width: 100%; height: ${this.options.height}px;`;
    root.appendChild(box);
    this.grid.appendChild(root);
    const chart = echarts.init(box, isDark() ? 'dark' : undefined, { renderer: 'canvas' });
    const panel: IPanel = { root, chart, drawn: '', select };
    this.panels.set(id, panel);
    return panel;
  }

  private updateLine(id: string, name: string, bySeries: { [series: string]: Point[] }): void {
    const panel = this.panel(id, false);
    const keys = Object.keys(bySeries).sort(naturalCompare).join('\u0000');
    const option = lineOption(name, bySeries, this.options.manySeries);
    if (panel.drawn === keys) {
      // same series: replace the data only, so the user's zoom survives
      panel.chart.setOption({ series: option.series }, { lazyUpdate: true });
    } else {
      panel.chart.setOption(option, { notMerge: true });
      panel.drawn = keys;
    }
  }

  private updateHeatmap(id: string, name: string, bySeries: { [series: string]: IVectorSeries }): void {
    const keys = Object.keys(bySeries).sort(naturalCompare);
    const panel = this.panel(id, keys.length > 1);
    let chosen = keys[0];
    if (panel.select) {
      const current = panel.select.value;
      if (panel.select.options.length !== keys.length) {
        panel.select.replaceChildren(
          ...keys.map(k => {
            const o = document.createElement('option');
            o.value = k;
            o.textContent = k;
            return o;
          })
        );
      }
      chosen = keys.includes(current) ? current : keys[0];
      panel.select.value = chosen;
    }
    if (chosen === undefined) {
      return;
    }
    panel.chart.setOption(heatmapOption(name, chosen, bySeries[chosen]), { notMerge: true });
  }
}
