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

import { colorLookup } from './colors';
import type { IMetricsModel, IVectorSeries, Point, XAxisMode } from './data';
import {
  emptyModel,
  matchSeries,
  metricsCode,
  onAxis,
  seriesLabel,
  sharedRange,
  toCSV,
  truncatedText,
  vectorAxisName,
  X_AXIS_NAMES,
  withoutSeries
} from './data';
import { naturalCompare } from '../common/text';
import { ChartControls, IChartsState, axesToggle, controlStyle, showAxesToggle, toggledAxes } from './controls';
import { el, isDark } from '../common/dom';
export type { IChartsState } from './controls';
import { COMPACT_WIDTH, heatmapLayout, heatmapOption } from './heatmaps';
import type { ILineView, ITopK, YScale } from './lines';
import { lineChart } from './lines';

import type { IOverlay, IOverlayPick, OverlayAxes } from './overlay';
import {
  addPick,
  lineColorKey,
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
export type { ILineView, YScale } from './lines';
export { lineChart } from './lines';
export { COMPACT_WIDTH, heatmapLayout, heatmapOption } from './heatmaps';
export { assignColors, colorLookup } from './colors';

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
  /** series above which a chart has no legend and the tooltip lists the series nearest the pointer */
  manySeries?: number;
  /** the charts' initial theme (default: JupyterLab's body attribute) */
  dark?: boolean;
}

/** Summary line: topic, received reports and series. */
export function statusText(model: IMetricsModel): string {
  const received = model.received ?? 0;
  return `${model.topic}: ${received.toLocaleString()} reports, ${allSeriesKeys(model).length} series`;
}

/** Every series key of a model (scalars and vectors), in natural order: the keys colours are assigned over. */
export function allSeriesKeys(model: IMetricsModel): string[] {
  const keys = new Set<string>();
  for (const bySeries of [...Object.values(model.scalars), ...Object.values(model.vectors)]) {
    Object.keys(bySeries).forEach(k => keys.add(k));
  }
  return [...keys].sort(naturalCompare);
}

/**
 * What a chart's data looks like, cheaply: per series its length and its
 * first and last points.  Pushes that change none of it are not drawn.
 */
export function dataSignature(bySeries: { [series: string]: Point[] | IVectorSeries }): string {
  const parts: string[] = [];
  for (const key of Object.keys(bySeries).sort(naturalCompare)) {
    const s = bySeries[key];
    if (Array.isArray(s)) {
      parts.push(`${key}:${s.length}:${s[0]?.join()}:${s[s.length - 1]?.join()}`);
    } else {
      const last = s.rows[s.rows.length - 1];
      parts.push(`${key}:${s.steps.length}:${s.steps[0]}:${s.steps[s.steps.length - 1]}:${last?.join()}`);
    }
  }
  return parts.join('|');
}

interface IPanel {
  kind: 'line' | 'heat' | 'overlay';
  name: string;
  root: HTMLElement;
  box: HTMLElement;
  chart: echarts.EChartsType;
  /** what the last full draw depended on (series keys, layout, view) */
  drawn: string;
  /** the data and view last drawn: a push that changes neither draws nothing */
  data: string;
  /** the pointer's y (data units) while it is over the chart: the tooltip lists the nearest series */
  pointerY: number | null;
  /** how often its data was drawn (tests read it as data-draws: pushes that change nothing draw nothing) */
  draws: number;
  /** line charts: the series keys last drawn (after the filter and top-k) */
  keys: string[];
  /** heatmaps: the "difference of two runs" picker */
  diff?: HTMLSelectElement;
  /** the overlay: the "two axes" toggle (shown when its metrics are of two units) */
  twoAxes?: HTMLButtonElement;
}

function download(filename: string, blob: Blob): void {
  const url = URL.createObjectURL(blob);
  const a = el('a');
  a.href = url;
  a.download = filename;
  a.click();
  window.setTimeout(() => URL.revokeObjectURL(url), 1000);
}

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
  /** the toolbar's view choices: smoothing, y scale, x axis, top-k, series filter */
  private readonly controls: ChartControls;
  private colorOf: (key: string) => string = colorLookup([]);
  private colorKeys = '';
  private hidden: string[] = [];
  private frame = 0;
  private redraws = 0;
  private themeFrame = 0;
  private readonly resized = new Set<Element>();
  /** the overlay: chosen metrics, the models of other topics they come from, and what else could be chosen */
  private picks: IOverlayPick[] = [];
  private overlayAxes: OverlayAxes = 'auto';
  private readonly sources = new Map<string, IMetricsModel>();
  private catalog: { topic: string; scalars: string[]; cluster?: string }[] = [];
  private readonly overlayAdd: HTMLSelectElement;
  private readonly overlayAxesSelect: HTMLSelectElement;
  private readonly overlayPicks: HTMLElement;
  /** Called after the user changed a choice of the toolbar or the overlay (viewState). */
  onViewState: ((state: IChartsState) => void) | null = null;
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
    this.controls = new ChartControls(() => this.changed());
    const csv = el('button', 'jc-export-csv', 'CSV');
    csv.title = 'Download the drawn data as CSV';
    csv.addEventListener('click', () =>
      download(`${this.model.topic || 'metrics'}.csv`, new Blob([toCSV(this.shown)], { type: 'text/csv' }))
    );
    const copy = el('button', 'jc-copy-code', 'copy code');
    copy.title = 'Copy the notebook code that loads the full history as a DataFrame';
    copy.addEventListener('click', () => void this.copyCode(copy));
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
      "The overlay's y axes: one (the default), two (by unit: the first on the left), or each metric scaled to 0-1";
    this.overlayAxesSelect.style.cssText = 'font-size: 11px;';
    for (const [value, label] of [
      ['auto', 'axes: one (auto)'],
      ['shared', 'one axis'],
      ['dual', 'two axes'],
      ['normalised', 'scaled 0–1']
    ]) {
      const o = el('option', '', label);
      o.value = value;
      this.overlayAxesSelect.append(o);
    }
    this.overlayAxesSelect.addEventListener('change', () =>
      this.setOverlayAxes(this.overlayAxesSelect.value as OverlayAxes)
    );
    this.overlayPicks = el('span', 'jc-overlay-picks');
    this.overlayPicks.style.cssText = 'display: contents;';
    this.toolbar.append(...this.controls.nodes, csv, copy, this.overlayAdd, this.overlayPicks, this.overlayAxesSelect);

    this.grid = el('div', 'jc-metrics-grid');
    this.grid.style.cssText =
      'display: grid; grid-template-columns: repeat(auto-fill, minmax(min(100%, 360px), 1fr)); gap: 8px;';
    this.node.append(this.status, this.toolbar, this.grid);
    this.styleControls();
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

  /** The user's choice of the overlay's axes (the toolbar's menu or the chart's toggle). */
  private setOverlayAxes(axes: OverlayAxes): void {
    this.overlayAxes = axes;
    this.overlayAxesSelect.value = axes;
    this.changed();
  }

  private setPicks(picks: IOverlayPick[]): void {
    this.picks = picks;
    this.onOverlayTopics?.(pickTopics(picks, this.model.topic));
    this.onOverlayKept?.(pickKept(picks));
    this.changed();
  }

  /** The toolbar's choices and the overlay's picks (a host keeps them, e.g. across a re-rendered output). */
  get viewState(): IChartsState {
    return { ...this.controls.state, picks: this.picks, overlayAxes: this.overlayAxes };
  }

  /** Restore choices from viewState (unknown or missing ones stay as they are). */
  setViewState(state: Partial<IChartsState>): void {
    this.controls.set(state);
    if (state.overlayAxes) {
      this.overlayAxes = state.overlayAxes;
      this.overlayAxesSelect.value = state.overlayAxes;
    }
    if (Array.isArray(state.picks)) {
      this.picks = state.picks.map(p => parsePick(pickKey(p))).filter((p): p is IOverlayPick => p !== null);
      this.onOverlayTopics?.(pickTopics(this.picks, this.model.topic));
      this.onOverlayKept?.(pickKept(this.picks));
    }
    this.redraw();
  }

  /** A choice of the user's: redraw, and tell the host. */
  private changed(): void {
    this.redraw();
    this.onViewState?.(this.viewState);
  }

  /** Switch between the dark and the light look; existing charts are re-styled. */
  setDark(dark: boolean): void {
    if (dark === this.dark) {
      return;
    }
    this.dark = dark;
    this.node.dataset.theme = dark ? 'dark' : 'light';
    this.styleControls();
    // the theme's palette now, so that a host's series list can re-colour its swatches at once
    const keys = allSeriesKeys(this.model);
    this.colorKeys = `${dark}\u0000${keys.join('\u0000')}`;
    this.colorOf = colorLookup(keys, dark);
    // chart.setTheme() leaves components already laid out in the old colours:
    // draw each chart anew in the new theme, in the next frame (while JupyterLab
    // swaps its theme's CSS the boxes may measure 0 for a moment)
    window.cancelAnimationFrame(this.themeFrame);
    this.themeFrame = window.requestAnimationFrame(() => {
      this.panels.forEach(p => {
        p.chart.dispose();
        p.chart = echarts.init(p.box, this.dark ? 'dark' : undefined, { renderer: 'canvas' });
        p.drawn = '';
        p.data = '';
        this.track(p);
      });
      this.redraw(); // in the theme's palette
    });
  }

  private get smoothing(): number {
    return this.controls.smoothing;
  }

  private get yScale(): YScale {
    return this.controls.yScale;
  }

  private get xMode(): XAxisMode {
    return this.controls.x;
  }

  private get topK(): ITopK | null {
    return this.controls.topK;
  }

  private get filter(): string {
    return this.controls.filter;
  }

  /** The series the line charts draw now (after the filter and top-k), in natural order. */
  drawnSeries(): string[] {
    const keys = new Set<string>();
    this.panels.forEach(p => {
      if (p.kind === 'line') {
        p.keys.forEach(k => keys.add(k));
      }
    });
    return [...keys].sort(naturalCompare);
  }

  /** The colour of a series key in every chart of this topic (for a series list's swatches). */
  seriesColor(key: string): string {
    return this.colorOf(key);
  }

  /** The toolbar's buttons, menus and inputs in the theme's colours. */
  private styleControls(): void {
    const style = controlStyle(this.dark);
    this.toolbar.querySelectorAll('button, select, input[type="search"]').forEach(c => {
      const keep = (c as HTMLElement).style.display;
      const width = (c as HTMLElement).style.maxWidth || (c as HTMLElement).style.width;
      (c as HTMLElement).style.cssText = style;
      (c as HTMLElement).style.display = keep;
      if (width) {
        (c as HTMLElement).style.maxWidth = width;
      }
    });
    this.overlayPicks.style.cssText = 'display: contents;';
    // the charts' own controls: the heatmaps' difference pickers and the overlay's axes toggle
    this.grid.querySelectorAll<HTMLElement>('select.jc-diff, button.jc-overlay-two-axes').forEach(c => {
      const { display, fontWeight } = c.style;
      c.style.cssText = `${style} margin-bottom: 2px; max-width: 100%;`;
      Object.assign(c.style, { display, fontWeight });
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
    // how often the charts were gone through (tests read data-redraws: a push of other news must not count)
    this.node.dataset.redraws = String(++this.redraws);
    const model = matchSeries(withoutSeries(this.model, this.hidden), this.filter);
    this.shown = model;
    // one colour per series key over the whole topic, whichever series are hidden or filtered
    const keys = allSeriesKeys(this.model);
    const signature = `${this.dark}\u0000${keys.join('\u0000')}`;
    if (signature !== this.colorKeys) {
      this.colorKeys = signature;
      this.colorOf = colorLookup(keys, this.dark);
      this.panels.forEach(p => (p.data = ''));
    }
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
      logY: this.yScale === 'log',
      x: this.xMode,
      compact: this.width(panel) < COMPACT_WIDTH
    };
    const width = this.width(panel);
    const data = JSON.stringify([
      overlay.lines.map(l => [l.id, l.axis, l.points.length, l.points[0], l.points[l.points.length - 1]]),
      overlay.axes,
      view,
      width
    ]);
    showAxesToggle(panel.twoAxes!, overlay.units, overlay.axes);
    if (panel.data === data) {
      return; // nothing this chart shows changed: no redraw
    }
    panel.data = data;
    panel.root.dataset.draws = String(++panel.draws);
    // a line's colour is its run's, as in the topic's own charts (the overlay's own topic uses its colours)
    const own = this.colorOf;
    const others = colorLookup(overlay.lines.map(lineColorKey), this.dark);
    const option = overlayOption(overlay, { ...view, width }, line =>
      !line.cluster && line.metric.startsWith(`${this.model.topic}/`) ? own(line.series) : others(lineColorKey(line))
    );
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
      units: String(overlay.units),
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
      diff.style.cssText = `${controlStyle(this.dark)} margin-bottom: 2px; max-width: 100%;`;
      diff.addEventListener('change', () => {
        const p = this.panels.get(id);
        if (p) {
          this.draw(p);
        }
      });
      root.appendChild(diff);
    }
    let twoAxes: HTMLButtonElement | undefined;
    if (kind === 'overlay') {
      twoAxes = axesToggle(this.dark, () => this.setOverlayAxes(toggledAxes(this.overlayAxes)));
      root.appendChild(twoAxes);
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
    const panel: IPanel = {
      kind,
      name,
      root,
      box,
      chart,
      drawn: '',
      data: '',
      pointerY: null,
      draws: 0,
      keys: [],
      diff,
      twoAxes
    };
    this.track(panel);
    this.panels.set(id, panel);
    this.resizer?.observe(box);
    return panel;
  }

  /** Keep the pointer's y in data units (the many-series tooltip lists the series nearest it). */
  private track(panel: IPanel): void {
    if (panel.kind !== 'line') {
      return;
    }
    const zr = panel.chart.getZr();
    zr.on('mousemove', e => {
      const y = panel.chart.convertFromPixel({ gridIndex: 0 }, [e.offsetX, e.offsetY]) as number[] | undefined;
      panel.pointerY = y && Number.isFinite(y[1]) ? y[1] : null;
    });
    zr.on('globalout', () => {
      panel.pointerY = null;
    });
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
    const width = this.width(panel);
    const view: ILineView = {
      smoothing: this.smoothing,
      yScale: this.yScale,
      x: this.xMode,
      compact: width < COMPACT_WIDTH,
      width,
      topK: this.topK
    };
    const data = JSON.stringify([dataSignature(bySeries), view]);
    if (panel.data === data) {
      return; // nothing this chart shows changed: no redraw
    }
    panel.data = data;
    panel.root.dataset.draws = String(++panel.draws);
    const points = onAxis(bySeries, this.model, this.xMode);
    const line = lineChart(panel.name, points, view, this.colorOf, this.options.manySeries, () => panel.pointerY);
    const drawn = JSON.stringify([line.keys, { ...view, width: line.legend }, line.notice]);
    panel.keys = line.keys;
    // what is drawn, for tests and for the curious: the x axis and its span, the series, what log y dropped
    const xs = Object.values(points).flatMap(ps => ps.map(p => p[0]));
    Object.assign(panel.root.dataset, {
      xAxis: X_AXIS_NAMES[this.xMode],
      xRange: xs.length ? `${Math.min(...xs)},${Math.max(...xs)}` : '',
      series: line.keys.join('|'),
      colors: line.keys.map(k => this.colorOf(k)).join('|'),
      yScale: this.yScale,
      logDropped: String(Object.values(line.dropped).reduce((a, b) => a + b, 0)),
      notice: line.notice,
      legend: String(line.legend)
    });
    if (panel.drawn === drawn) {
      // same series and view: replace the data only, so the user's zoom survives
      panel.chart.setOption({ series: line.option.series }, { lazyUpdate: true });
    } else {
      panel.chart.setOption(line.option, { notMerge: true });
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
    const data = JSON.stringify([dataSignature(bySeries), width, diff]);
    if (panel.data === data) {
      return; // nothing this chart shows changed: no redraw
    }
    panel.data = data;
    panel.root.dataset.draws = String(++panel.draws);
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
