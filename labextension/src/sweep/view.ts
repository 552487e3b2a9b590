/**
 * The sweep table and its comparison charts in one box: used by the notebook
 * widget (sweepWidget.ts, bundled to jupyter_cluster/widgets/static/sweep.js)
 * and by the main-area view of the sidebar.
 *
 * A table of one row per item/run (config, final and best metrics), sorted
 * by a click on a column's header and filtered by the box above it
 * ("lr>0.01 aux=on"); ticked rows are overlaid on the curves chart (none
 * ticked: every row shown); "group by" draws each config value's mean ± sd
 * band instead; the parallel-coordinates chart maps config to the metric.
 * A row's swatch is its colour in the curves chart, in the parallel
 * coordinates (unless "lines by" is the metric's scale) and, where the row's
 * curve is a series of a metrics topic ("trial=3"), in that topic's charts,
 * the notebook's and the sidebar's (model.ts sweepColors()).
 */
import * as echarts from 'echarts/core';
import { LineChart, ParallelChart } from 'echarts/charts';
import {
  DataZoomComponent,
  GridComponent,
  LegendComponent,
  ParallelComponent,
  TitleComponent,
  TooltipComponent,
  VisualMapComponent
} from 'echarts/components';
import { CanvasRenderer } from 'echarts/renderers';

import { controlStyle } from '../charts/controls';
import { el } from '../common/dom';
import type { IColumn, ISweep } from './model';
import type { ConfigValue, ISweepRow } from './rows';
import {
  cellText,
  cellValue,
  columns,
  configKeys,
  curvesOption,
  filterKeys,
  filterProblems,
  filterRows,
  metricKeys,
  groupKeys,
  groupRows,
  rowColorKey,
  sortRows,
  sweepColors
} from './model';
import { bestFirstDescending, bestRowIds, defaultMetric } from './direction';
import { filterExample, filterHelp } from './filter';
import { meanText } from './groups';
import { columnNotation } from './notation';
import { axisSwitches, parallelColours, parallelOption, switchedKinds } from './parallel';
import type { AxisKind } from './axes';
import { AxisSwitch } from './axisSwitch';

echarts.use([
  LineChart,
  ParallelChart,
  GridComponent,
  LegendComponent,
  ParallelComponent,
  TitleComponent,
  TooltipComponent,
  VisualMapComponent,
  DataZoomComponent,
  CanvasRenderer
]);

/** Rows drawn on the curves chart when none is ticked (the first in the table's order). */
export const MAX_DEFAULT_CURVES = 30;

/** What the user chose (kept by the notebook widget, so a re-rendered output keeps it). */
export interface ISweepViewState {
  sortBy: string | null;
  descending: boolean;
  filter: string;
  groupBy: string;
  metric: string;
  selected: string[];
  /** the parallel coordinates' lines: each row's colour ('row'), or the metric's value on a scale ('metric') */
  parallelBy?: 'row' | 'metric';
  /** the parallel axes the user switched to another scale (key -> log, category or linear) */
  axes?: { [key: string]: AxisKind };
}

export class SweepView {
  /** Called after the user changed the sort, filter, grouping, metric or ticked rows. */
  onState: ((state: ISweepViewState) => void) | null = null;
  readonly node: HTMLElement;
  private sweep: ISweep = { rows: [], curves: {} };
  private dark: boolean;
  private sortBy: string | null = null;
  private descending = false;
  private filter = '';
  private groupBy = '';
  private metric = '';
  private parallelBy: 'row' | 'metric' = 'row';
  /** the scales the user picked for parallel axes (the others follow their values) */
  private axisKinds: { [key: string]: AxisKind } = {};
  private readonly axisSwitch = new AxisSwitch();
  /** the rows the parallel coordinates' brush keeps (their ids), or null: no brush */
  private brushed: Set<string> | null = null;
  /** the row under the pointer (in the table, a curve or a line): highlighted in every view */
  private hovered: string | null = null;
  private readonly problem = el('div', 'jc-sweep-filter-problem');
  private readonly selected = new Set<string>();
  private readonly status = el('div', 'jc-sweep-status');
  private readonly filterInput = el('input', 'jc-sweep-filter');
  private readonly metricSelect = el('select', 'jc-sweep-metric');
  private readonly groupSelect = el('select', 'jc-sweep-group');
  /** a second grouping key ("group by lr and aux") */
  private readonly groupSelect2 = el('select', 'jc-sweep-group2');
  /** the groups shown expanded (their labels) */
  private readonly expanded = new Set<string>();
  private readonly parallelSelect = el('select', 'jc-sweep-parallel-by');
  private readonly clearButton = el('button', 'jc-sweep-clear', 'clear selection');
  private readonly table = el('table', 'jc-sweep-table');
  private readonly curvesBox = el('div', 'jc-sweep-curves');
  private readonly parallelBox = el('div', 'jc-sweep-parallel');
  private curves: echarts.EChartsType | null = null;
  private parallel: echarts.EChartsType | null = null;
  private readonly resizer: ResizeObserver | null;
  private drawn = { table: '', curves: '', parallel: '' };

  constructor(host: HTMLElement, options: { dark?: boolean; height?: number } = {}) {
    this.dark = !!options.dark;
    this.node = el('div', 'jc-sweep');
    this.node.style.cssText = 'font-size: 12px; color: var(--jp-ui-font-color1, inherit);';
    const tools = el('div', 'jc-sweep-toolbar');
    tools.style.cssText = 'display: flex; flex-wrap: wrap; gap: 4px 10px; align-items: center; margin: 4px 0;';
    this.filterInput.type = 'search';
    // placeholder and title name this table's keys (render()): an example that matches, never 0 rows
    this.filterInput.placeholder = 'filter';
    this.filterInput.title = filterHelp([]);
    this.filterInput.addEventListener('input', () => {
      this.filter = this.filterInput.value;
      this.changed();
    });
    this.metricSelect.title = 'The metric the charts draw';
    this.metricSelect.addEventListener('change', () => {
      this.metric = this.metricSelect.value;
      this.changed();
    });
    this.groupSelect.title = "Group the curves by a config key's value: each group's mean ± one standard deviation";
    this.groupSelect.addEventListener('change', () => {
      const second = groupKeys(this.groupBy)[1];
      this.groupBy = [this.groupSelect.value, this.groupSelect.value ? second : ''].filter(k => k).join(',');
      this.expanded.clear();
      this.changed();
    });
    this.groupSelect2.title = 'Group by a second key too: a group per combination (e.g. per lr and aux, over seeds)';
    this.groupSelect2.addEventListener('change', () => {
      const first = groupKeys(this.groupBy)[0] ?? '';
      this.groupBy = [first, this.groupSelect2.value].filter(k => k).join(',');
      this.expanded.clear();
      this.changed();
    });
    this.parallelSelect.title =
      "The parallel coordinates' lines: each in its row's colour (as its swatch and curve), or on the metric's colour scale";
    this.parallelSelect.addEventListener('change', () => {
      this.parallelBy = this.parallelSelect.value === 'metric' ? 'metric' : 'row';
      this.changed();
    });
    this.clearButton.addEventListener('click', () => {
      this.selected.clear();
      this.changed();
    });
    const metricLabel = el('label', '', 'metric ');
    metricLabel.append(this.metricSelect);
    const groupLabel = el('label', '', 'group by ');
    groupLabel.append(this.groupSelect, ' and ', this.groupSelect2);
    const parallelLabel = el('label', '', 'lines by ');
    parallelLabel.append(this.parallelSelect);
    this.axisSwitch.onChange = (key, kind) => {
      this.axisKinds = { ...this.axisKinds, [key]: kind };
      this.changed();
    };
    tools.append(this.filterInput, metricLabel, groupLabel, parallelLabel, this.axisSwitch.node, this.clearButton);
    this.problem.style.cssText = 'color: var(--jp-error-color1, #d32f2f); margin: 2px 0; display: none;';
    const charts = el('div', 'jc-sweep-charts');
    charts.style.cssText =
      'display: grid; grid-template-columns: repeat(auto-fill, minmax(min(100%, 380px), 1fr)); gap: 8px;';
    const height = options.height ?? 280;
    for (const box of [this.curvesBox, this.parallelBox]) {
      box.style.cssText = `width: 100%; height: ${height}px; min-width: 0;`;
    }
    charts.append(this.curvesBox, this.parallelBox);
    const scroller = el('div', 'jc-sweep-table-box');
    scroller.style.cssText = 'max-height: 340px; overflow: auto; margin-top: 6px;';
    this.table.style.cssText = 'border-collapse: collapse; font-size: 11px; white-space: nowrap;';
    scroller.append(this.table);
    this.status.style.cssText = 'margin: 2px 0;';
    this.node.append(this.status, tools, this.problem, charts, scroller);
    host.appendChild(this.node);
    // reachable from the page (tests, the browser console): node.jcSweepView.brush('lr', [0.0005, 0.002])
    Object.defineProperty(this.node, 'jcSweepView', { value: this, enumerable: false });
    this.style();
    this.resizer =
      typeof ResizeObserver !== 'undefined'
        ? new ResizeObserver(() => {
            this.curves?.resize();
            this.parallel?.resize();
            this.render(); // the legend's rows follow the width
          })
        : null;
    this.resizer?.observe(this.curvesBox);
  }

  /** Draw a new sweep (rows and curves); the user's sort, filter, grouping and ticks stay. */
  update(sweep: ISweep): void {
    this.sweep = sweep;
    const ids = new Set(sweep.rows.map(r => r.id));
    if (sweep.rows.length) {
      [...this.selected].forEach(id => !ids.has(id) && this.selected.delete(id));
    }
    this.render();
  }

  /** Switch between the dark and the light look. */
  setDark(dark: boolean): void {
    if (dark === this.dark) {
      return;
    }
    this.dark = dark;
    this.style();
    this.curves?.dispose();
    this.parallel?.dispose();
    this.curves = this.parallel = null;
    this.drawn = { table: '', curves: '', parallel: '' };
    this.render();
    // charts made again while the theme's styles apply were laid out at a passing size: lay them out once settled
    requestAnimationFrame(() => {
      this.curves?.resize();
      this.parallel?.resize();
    });
  }

  /** The user's choices now. */
  get state(): ISweepViewState {
    return {
      sortBy: this.sortBy,
      descending: this.descending,
      filter: this.filter,
      groupBy: this.groupBy,
      metric: this.metric,
      selected: [...this.selected],
      parallelBy: this.parallelBy,
      axes: { ...this.axisKinds }
    };
  }

  /** Restore choices (e.g. those of an earlier view of the same widget). */
  setState(state: Partial<ISweepViewState>): void {
    this.sortBy = state.sortBy ?? this.sortBy;
    this.descending = state.descending ?? this.descending;
    this.filter = state.filter ?? this.filter;
    this.filterInput.value = this.filter;
    this.groupBy = state.groupBy ?? this.groupBy;
    this.metric = state.metric ?? this.metric;
    this.parallelBy = state.parallelBy === 'metric' ? 'metric' : state.parallelBy === 'row' ? 'row' : this.parallelBy;
    this.axisKinds = state.axes ?? this.axisKinds;
    if (state.selected) {
      this.selected.clear();
      state.selected.forEach(id => this.selected.add(id));
    }
    this.render();
  }

  /** Select rows by id (as a click on their boxes would). */
  select(ids: string[]): void {
    ids.forEach(id => this.selected.add(id));
    this.render();
  }

  dispose(): void {
    this.resizer?.disconnect();
    this.curves?.dispose();
    this.parallel?.dispose();
    this.node.remove();
  }

  private changed(): void {
    this.render();
    this.onState?.(this.state);
  }

  private style(): void {
    this.node.dataset.theme = this.dark ? 'dark' : 'light';
    for (const c of [
      this.filterInput,
      this.metricSelect,
      this.groupSelect,
      this.groupSelect2,
      this.parallelSelect,
      this.clearButton
    ]) {
      c.style.cssText = controlStyle(this.dark);
    }
    this.axisSwitch.style(this.dark);
    this.filterInput.style.width = '14em';
  }

  private render(): void {
    const sweep = this.sweep;
    const metrics = metricKeys(sweep);
    // (no rows yet: the choices restored from an earlier view are kept for when they come)
    if (!metrics.includes(this.metric) && sweep.rows.length) {
      this.metric = defaultMetric(metrics); // a loss before an accuracy: what a sweep minimises
    }
    const keys = configKeys(sweep.rows);
    if (groupKeys(this.groupBy).some(k => !keys.includes(k)) && sweep.rows.length) {
      this.groupBy = groupKeys(this.groupBy)
        .filter(k => keys.includes(k))
        .join(',');
    }
    const [group1 = '', group2 = ''] = groupKeys(this.groupBy);
    this.options(
      this.metricSelect,
      metrics.map(m => [m, m] as [string, string]),
      this.metric
    );
    this.options(this.groupSelect, [['', 'none'], ...keys.map(k => [k, k] as [string, string])], group1);
    this.options(
      this.groupSelect2,
      [['', '—'], ...keys.filter(k => k !== group1).map(k => [k, k] as [string, string])],
      group2
    );
    this.groupSelect2.style.display = group1 ? '' : 'none';
    this.options(
      this.parallelSelect,
      [
        ['row', 'row colour'],
        ['metric', 'metric scale']
      ],
      this.parallelBy
    );
    const cols = columns(sweep);
    const col = cols.find(c => c.id === this.sortBy) ?? null;
    const keysForFilter = filterKeys(sweep.rows);
    const example = filterExample(sweep.rows);
    this.filterInput.placeholder = example ? `filter: ${example}` : 'filter';
    this.filterInput.title = filterHelp(keysForFilter, example);
    const problems = filterProblems(sweep.rows, this.filter);
    this.problem.textContent = problems.join(' ');
    this.problem.style.display = problems.length ? '' : 'none';
    this.node.dataset.filterProblem = problems.join(' ');
    const filtered = sortRows(filterRows(sweep.rows, this.filter), col, this.descending);
    // the parallel coordinates' brush narrows the table and the curves (linked views)
    const brushed = this.brushed;
    const rows = brushed ? filtered.filter(r => brushed.has(r.id)) : filtered;
    const ticked = rows.filter(r => this.selected.has(r.id));
    const drawn = ticked.length ? ticked : rows.slice(0, MAX_DEFAULT_CURVES);
    // one colour per row (or group) in the table, the curves and the parallel coordinates
    const colorOf = sweepColors(sweep, this.dark, this.groupBy || null, filtered);
    this.status.textContent =
      `${sweep.title ? `${sweep.title}: ` : ''}${rows.length} of ${sweep.rows.length} rows` +
      (ticked.length ? `, ${ticked.length} selected` : '') +
      (this.groupBy ? `, grouped by ${groupKeys(this.groupBy).join(' and ')}` : '');
    this.clearButton.style.display = this.selected.size ? '' : 'none';
    this.renderTable(cols, rows, colorOf);
    Object.assign(this.node.dataset, {
      rows: String(rows.length),
      order: rows.map(r => r.id).join('|'),
      selected: ticked.map(r => r.id).join('|'),
      groupBy: this.groupBy
    });
    if (!this.metric) {
      return;
    }
    const width = this.curvesBox.clientWidth || 480;
    const curves = curvesOption(sweep, drawn, this.metric, colorOf, this.groupBy || null, width);
    const signature = JSON.stringify([
      this.metric,
      this.groupBy,
      drawn.map(r => r.id),
      sweep.colorKeys,
      sweep.curves[this.metric],
      curves.legend && (curves.option.grid as { bottom: number }).bottom
    ]);
    if (signature !== this.drawn.curves) {
      this.drawn.curves = signature;
      if (!this.curves) {
        this.curves = echarts.init(this.curvesBox, this.dark ? 'dark' : undefined, { renderer: 'canvas' });
        // a curve under the pointer marks its row (and its line)
        this.curves.on('mouseover', (p: { seriesName?: string }) => {
          const row = this.sweep.rows.find(r => r.name === p.seriesName);
          this.hoverRow(row?.id ?? null, 'curves');
        });
        this.curves.on('mouseout', () => this.hoverRow(null, 'curves'));
      }
      this.curves.setOption(curves.option, { notMerge: true });
      this.curvesBox.dataset.lines = curves.lines.join('|');
      this.curvesBox.dataset.legend = String(curves.legend);
    }
    const parallelRows = filtered.filter(r => typeof r.final[this.metric] === 'number');
    const byRow = this.parallelBy === 'row';
    const rowColor = (r: ISweepRow): string => colorOf(rowColorKey(r, this.groupBy || null));
    const switches = axisSwitches(parallelRows, this.metric, this.axisKinds);
    this.axisSwitch.update(switches);
    const kinds = switchedKinds(switches);
    const psig = JSON.stringify([
      this.metric,
      parallelRows,
      byRow && parallelRows.map(rowColor),
      [...this.selected],
      kinds
    ]);
    if (psig !== this.drawn.parallel) {
      this.drawn.parallel = psig;
      if (!this.parallel) {
        this.parallel = echarts.init(this.parallelBox, this.dark ? 'dark' : undefined, { renderer: 'canvas' });
        this.linkParallel(this.parallel);
      }
      this.brushed = null; // a redrawn chart has no brush
      this.node.dataset.brushed = '';
      const option = parallelOption(
        parallelRows,
        this.metric,
        this.dark,
        byRow ? rowColor : null,
        this.selected,
        kinds
      );
      this.parallel.setOption(option, { notMerge: true });
      this.parallelRows = parallelRows;
      // each axis's scale (log for decades, categories for few values), for tests and the reader
      this.parallelBox.dataset.axes = ((option.parallelAxis as { name: string; axisKind: string }[]) ?? [])
        .map(a => `${a.name}:${a.axisKind}`)
        .join('|');
      this.parallelBox.dataset.lines = String(parallelRows.length);
      this.parallelBox.dataset.by = this.parallelBy;
      // each line's colour (by row), for tests
      this.parallelBox.dataset.colors = byRow ? parallelRows.map(rowColor).join('|') : '';
      // the colour scale drawn (the theme's): tests read it after a theme change
      this.parallelBox.dataset.scale = parallelColours(this.dark).join('|');
    }
  }

  private parallelRows: ISweepRow[] = [];

  /** The parallel coordinates' brush and hover reach the table and the curves (and back: hoverRow()). */
  private linkParallel(chart: echarts.EChartsType): void {
    chart.on('axisareaselected', () => {
      const model = (
        chart as unknown as {
          getModel(): { getSeries(): { getRawIndicesByActiveState(s: string): number[] }[] };
        }
      ).getModel();
      const series = model.getSeries()[0];
      if (!series) {
        return;
      }
      const active = series.getRawIndicesByActiveState('active');
      const ids = active.map(i => this.parallelRows[i]?.id).filter((id): id is string => !!id);
      this.brushed = ids.length === this.parallelRows.length ? null : new Set(ids);
      this.node.dataset.brushed = this.brushed ? ids.join('|') : '';
      this.render();
    });
    chart.on('mouseover', (p: { dataIndex?: number }) => {
      const row = typeof p.dataIndex === 'number' ? this.parallelRows[p.dataIndex] : undefined;
      this.hoverRow(row?.id ?? null, 'parallel');
    });
    chart.on('mouseout', () => this.hoverRow(null, 'parallel'));
  }

  /**
   * Brush a parallel-coordinates axis to `[lo, hi]` (as a drag along it does):
   * the table and the curves keep the rows whose lines pass through.
   */
  brush(key: string, interval: [number, number]): void {
    if (!this.parallel) {
      return;
    }
    const axes = (this.parallel.getOption().parallelAxis ?? []) as { name?: string }[];
    const index = axes.findIndex(a => a.name === key);
    if (index < 0) {
      return;
    }
    this.parallel.dispatchAction({
      type: 'axisAreaSelect',
      parallelAxisIndex: index,
      intervals: [interval]
    });
  }

  /** Highlight one row everywhere: its table row, its line in the parallel coordinates, its curve. */
  hoverRow(id: string | null, from: 'table' | 'parallel' | 'curves' = 'table'): void {
    if (id === this.hovered) {
      return;
    }
    const before = this.hovered;
    this.hovered = id;
    this.node.dataset.hovered = id ?? '';
    this.table.querySelectorAll('tr.jc-sweep-row').forEach(tr => {
      const on = (tr as HTMLElement).dataset.id === id;
      tr.classList.toggle('jc-sweep-hovered', on);
      (tr as HTMLElement).style.outline = on ? '2px solid var(--jp-brand-color1, #1976d2)' : '';
    });
    if (from !== 'parallel' && this.parallel) {
      const index = (rid: string | null): number =>
        rid === null ? -1 : this.parallelRows.findIndex(r => r.id === rid);
      if (index(before) >= 0) {
        this.parallel.dispatchAction({ type: 'downplay', seriesIndex: 0, dataIndex: index(before) });
      }
      if (index(id) >= 0) {
        this.parallel.dispatchAction({ type: 'highlight', seriesIndex: 0, dataIndex: index(id) });
      }
    }
    if (from !== 'curves' && this.curves) {
      const name = (rid: string | null): string | undefined => this.sweep.rows.find(r => r.id === rid)?.name;
      if (before !== null && name(before)) {
        this.curves.dispatchAction({ type: 'downplay', seriesName: name(before) });
      }
      if (id !== null && name(id)) {
        this.curves.dispatchAction({ type: 'highlight', seriesName: name(id) });
      }
    }
  }

  private options(select: HTMLSelectElement, choices: [string, string][], value: string): void {
    const signature = JSON.stringify(choices);
    if (select.dataset.choices !== signature) {
      select.dataset.choices = signature;
      select.replaceChildren(
        ...choices.map(([v, label]) => {
          const o = el('option', '', label);
          o.value = v;
          return o;
        })
      );
    }
    select.value = value;
  }

  private renderTable(cols: IColumn[], rows: ISweepRow[], colorOf: (key: string) => string): void {
    const signature = JSON.stringify([
      cols,
      rows,
      [...this.selected],
      this.sortBy,
      this.descending,
      this.groupBy,
      [...this.expanded],
      rows.map(r => colorOf(rowColorKey(r, this.groupBy || null)))
    ]);
    if (signature === this.drawn.table) {
      return;
    }
    this.drawn.table = signature;
    const border = `1px solid var(--jp-border-color2, ${this.dark ? '#444' : '#ddd'})`;
    const head = el('tr');
    const pick = el('th', '', '');
    head.append(pick);
    for (const c of cols) {
      const arrow = this.sortBy === c.id ? (this.descending ? ' ▼' : ' ▲') : '';
      const th = el('th', 'jc-sweep-col', c.label + arrow);
      th.dataset.col = c.id;
      th.title = `Sort by ${c.label} (click again to reverse)`;
      th.style.cssText = `cursor: pointer; text-align: left; padding: 2px 6px; border-bottom: ${border}; position: sticky; top: 0; background: var(--jp-layout-color1, ${this.dark ? '#111' : '#fff'});`;
      th.addEventListener('click', () => {
        // a metric's first click puts its best first: lowest for a loss, highest for an accuracy
        this.descending =
          this.sortBy === c.id
            ? !this.descending
            : c.kind === 'final' || c.kind === 'best'
              ? bestFirstDescending(c.key)
              : false;
        this.sortBy = c.id;
        this.changed();
      });
      head.append(th);
    }
    // one notation per column (notation.ts): 1e-4 … 1e-2 all with exponents, over every row of the sweep
    const formats = new Map(cols.map(c => [c.id, columnNotation(this.sweep.rows.map(r => cellValue(r, c)))] as const));
    const cellIn = (c: IColumn, v: ConfigValue | undefined): string =>
      typeof v === 'number' && Number.isFinite(v) && c.kind !== 'duration' ? formats.get(c.id)!(v) : cellText(v);
    // each metric's best run (lowest final loss, highest final accuracy) over the rows shown: its cell marked ★
    const best = bestRowIds(rows, [...new Set(cols.filter(c => c.kind === 'final').map(c => c.key))]);
    this.table.dataset.best = [...best].map(([m, id]) => `${m}:${id}`).join('|');
    const rowNode = (r: ISweepRow): HTMLElement => {
      const tr = el('tr', 'jc-sweep-row');
      tr.dataset.id = r.id;
      tr.addEventListener('mouseenter', () => this.hoverRow(r.id, 'table'));
      tr.addEventListener('mouseleave', () => this.hoverRow(null, 'table'));
      if (this.selected.has(r.id)) {
        tr.classList.add('jc-sweep-ticked');
        tr.style.fontWeight = '600';
      }
      const box = el('input');
      box.type = 'checkbox';
      box.checked = this.selected.has(r.id);
      box.title = 'Overlay this row’s curves';
      box.addEventListener('change', () => {
        if (box.checked) {
          this.selected.add(r.id);
        } else {
          this.selected.delete(r.id);
        }
        this.changed();
      });
      const swatch = el('span', 'jc-swatch');
      const key = rowColorKey(r, this.groupBy || null);
      swatch.dataset.color = colorOf(key);
      swatch.style.cssText = `display: inline-block; width: 10px; height: 10px; margin-left: 3px; border-radius: 2px; background: ${colorOf(key)};`;
      const first = el('td');
      first.append(box, swatch);
      tr.append(first);
      for (const c of cols) {
        const v = cellValue(r, c);
        const isBest = c.kind === 'final' && best.get(c.key) === r.id;
        const td = el('td', isBest ? 'jc-sweep-best' : '', cellIn(c, v) + (isBest ? ' ★' : ''));
        if (isBest) {
          td.title = `The best final ${c.key} of the rows shown (${bestFirstDescending(c.key) ? 'highest' : 'lowest'})`;
        }
        td.style.cssText = `padding: 1px 6px; border-bottom: ${border};${typeof v === 'number' ? ' text-align: right; font-variant-numeric: tabular-nums;' : ''}${isBest ? ' font-weight: 700;' : ''}`;
        tr.append(td);
      }
      return tr;
    };
    const keys = groupKeys(this.groupBy);
    if (!keys.length) {
      this.table.replaceChildren(head, ...rows.map(rowNode));
      return;
    }
    // grouped: a collapsed row per group (n, mean ± sd and best of each metric) that expands to its runs
    const metrics = [...new Set(cols.filter(c => c.kind === 'final' || c.kind === 'best').map(c => c.key))];
    const body: HTMLElement[] = [];
    for (const g of groupRows(rows, this.groupBy, metrics)) {
      const open = this.expanded.has(g.label);
      const tr = el('tr', 'jc-sweep-group-row');
      tr.dataset.group = g.label;
      tr.dataset.n = String(g.rows.length);
      tr.style.cssText = `cursor: pointer; background: var(--jp-layout-color2, ${this.dark ? '#222' : '#f3f3f3'});`;
      tr.title = open ? 'Collapse this group' : `Show the ${g.rows.length} runs of this group`;
      tr.addEventListener('click', () => {
        if (this.expanded.has(g.label)) {
          this.expanded.delete(g.label);
        } else {
          this.expanded.add(g.label);
        }
        this.changed();
      });
      const first = el('td', '', open ? '▾' : '▸');
      const swatch = el('span', 'jc-swatch');
      swatch.dataset.color = colorOf(g.key);
      swatch.style.cssText = `display: inline-block; width: 10px; height: 10px; margin-left: 3px; border-radius: 2px; background: ${colorOf(g.key)};`;
      first.append(swatch);
      tr.append(first);
      for (const c of cols) {
        let text = '';
        if (c.kind === 'name') {
          text = `${g.label} (n=${g.rows.length})`;
        } else if (c.kind === 'config' && keys.includes(c.key)) {
          text = cellIn(c, g.rows[0].config[c.key]);
        } else if (c.kind === 'final' && g.stats[c.key]) {
          text = meanText(g.stats[c.key], v => cellIn(c, v));
        } else if (c.kind === 'best' && g.stats[c.key]) {
          text = cellIn(c, g.stats[c.key].best);
        }
        const td = el('td', c.kind === 'final' ? 'jc-sweep-mean' : '', text);
        td.style.cssText = `padding: 1px 6px; border-bottom: ${border}; font-weight: 600;`;
        tr.append(td);
      }
      body.push(tr);
      if (open) {
        body.push(...g.rows.map(rowNode));
      }
    }
    this.table.replaceChildren(head, ...body);
  }
}
