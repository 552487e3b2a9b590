/**
 * Metric charts, written once: used by the notebook widget (metricsWidget.ts,
 * bundled to jupyter_cluster/widgets/static/metrics.js) and by the sidebar panel.
 *
 * Input is the shared metrics data model (see IMetricsModel), already
 * downsampled on the Python side.  Each scalar value gets one line chart with
 * one line per series; each vector value gets small multiples: one heatmap per
 * run on one shared colour scale, and optionally the difference of two runs.
 * Charts follow their container's size (a ResizeObserver per chart) and lay
 * out for narrow hosts (the sidebar's 250 px) as well as wide ones.
 */
import * as echarts from 'echarts/core';
import { HeatmapChart, LineChart } from 'echarts/charts';
import {
  DataZoomComponent,
  GridComponent,
  LegendComponent,
  TitleComponent,
  ToolboxComponent,
  TooltipComponent,
  VisualMapComponent
} from 'echarts/components';
import { CanvasRenderer } from 'echarts/renderers';

import type { IMetricsModel, IVectorSeries, Point, XAxisMode } from './data';
import {
  absMax,
  diffVectors,
  ema,
  emptyModel,
  escapeHTML,
  formatNumber,
  formatX,
  matchSeries,
  metricsCode,
  naturalCompare,
  onAxis,
  seriesLabel,
  sharedRange,
  toCSV,
  truncatedText,
  vectorAxisName,
  X_AXIS_NAMES,
  withoutSeries,
  xAxisOption
} from './data';
import { el } from './dom';

import type { IOverlay, IOverlayPick, OverlayAxes } from './overlay';
import {
  addPick,
  overlayLegend,
  overlayLines,
  overlayOption,
  parsePick,
  pickKept,
  pickKey,
  pickTopics,
  removePick,
  sourceKey
} from './overlay';

export type { IMetricsModel, IVectorSeries, Point, XAxisMode } from './data';
export { emptyModel } from './data';
export type { IOverlayPick, OverlayAxes } from './overlay';
export { overlayOption } from './overlay';

echarts.use([
  LineChart,
  HeatmapChart,
  GridComponent,
  TooltipComponent,
  LegendComponent,
  VisualMapComponent,
  DataZoomComponent,
  TitleComponent,
  ToolboxComponent,
  CanvasRenderer
]);

export interface IChartOptions {
  /** height of each line chart in pixels */
  height?: number;
  /** series above which the legend scrolls and the tooltip shows one line only */
  manySeries?: number;
  /** the charts' initial theme (default: JupyterLab's body attribute) */
  dark?: boolean;
}

/** How a line chart is drawn (the toolbar's choices). */
export interface ILineView {
  /** EMA weight in [0, 1) */
  smoothing: number;
  logY: boolean;
  /** what the x axis shows; the points are already on it (pointsOnAxis) */
  x?: XAxisMode;
  /** narrow host: fewer ticks, no paging legend */
  compact: boolean;
}

/** Below this chart width the layout is compact (the sidebar's default is 250 px). */
export const COMPACT_WIDTH = 420;

/** ECharts 6's series palette (light and dark themes alike), fixed per series key here. */
const PALETTE = ['#5070dd', '#b6d634', '#505372', '#ff994d', '#0ca8df', '#ffd10a', '#fb628b', '#785db0', '#3fbe95'];
const VIRIDIS = ['#440154', '#3b528b', '#21918c', '#5ec962', '#fde725'];
const DIVERGING = ['#2166ac', '#92c5de', '#f7f7f7', '#f4a582', '#b2182b'];

/** Whether JupyterLab's current theme is dark (from the body attribute it sets). */
export function isDark(): boolean {
  const body = typeof document !== 'undefined' ? document.body : null;
  return !!body && body.getAttribute('data-jp-theme-light') === 'false';
}

/** Summary line: topic, received reports and series. */
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

interface IAxisParam {
  seriesId?: string;
  seriesName?: string;
  marker?: string;
  value?: unknown;
  axisValue?: unknown;
}

function axisTooltip(params: unknown, limit: number, mode: XAxisMode = 'step'): string {
  const list = (Array.isArray(params) ? params : [params]) as IAxisParam[];
  const shown = list.filter(p => !(p.seriesId ?? '').startsWith('raw:'));
  const x = Number(shown[0]?.axisValue ?? (shown[0]?.value as Point | undefined)?.[0]);
  const rows = shown
    .map(p => ({ p, y: (p.value as Point | undefined)?.[1] ?? null }))
    .sort((a, b) => (b.y ?? -Infinity) - (a.y ?? -Infinity));
  const lines = rows
    .slice(0, limit)
    .map(({ p, y }) => `${p.marker ?? ''}${escapeHTML(p.seriesName ?? '')}: <b>${formatNumber(y)}</b>`);
  if (rows.length > limit) {
    lines.push(`… ${rows.length - limit} more`);
  }
  return [formatX(x, mode), ...lines].join('<br/>');
}

/** Option for one scalar value's line chart. */
export function lineOption(
  name: string,
  bySeries: { [series: string]: Point[] },
  manySeries = 12,
  view: Partial<ILineView> = {},
  colorOf: (key: string) => string | undefined = () => undefined
): echarts.EChartsCoreOption {
  const keys = Object.keys(bySeries).sort(naturalCompare);
  const many = keys.length > manySeries;
  const compact = !!view.compact;
  const smoothing = view.smoothing ?? 0;
  const mode = view.x ?? 'step';
  const legend = keys.length > 1 && (compact ? keys.length <= 3 : true);
  const series: object[] = [];
  for (const key of keys) {
    const data = bySeries[key];
    // one colour per series, the same for its raw and smoothed lines and whichever series are hidden
    const color = colorOf(key);
    if (smoothing > 0) {
      series.push({
        id: `raw:${key}`,
        name: seriesLabel(key),
        type: 'line',
        data,
        showSymbol: false,
        silent: true,
        itemStyle: { color },
        lineStyle: { width: 1, opacity: 0.25, color },
        tooltip: { show: false },
        z: 1
      });
    }
    series.push({
      id: key,
      name: seriesLabel(key),
      type: 'line',
      data: smoothing > 0 ? ema(data, smoothing) : data,
      showSymbol: data.length < 2,
      symbolSize: 4,
      sampling: 'lttb',
      large: true,
      connectNulls: false,
      itemStyle: { color },
      lineStyle: { width: many ? 1 : 1.5, color },
      emphasis: { focus: 'series' },
      z: 2
    });
  }
  return {
    animation: false,
    backgroundColor: 'transparent',
    title: { text: name, left: 4, top: 2, textStyle: { fontSize: 12 } },
    tooltip: many
      ? { trigger: 'item', confine: true, valueFormatter: (v: unknown) => formatNumber(Number(v)) }
      : {
          trigger: 'axis',
          axisPointer: { type: 'line' },
          confine: true,
          formatter: (p: unknown) => axisTooltip(p, compact ? 6 : 12, mode)
        },
    toolbox: {
      right: 4,
      top: 0,
      itemSize: 12,
      itemGap: 6,
      feature: {
        dataZoom: { yAxisIndex: 'none', title: { zoom: 'zoom (drag)', back: 'reset zoom' } },
        saveAsImage: { title: 'PNG', name: name.replace(/\W+/g, '_'), pixelRatio: 2 }
      }
    },
    legend: {
      show: legend,
      type: 'scroll',
      bottom: 0,
      itemWidth: 14,
      itemHeight: 8,
      textStyle: { fontSize: 10 },
      data: keys.map(seriesLabel)
    },
    grid: { left: compact ? 44 : 56, right: compact ? 10 : 16, top: 26, bottom: legend ? 52 : 34 },
    xAxis: xAxisOption(mode, compact),
    yAxis: {
      type: view.logY ? 'log' : 'value',
      scale: true,
      splitNumber: compact ? 3 : 5,
      axisLabel: { fontSize: 10, formatter: (v: number) => formatNumber(v) }
    },
    dataZoom: [{ type: 'inside', filterMode: 'none' }],
    series
  };
}

/** How the small multiples of one vector value are laid out in a chart of `width` pixels. */
export function heatmapLayout(
  n: number,
  width: number
): { cols: number; rows: number; cellHeight: number; height: number } {
  const cols = Math.max(1, Math.min(n, Math.floor(width / 300)));
  const rows = Math.ceil(n / cols);
  const cellHeight = width < COMPACT_WIDTH ? 96 : 130;
  return { cols, rows, cellHeight, height: HEAT_TOP + rows * (cellHeight + HEAT_BLOCK) + HEAT_BOTTOM };
}

const HEAT_TOP = 24; // the value's title
const HEAT_BLOCK = 44; // a run's label above its grid and the step labels below
const HEAT_BOTTOM = 40; // the colour bars

/** An echarts visualMap: the draggable colour bar of the heatmaps ``seriesIndex``, from ``min`` to ``max``. */
function colourBar(
  seriesIndex: number[],
  min: number,
  max: number,
  colours: string[],
  side: { left: number } | { right: number },
  length: number
): object {
  return {
    seriesIndex,
    min,
    max,
    calculable: true,
    orient: 'horizontal',
    ...side,
    bottom: 4,
    itemWidth: 10,
    itemHeight: length,
    textStyle: { fontSize: 10 },
    formatter: (v: number) => formatNumber(v),
    inRange: { color: colours }
  };
}

/**
 * Option for one vector value: one heatmap per run (steps across, vector
 * index down) sharing one colour scale, plus `diff` (a - b) on a diverging
 * scale of its own when given.
 */
export function heatmapOption(
  name: string,
  bySeries: { [series: string]: IVectorSeries },
  width: number,
  diff: [string, string] | null = null
): echarts.EChartsCoreOption {
  const keys = Object.keys(bySeries).sort(naturalCompare);
  const panels: { title: string; data: IVectorSeries; isDiff: boolean }[] = keys.map(k => ({
    title: seriesLabel(k),
    data: bySeries[k],
    isDiff: false
  }));
  if (diff && bySeries[diff[0]] && bySeries[diff[1]]) {
    panels.push({
      title: `${seriesLabel(diff[0])} − ${seriesLabel(diff[1])}`,
      data: diffVectors(bySeries[diff[0]], bySeries[diff[1]]),
      isDiff: true
    });
  }
  const layout = heatmapLayout(panels.length, width);
  const [lo, hi] = sharedRange(bySeries);
  const axisName = vectorAxisName(name);
  const colWidth = width / layout.cols;
  const left = 40;
  const titles: object[] = [{ text: name, left: 4, top: 2, textStyle: { fontSize: 12 } }];
  const grids: object[] = [];
  const xAxes: object[] = [];
  const yAxes: object[] = [];
  const series: object[] = [];
  const runIndices: number[] = [];
  const diffIndices: number[] = [];
  panels.forEach((p, i) => {
    const col = i % layout.cols;
    const row = Math.floor(i / layout.cols);
    const x = col * colWidth + left;
    const y = HEAT_TOP + row * (layout.cellHeight + HEAT_BLOCK) + 16;
    const gridWidth = Math.max(40, colWidth - left - 10);
    titles.push({
      text: p.title,
      left: x,
      top: y - 16,
      textStyle: { fontSize: 11, fontWeight: 'normal' }
    });
    grids.push({ left: x, top: y, width: gridWidth, height: layout.cellHeight });
    const vecWidth = p.data.rows.reduce((m, r) => Math.max(m, r.length), 0);
    xAxes.push({
      type: 'category',
      gridIndex: i,
      data: p.data.steps.map(s => formatNumber(s)),
      axisLabel: { fontSize: 10, hideOverlap: true },
      axisTick: { show: false }
    });
    yAxes.push({
      type: 'category',
      gridIndex: i,
      name: axisName,
      nameLocation: 'middle',
      nameGap: 24,
      nameTextStyle: { fontSize: 10 },
      data: Array.from({ length: vecWidth }, (_, j) => String(j)),
      axisLabel: { fontSize: 9, hideOverlap: true }
    });
    const cells: [number, number, number][] = [];
    p.data.rows.forEach((r, si) =>
      r.forEach((v, j) => {
        if (v !== null && Number.isFinite(v)) {
          cells.push([si, j, v]);
        }
      })
    );
    (p.isDiff ? diffIndices : runIndices).push(i);
    series.push({
      id: p.isDiff ? 'diff' : `run:${keys[i]}`,
      name: p.title,
      type: 'heatmap',
      xAxisIndex: i,
      yAxisIndex: i,
      data: cells,
      progressive: 10000
    });
  });
  const barLength = Math.max(60, Math.min(180, (diffIndices.length ? width / 2 : width) - 110));
  // the runs' shared scale at the bottom left; the difference's, centred on 0, at the bottom right
  const visualMap: object[] = [colourBar(runIndices, lo, hi, VIRIDIS, { left: 4 }, barLength)];
  if (diffIndices.length) {
    const m = absMax((panels[panels.length - 1] as { data: IVectorSeries }).data);
    visualMap.push(colourBar(diffIndices, -m, m, DIVERGING, { right: 4 }, barLength));
  }
  return {
    animation: false,
    backgroundColor: 'transparent',
    title: titles,
    tooltip: {
      confine: true,
      formatter: (p: unknown) => {
        const { seriesIndex, value } = p as { seriesIndex: number; value: [number, number, number] };
        const panel = panels[seriesIndex];
        const step = panel ? panel.data.steps[value[0]] : value[0];
        return `${escapeHTML(panel?.title ?? '')}<br/>step ${formatNumber(step)}, ${axisName} ${value[1]}: <b>${formatNumber(value[2])}</b>`;
      }
    },
    toolbox: {
      right: 4,
      top: 0,
      itemSize: 12,
      feature: { saveAsImage: { title: 'PNG', name: name.replace(/\W+/g, '_'), pixelRatio: 2 } }
    },
    grid: grids,
    xAxis: xAxes,
    yAxis: yAxes,
    visualMap,
    series
  };
}

interface IPanel {
  kind: 'line' | 'heat' | 'overlay';
  name: string;
  root: HTMLElement;
  box: HTMLElement;
  chart: echarts.EChartsType;
  /** what the last full draw depended on (series keys, layout, view) */
  drawn: string;
  /** heatmaps: the "difference of two runs" picker */
  diff?: HTMLSelectElement;
}

function download(filename: string, blob: Blob): void {
  const url = URL.createObjectURL(blob);
  const a = el('a');
  a.href = url;
  a.download = filename;
  a.click();
  window.setTimeout(() => URL.revokeObjectURL(url), 1000);
}

const SMOOTHING = [0, 0.6, 0.8, 0.9, 0.95, 0.99];

/**
 * Charts of one metrics topic inside `host`.  Call update() with every new
 * model; charts are created, updated in place (zoom kept) or removed.
 */
export class MetricsCharts {
  readonly node: HTMLElement;
  private readonly status: HTMLElement;
  private readonly toolbar: HTMLElement;
  private readonly grid: HTMLElement;
  private readonly panels = new Map<string, IPanel>();
  private readonly options: Required<Omit<IChartOptions, 'dark'>>;
  private readonly resizer: ResizeObserver | null;
  private model: IMetricsModel = emptyModel();
  private shown: IMetricsModel = emptyModel();
  private dark: boolean;
  private smoothing = 0;
  private logY = false;
  private xMode: XAxisMode = 'step';
  private filter = '';
  private hidden: string[] = [];
  private frame = 0;
  private themeFrame = 0;
  private readonly resized = new Set<Element>();
  private readonly smoothingSelect: HTMLSelectElement;
  private readonly logInput: HTMLInputElement;
  private readonly xSelect: HTMLSelectElement;
  private readonly filterInput: HTMLInputElement;
  /** the overlay: chosen metrics, the models of other topics they come from, and what else could be chosen */
  private picks: IOverlayPick[] = [];
  private overlayAxes: OverlayAxes = 'auto';
  private readonly sources = new Map<string, IMetricsModel>();
  private catalog: { topic: string; scalars: string[]; cluster?: string }[] = [];
  private readonly overlayAdd: HTMLSelectElement;
  private readonly overlayAxesSelect: HTMLSelectElement;
  private readonly overlayPicks: HTMLElement;
  /** Called with the topics besides this one that the overlay draws from (the host should feed them). */
  onOverlayTopics: ((topics: string[]) => void) | null = null;
  /** Called with the kept clusters' topics the overlay draws from (the host should read them once). */
  onOverlayKept: ((sources: { cluster: string; topic: string }[]) => void) | null = null;

  constructor(host: HTMLElement, options: IChartOptions = {}) {
    this.options = { height: options.height ?? 260, manySeries: options.manySeries ?? 12 };
    this.dark = options.dark ?? isDark();
    this.node = el('div', 'jc-metrics');
    this.node.dataset.theme = this.dark ? 'dark' : 'light';
    this.status = el('div', 'jc-metrics-status');
    this.status.style.cssText = 'font-size: 12px; margin: 2px 0 4px 0;';

    // toolbar: smoothing, log y, series filter, exports
    this.toolbar = el('div', 'jc-metrics-toolbar');
    this.toolbar.style.cssText =
      'display: flex; flex-wrap: wrap; align-items: center; gap: 4px 10px; font-size: 11px; margin-bottom: 4px;';
    const smoothLabel = el('label', 'jc-tool', 'smooth ');
    this.smoothingSelect = el('select', 'jc-smoothing');
    this.smoothingSelect.title = 'Exponential moving average, as in TensorBoard (raw data stays faint behind)';
    for (const w of SMOOTHING) {
      const o = el('option', '', w === 0 ? 'off' : String(w));
      o.value = String(w);
      this.smoothingSelect.append(o);
    }
    this.smoothingSelect.addEventListener('change', () => {
      this.smoothing = Number(this.smoothingSelect.value) || 0;
      this.redraw();
    });
    smoothLabel.append(this.smoothingSelect);
    const logLabel = el('label', 'jc-tool');
    this.logInput = el('input', 'jc-log-y');
    this.logInput.type = 'checkbox';
    this.logInput.addEventListener('change', () => {
      this.logY = this.logInput.checked;
      this.redraw();
    });
    logLabel.append(this.logInput, document.createTextNode(' log y'));
    const xLabel = el('label', 'jc-tool', 'x ');
    this.xSelect = el('select', 'jc-x-axis');
    this.xSelect.title =
      'The x axis: the reported step, the wall-clock time of each report, or the time since the first';
    for (const mode of Object.keys(X_AXIS_NAMES) as XAxisMode[]) {
      const o = el('option', '', X_AXIS_NAMES[mode]);
      o.value = mode;
      this.xSelect.append(o);
    }
    this.xSelect.addEventListener('change', () => {
      this.xMode = this.xSelect.value as XAxisMode;
      this.redraw();
    });
    xLabel.append(this.xSelect);
    this.filterInput = el('input', 'jc-series-filter');
    this.filterInput.type = 'search';
    this.filterInput.placeholder = 'filter series';
    this.filterInput.style.cssText = 'width: 8em; font-size: 11px;';
    this.filterInput.addEventListener('input', () => {
      this.filter = this.filterInput.value;
      this.redraw();
    });
    const csv = el('button', 'jc-export-csv', 'CSV');
    csv.title = 'Download the drawn data as CSV';
    csv.addEventListener('click', () =>
      download(`${this.model.topic || 'metrics'}.csv`, new Blob([toCSV(this.shown)], { type: 'text/csv' }))
    );
    const copy = el('button', 'jc-copy-code', 'copy code');
    copy.title = 'Copy the notebook code that loads the full history as a DataFrame';
    copy.addEventListener('click', () => void this.copyCode(copy));
    for (const b of [csv, copy]) {
      b.style.cssText = 'font-size: 11px; padding: 0 4px;';
    }
    // overlay: add a metric (this topic's values and series, other topics' values), shown as chips
    this.overlayAdd = el('select', 'jc-overlay-add');
    this.overlayAdd.title = 'Draw chosen metrics together on one chart (from this topic, or others of the cluster)';
    this.overlayAdd.style.cssText = 'font-size: 11px; max-width: 10em;';
    this.overlayAdd.addEventListener('change', () => {
      const pick = parsePick(this.overlayAdd.value);
      this.overlayAdd.value = '';
      if (pick) {
        this.setPicks(addPick(this.picks, pick));
      }
    });
    this.overlayAxesSelect = el('select', 'jc-overlay-axes');
    this.overlayAxesSelect.title =
      "The overlay's y axes: automatic (one metric: one axis; two: left and right; more: each scaled to 0-1), or forced";
    this.overlayAxesSelect.style.cssText = 'font-size: 11px;';
    for (const [value, label] of [
      ['auto', 'axes: auto'],
      ['shared', 'one axis'],
      ['dual', 'two axes'],
      ['normalised', 'scaled 0–1']
    ]) {
      const o = el('option', '', label);
      o.value = value;
      this.overlayAxesSelect.append(o);
    }
    this.overlayAxesSelect.addEventListener('change', () => {
      this.overlayAxes = this.overlayAxesSelect.value as OverlayAxes;
      this.redraw();
    });
    this.overlayPicks = el('span', 'jc-overlay-picks');
    this.overlayPicks.style.cssText = 'display: contents;';
    this.toolbar.append(
      smoothLabel,
      logLabel,
      xLabel,
      this.filterInput,
      csv,
      copy,
      this.overlayAdd,
      this.overlayPicks,
      this.overlayAxesSelect
    );

    this.grid = el('div', 'jc-metrics-grid');
    this.grid.style.cssText =
      'display: grid; grid-template-columns: repeat(auto-fill, minmax(min(100%, 360px), 1fr)); gap: 8px;';
    this.node.append(this.status, this.toolbar, this.grid);
    host.appendChild(this.node);
    this.resizer = typeof ResizeObserver !== 'undefined' ? new ResizeObserver(entries => this.onResize(entries)) : null;
  }

  /**
   * Draw `model` (the whole current state of the topic) without the series
   * keys in `hidden`; each series keeps its colour whichever are hidden.
   */
  update(model: IMetricsModel, hidden: string[] = []): void {
    const topicChanged = model.topic !== this.model.topic;
    this.model = model;
    if (topicChanged && this.picks.length) {
      // the overlay keeps its picks: those of the topic shown before now come from another one
      this.onOverlayTopics?.(pickTopics(this.picks, model.topic));
    }
    this.hidden = hidden;
    this.redraw();
  }

  /**
   * What the overlay can draw besides this topic: other topics of the same
   * cluster, and (`cluster` set) topics of earlier runs the server kept, with
   * their scalar values.
   */
  setCatalog(topics: { topic: string; scalars: string[]; cluster?: string }[]): void {
    const next = topics.filter(t => (t.cluster || t.topic !== this.model.topic) && t.scalars.length > 0);
    if (JSON.stringify(next) === JSON.stringify(this.catalog)) {
      return;
    }
    this.catalog = next;
    this.redraw();
  }

  /** The latest model of another topic the overlay draws from (of a kept cluster when `cluster` is given). */
  setSource(model: IMetricsModel, cluster?: string): void {
    this.sources.set(sourceKey(model.topic, cluster), model);
    if (this.picks.some(p => p.topic === model.topic && (p.cluster ?? undefined) === cluster)) {
      this.redraw();
    }
  }

  /** The metrics drawn on the overlay chart (replaces the user's choice). */
  setOverlay(picks: IOverlayPick[], axes: OverlayAxes = this.overlayAxes): void {
    this.overlayAxes = axes;
    this.overlayAxesSelect.value = axes;
    this.setPicks(picks);
  }

  private setPicks(picks: IOverlayPick[]): void {
    this.picks = picks;
    this.onOverlayTopics?.(pickTopics(picks, this.model.topic));
    this.onOverlayKept?.(pickKept(picks));
    this.redraw();
  }

  /** Switch between the dark and the light look; existing charts are re-styled. */
  setDark(dark: boolean): void {
    if (dark === this.dark) {
      return;
    }
    this.dark = dark;
    this.node.dataset.theme = dark ? 'dark' : 'light';
    // chart.setTheme() leaves components already laid out in the old colours:
    // draw each chart anew in the new theme, in the next frame (while JupyterLab
    // swaps its theme's CSS the boxes may measure 0 for a moment)
    window.cancelAnimationFrame(this.themeFrame);
    this.themeFrame = window.requestAnimationFrame(() => {
      this.panels.forEach(p => {
        p.chart.dispose();
        p.chart = echarts.init(p.box, this.dark ? 'dark' : undefined, { renderer: 'canvas' });
        p.drawn = '';
        this.draw(p);
      });
    });
  }

  /** Fit every chart to its box now (e.g. after the host was shown or resized). */
  resize(): void {
    this.panels.forEach(p => this.fit(p));
  }

  /** Remove every chart and the DOM this object made. */
  dispose(): void {
    this.resizer?.disconnect();
    window.cancelAnimationFrame(this.frame);
    window.cancelAnimationFrame(this.themeFrame);
    this.panels.forEach(p => p.chart.dispose());
    this.panels.clear();
    this.node.remove();
  }

  private async copyCode(button: HTMLButtonElement): Promise<void> {
    const code = metricsCode(this.model.topic);
    try {
      await navigator.clipboard.writeText(code);
      button.textContent = 'copied';
    } catch {
      window.prompt('Copy this code:', code);
    }
    window.setTimeout(() => (button.textContent = 'copy code'), 1500);
  }

  private redraw(): void {
    const model = matchSeries(withoutSeries(this.model, this.hidden), this.filter);
    this.shown = model;
    this.status.textContent = statusText(this.model);
    if (this.model.dropped > 0) {
      const dropped = el('span', '', `, ${this.model.dropped.toLocaleString()} dropped`);
      dropped.style.color = '#d9534f';
      this.status.appendChild(dropped);
    }
    const truncated = truncatedText(this.model);
    if (truncated !== null) {
      const notice = el('span', 'jc-metrics-truncated', truncated);
      notice.style.color = '#b07d00';
      // the cap is per value and series, so the curves start later than the topic's first reports
      notice.title =
        'Each value of each series keeps only its newest points (jupyter-cluster.metrics.history, ' +
        '100,000 by default); the charts begin after the first reports.';
      this.status.appendChild(notice);
    }
    const wanted = new Set<string>();
    this.renderOverlayTools();
    if (this.picks.length > 0) {
      wanted.add('overlay');
      this.draw(this.panel('overlay', 'overlay', 'overlay'));
    }
    for (const name of Object.keys(model.scalars).sort(naturalCompare)) {
      const id = `scalar:${name}`;
      wanted.add(id);
      this.draw(this.panel(id, 'line', name));
    }
    for (const name of Object.keys(model.vectors).sort(naturalCompare)) {
      const id = `vector:${name}`;
      wanted.add(id);
      this.draw(this.panel(id, 'heat', name));
    }
    for (const [id, panel] of this.panels) {
      if (!wanted.has(id)) {
        this.resizer?.unobserve(panel.box);
        panel.chart.dispose();
        panel.root.remove();
        this.panels.delete(id);
      }
    }
    const hasVectors = Object.keys(this.model.vectors).length > 0;
    const hasScalars = Object.keys(this.model.scalars).length > 0;
    this.toolbar.style.display = hasScalars || hasVectors ? 'flex' : 'none';
    if (Object.keys(this.model.scalars).length + Object.keys(this.model.vectors).length === 0) {
      this.status.textContent = `${statusText(this.model)} (waiting for reports)`;
    }
  }

  /** The overlay's "add" menu (rebuilt when what can be picked changed), its chips and its axes choice. */
  private renderOverlayTools(): void {
    const options: [string, string][] = [];
    const own = this.model.topic;
    for (const value of Object.keys(this.model.scalars).sort(naturalCompare)) {
      const keys = Object.keys(this.model.scalars[value]).sort(naturalCompare);
      options.push([pickKey({ topic: own, value, series: null }), keys.length > 1 ? `${value} (all series)` : value]);
      if (keys.length > 1 && keys.length <= 40) {
        for (const key of keys) {
          options.push([pickKey({ topic: own, value, series: key }), `${value} · ${seriesLabel(key)}`]);
        }
      }
    }
    for (const t of this.catalog) {
      for (const value of [...t.scalars].sort(naturalCompare)) {
        options.push([
          pickKey({ topic: t.topic, value, series: null, cluster: t.cluster ?? null }),
          `${t.cluster ? `${t.cluster} · ` : ''}${t.topic}: ${value}`
        ]);
      }
    }
    const chosen = new Set(this.picks.map(pickKey));
    const offered = options.filter(([key]) => !chosen.has(key));
    const signature = JSON.stringify(offered);
    if (this.overlayAdd.dataset.offered !== signature) {
      this.overlayAdd.dataset.offered = signature;
      const first = el('option', '', 'overlay +');
      first.value = '';
      this.overlayAdd.replaceChildren(
        first,
        ...offered.map(([key, label]) => {
          const o = el('option', '', label);
          o.value = key;
          return o;
        })
      );
      this.overlayAdd.value = '';
    }
    this.overlayAdd.style.display = offered.length || this.picks.length ? '' : 'none';
    const chips = JSON.stringify(this.picks);
    if (this.overlayPicks.dataset.picks !== chips) {
      this.overlayPicks.dataset.picks = chips;
      this.overlayPicks.replaceChildren(
        ...this.picks.map(pick => {
          const label =
            (pick.cluster ? `${pick.cluster} · ` : '') +
            (pick.topic !== own || pick.cluster ? `${pick.topic}: ` : '') +
            pick.value +
            (pick.series !== null ? ` · ${seriesLabel(pick.series)}` : '');
          const chip = el('button', 'jc-overlay-pick', `${label} ×`);
          chip.title = `Take ${label} off the overlay`;
          chip.style.cssText = 'font-size: 11px; padding: 0 4px;';
          chip.addEventListener('click', () => this.setPicks(removePick(this.picks, pick)));
          return chip;
        })
      );
    }
    this.overlayAxesSelect.style.display = this.picks.length > 1 ? '' : 'none';
  }

  private overlay(): IOverlay {
    const sources: { [topic: string]: IMetricsModel } = Object.fromEntries(this.sources);
    sources[this.model.topic] = this.model;
    return overlayLines(sources, this.picks, this.xMode, this.overlayAxes, this.model.topic);
  }

  private drawOverlay(panel: IPanel): void {
    const overlay = this.overlay();
    const view: ILineView = {
      smoothing: this.smoothing,
      logY: this.logY,
      x: this.xMode,
      compact: this.width(panel) < COMPACT_WIDTH
    };
    const width = this.width(panel);
    const option = overlayOption(overlay, { ...view, width }, i => PALETTE[i % PALETTE.length]);
    // a wrapped legend gets room of its own rather than squeezing the plot
    const { rows } = overlayLegend(
      overlay.lines.map(l => l.name),
      width
    );
    const height = `${this.options.height + 18 * Math.max(0, rows - 1)}px`;
    if (panel.box.style.height !== height) {
      panel.box.style.height = height;
      panel.chart.resize();
    }
    const drawn = JSON.stringify([overlay.lines.map(l => [l.id, l.axis]), overlay.axisNames, view, rows]);
    if (panel.drawn === drawn) {
      panel.chart.setOption({ series: option.series }, { lazyUpdate: true });
    } else {
      panel.chart.setOption(option, { notMerge: true });
      panel.drawn = drawn;
    }
    // what is drawn, for tests and for the curious: lines, their axes and the sharing chosen
    Object.assign(panel.root.dataset, {
      lines: overlay.lines.map(l => l.name).join('|'),
      axes: overlay.axes,
      axisNames: overlay.axisNames.join('|'),
      right: overlay.lines
        .filter(l => l.axis === 1)
        .map(l => l.name)
        .join('|')
    });
  }

  private panel(id: string, kind: 'line' | 'heat' | 'overlay', name: string): IPanel {
    const existing = this.panels.get(id);
    if (existing) {
      return existing;
    }
    const root = el('div', `jc-metrics-panel jc-metrics-${kind}`);
    root.dataset.value = name;
    // a grid item may shrink below its content's width, so the canvas follows the column
    root.style.cssText = 'min-width: 0;';
    let diff: HTMLSelectElement | undefined;
    if (kind === 'heat') {
      diff = el('select', 'jc-diff');
      diff.title = 'Show the difference of two runs on its own colour scale';
      diff.style.cssText = 'font-size: 11px; margin-bottom: 2px; max-width: 100%;';
      diff.addEventListener('change', () => {
        const p = this.panels.get(id);
        if (p) {
          this.draw(p);
        }
      });
      root.appendChild(diff);
    }
    const box = el('div', 'jc-chart-box');
    box.style.cssText = `width: 100%; height: ${this.options.height}px;`;
    root.appendChild(box);
    if (kind === 'overlay') {
      this.grid.prepend(root); // the user's own chart comes first
    } else {
      this.grid.appendChild(root);
    }
    const chart = echarts.init(box, this.dark ? 'dark' : undefined, { renderer: 'canvas' });
    const panel: IPanel = { kind, name, root, box, chart, drawn: '', diff };
    this.panels.set(id, panel);
    this.resizer?.observe(box);
    return panel;
  }

  private onResize(entries: ResizeObserverEntry[]): void {
    entries.forEach(e => this.resized.add(e.target));
    // draw in the next frame (a redraw inside the observer's callback would loop),
    // every box that changed since the last one
    if (this.frame) {
      return;
    }
    this.frame = window.requestAnimationFrame(() => {
      this.frame = 0;
      const boxes = new Set(this.resized);
      this.resized.clear();
      this.panels.forEach(p => {
        if (boxes.has(p.box)) {
          this.fit(p);
        }
      });
    });
  }

  private fit(panel: IPanel): void {
    if (!panel.box.clientWidth) {
      return; // hidden: the observer calls again when it is shown
    }
    panel.chart.resize();
    // the layout depends on the width: redraw when it crossed a threshold
    this.draw(panel);
  }

  private width(panel: IPanel): number {
    return panel.box.clientWidth || panel.chart.getWidth() || 360;
  }

  private draw(panel: IPanel): void {
    if (panel.kind === 'line') {
      this.drawLine(panel);
    } else if (panel.kind === 'overlay') {
      this.drawOverlay(panel);
    } else {
      this.drawHeatmap(panel);
    }
  }

  private drawLine(panel: IPanel): void {
    const bySeries = this.shown.scalars[panel.name];
    if (!bySeries) {
      return;
    }
    const view: ILineView = {
      smoothing: this.smoothing,
      logY: this.logY,
      x: this.xMode,
      compact: this.width(panel) < COMPACT_WIDTH
    };
    const keys = Object.keys(bySeries).sort(naturalCompare).join('\u0000');
    const drawn = JSON.stringify([keys, view]);
    const all = Object.keys(this.model.scalars[panel.name] ?? bySeries).sort(naturalCompare);
    const colorOf = (key: string): string => PALETTE[Math.max(0, all.indexOf(key)) % PALETTE.length];
    const points = onAxis(bySeries, this.model, this.xMode);
    const option = lineOption(panel.name, points, this.options.manySeries, view, colorOf);
    // what is drawn, for tests and for the curious: the x axis and the span of its points
    const xs = Object.values(points).flatMap(ps => ps.map(p => p[0]));
    Object.assign(panel.root.dataset, {
      xAxis: X_AXIS_NAMES[this.xMode],
      xRange: xs.length ? `${Math.min(...xs)},${Math.max(...xs)}` : ''
    });
    if (panel.drawn === drawn) {
      // same series and view: replace the data only, so the user's zoom survives
      panel.chart.setOption({ series: option.series }, { lazyUpdate: true });
    } else {
      panel.chart.setOption(option, { notMerge: true });
      panel.drawn = drawn;
    }
  }

  private drawHeatmap(panel: IPanel): void {
    const bySeries = this.shown.vectors[panel.name];
    if (!bySeries) {
      return;
    }
    const keys = Object.keys(bySeries).sort(naturalCompare);
    const select = panel.diff!;
    // the picker is rebuilt whenever the runs change, so a run that arrives late is offered too
    const pairs: [string, string][] = [];
    for (const a of keys) {
      for (const b of keys) {
        if (a !== b && pairs.length < 30) {
          pairs.push([a, b]);
        }
      }
    }
    const values = pairs.map(p => JSON.stringify(p));
    const current = select.value;
    if (select.options.length !== values.length + 1 || select.dataset.runs !== keys.join('\u0000')) {
      select.replaceChildren(el('option', '', 'difference of two runs: off'));
      select.options[0].value = '';
      for (const [i, [a, b]] of pairs.entries()) {
        const o = el('option', '', `difference: ${seriesLabel(a)} − ${seriesLabel(b)}`);
        o.value = values[i];
        select.append(o);
      }
      select.dataset.runs = keys.join('\u0000');
      select.value = values.includes(current) ? current : '';
    }
    select.style.display = keys.length > 1 ? '' : 'none';
    const diff = select.value ? (JSON.parse(select.value) as [string, string]) : null;
    const width = this.width(panel);
    const layout = heatmapLayout(keys.length + (diff ? 1 : 0), width);
    const height = `${layout.height}px`;
    if (panel.box.style.height !== height) {
      panel.box.style.height = height;
      panel.chart.resize();
    }
    panel.chart.setOption(heatmapOption(panel.name, bySeries, width, diff), { notMerge: true });
    panel.drawn = JSON.stringify([keys, width, diff]);
    // what is drawn, for tests and for the curious: runs, the shared colour scale, the index axis
    const [lo, hi] = sharedRange(bySeries);
    Object.assign(panel.root.dataset, {
      runs: keys.join(','),
      range: `${lo},${hi}`,
      axis: vectorAxisName(panel.name),
      diff: diff ? diff.join(',') : ''
    });
  }
}
