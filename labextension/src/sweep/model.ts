/**
 * The sweep table and its comparisons, as plain data (no DOM, no ECharts
 * import, unit-tested with Jest): one row per sweep item or run, with its
 * config and each metric's final and best value (the rows of
 * `jupyter_cluster.tracking.runs.table()`, which `jc.runs()` shows as a DataFrame);
 * sorting, filtering, grouping by a config key with mean ± spread bands, and
 * the ECharts options of the curves overlay and the parallel-coordinates
 * (config -> metric) view.
 */
import type { Point } from '../charts/data';
import { colorLookup, distinctColors } from '../charts/colors';
import { escapeHTML, formatNumber, naturalCompare } from '../common/text';
import { parseFilter, termHolds } from './filter';
import { IGroup, groupBy as groupByKeys } from './groups';
import { columnNotation } from './notation';
import { overlayLegend } from '../charts/overlay';
import type { ConfigValue, ISweepRow } from './rows';

/** What the sweep widget and view draw: the rows and, per metric, each row's curve. */
export interface ISweep {
  title?: string;
  rows: ISweepRow[];
  curves: { [metric: string]: { [rowId: string]: Point[] } };
  /**
   * every series key of the topics the rows' series are in: the key set the
   * metric charts assign their colours over, so a row gets its series'
   * colour (see colors.ts assignColors())
   */
  colorKeys?: string[];
}

/**
 * The key a row's colour is looked up by: its group's (`key=value`) when
 * grouped, else its series key in the metric charts, else its own id.
 */
export function rowColorKey(row: ISweepRow, groupBy: string | null = null): string {
  const keys = groupKeys(groupBy);
  if (keys.length) {
    return groupLabelOf(row, keys);
  }
  return row.series || row.id;
}

/** The config keys of a grouping (`"lr,aux"`: by lr, then aux). */
export function groupKeys(groupBy: string | null | undefined): string[] {
  return (groupBy ?? '')
    .split(',')
    .map(k => k.trim())
    .filter(k => k);
}

/** A row's group as its label: `"lr=0.001, aux=true"`, in the table's notation. */
export function groupLabelOf(row: ISweepRow, keys: string[], rows: ISweepRow[] = [row]): string {
  const text = configText(rows);
  return keys.map(k => `${k}=${text(k, row.config[k]) || '(none)'}`).join(', ');
}

/** A config cell's text in its column's one notation (notation.ts): `configText(rows)(key, value)`. */
export function configText(rows: ISweepRow[]): (key: string, v: ConfigValue | undefined) => string {
  const formats = new Map<string, (v: number) => string>();
  return (key, v) => {
    if (typeof v !== 'number') {
      return cellText(v);
    }
    let f = formats.get(key);
    if (!f) {
      f = columnNotation(rows.map(r => r.config[key]));
      formats.set(key, f);
    }
    return Number.isFinite(v) ? f(v) : cellText(v);
  };
}

/**
 * The colours of a sweep's rows (look up rowColorKey()): each row's series
 * gets the colour the metric charts give it (the topic's keys are assigned
 * first, exactly as those charts assign them), rows without a series the
 * next ones; grouped, each group its own.  `shown` are the rows on screen
 * (after the filter): when their colours would repeat more than the
 * palette's size forces, the rows shown are coloured among themselves
 * instead (colors.ts distinctColors()), so three filtered rows are never
 * red, pink and red.  The swatches, the curves and the parallel coordinates
 * all use it.
 */
export function sweepColors(
  sweep: ISweep,
  dark = false,
  groupBy: string | null = null,
  shown: ISweepRow[] = sweep.rows
): (key: string) => string {
  if (groupKeys(groupBy).length) {
    const groups = groupRows(shown, groupBy ?? '').map(g => g.key);
    return distinctColors(
      groups,
      colorLookup(
        groupRows(sweep.rows, groupBy ?? '').map(g => g.key),
        dark
      ),
      dark
    );
  }
  const topic = colorLookup(
    sweep.colorKeys ?? [],
    dark,
    sweep.rows.map(r => rowColorKey(r))
  );
  return distinctColors(
    shown.map(r => rowColorKey(r)),
    topic,
    dark
  );
}

/** A column of the table: the row's name, state or duration, a config key, or a metric's final or best value. */
export interface IColumn {
  id: string;
  label: string;
  kind: 'name' | 'state' | 'duration' | 'config' | 'final' | 'best';
  key: string;
}

/** The config keys of the rows, in order of first appearance. */
export function configKeys(rows: ISweepRow[]): string[] {
  const out: string[] = [];
  for (const r of rows) {
    for (const k of Object.keys(r.config)) {
      if (!out.includes(k)) {
        out.push(k);
      }
    }
  }
  return out;
}

/** The metrics of the rows (final values and curves), in natural order. */
export function metricKeys(sweep: ISweep): string[] {
  const names = new Set<string>(Object.keys(sweep.curves));
  for (const r of sweep.rows) {
    Object.keys(r.final).forEach(m => names.add(m));
  }
  return [...names].sort(naturalCompare);
}

/** The table's columns: name, state, each config key, each metric's final and best value. */
export function columns(sweep: ISweep): IColumn[] {
  const cols: IColumn[] = [{ id: 'name', label: 'run', kind: 'name', key: 'name' }];
  if (sweep.rows.some(r => r.state)) {
    cols.push({ id: 'state', label: 'state', kind: 'state', key: 'state' });
  }
  if (sweep.rows.some(r => typeof r.duration === 'number')) {
    cols.push({ id: 'duration', label: 'time (s)', kind: 'duration', key: 'duration' });
  }
  for (const k of configKeys(sweep.rows)) {
    cols.push({ id: `config:${k}`, label: k, kind: 'config', key: k });
  }
  for (const m of metricKeys(sweep)) {
    if (sweep.rows.some(r => m in r.final)) {
      cols.push({ id: `final:${m}`, label: m, kind: 'final', key: m });
      cols.push({ id: `best:${m}`, label: `${m} (best)`, kind: 'best', key: m });
    }
  }
  return cols;
}

/** A row's value in a column. */
export function cellValue(row: ISweepRow, col: IColumn): ConfigValue | undefined {
  switch (col.kind) {
    case 'name':
      return row.name;
    case 'state':
      return row.state ?? null;
    case 'duration':
      return row.duration ?? null;
    case 'config':
      return row.config[col.key];
    case 'final':
      return row.final[col.key];
    case 'best':
      return row.best[col.key];
  }
}

/** A cell's text. */
export function cellText(v: ConfigValue | undefined): string {
  if (v === null || v === undefined) {
    return '';
  }
  return typeof v === 'number' ? formatNumber(v) : String(v);
}

/** Compare two cells: numbers as numbers, text naturally (so 2 < 10 and "run 2" < "run 10"), empty last. */
export function compareValues(a: ConfigValue | undefined, b: ConfigValue | undefined): number {
  const empty = (v: ConfigValue | undefined): boolean =>
    v === null || v === undefined || v === '' || (typeof v === 'number' && !Number.isFinite(v));
  if (empty(a) || empty(b)) {
    return empty(a) ? (empty(b) ? 0 : 1) : -1;
  }
  if (typeof a === 'number' && typeof b === 'number') {
    return a - b;
  }
  return naturalCompare(String(a), String(b));
}

/** The rows sorted by a column (stable; empty cells last in either direction). */
export function sortRows(rows: ISweepRow[], col: IColumn | null, descending = false): ISweepRow[] {
  if (!col) {
    return rows;
  }
  const sign = descending ? -1 : 1;
  return rows
    .map((row, i) => ({ row, i, v: cellValue(row, col) }))
    .sort((a, b) => {
      const emptyA = a.v === null || a.v === undefined || a.v === '';
      const emptyB = b.v === null || b.v === undefined || b.v === '';
      if (emptyA !== emptyB) {
        return emptyA ? 1 : -1;
      }
      return sign * compareValues(a.v, b.v) || a.i - b.i;
    })
    .map(x => x.row);
}

/** The keys a filter may name: config keys, metrics (final values) and `state`. */
export function filterKeys(rows: ISweepRow[]): string[] {
  const metrics = new Set<string>();
  rows.forEach(r => Object.keys(r.final).forEach(m => metrics.add(m)));
  return [...configKeys(rows), ...[...metrics].sort(naturalCompare), 'state'];
}

/**
 * The rows a filter keeps (filter.ts: `key=value`, `key!=value`, `key>n`,
 * `key>=n`, `key<n`, `key<=n` on a config key, a metric or `state`, and
 * plain words found in a row's name or config).  A term on an unknown key is
 * left out (filterProblems() names it) rather than keeping nothing.
 */
export function filterRows(rows: ISweepRow[], text: string): ISweepRow[] {
  const { terms } = parseFilter(text, filterKeys(rows));
  if (!terms.length) {
    return rows;
  }
  return rows.filter(r =>
    terms.every(t => {
      const key = t.key;
      const v =
        key === null
          ? undefined
          : key in r.config
            ? r.config[key]
            : key in r.final
              ? r.final[key]
              : key === 'state'
                ? (r.state ?? null)
                : undefined;
      return termHolds(t, v, [r.name, ...Object.values(r.config).map(c => cellText(c))]);
    })
  );
}

/** What is wrong with a filter for these rows (an unknown key, a comparison without a number), one sentence each. */
export function filterProblems(rows: ISweepRow[], text: string): string[] {
  return parseFilter(text, filterKeys(rows)).problems;
}

/**
 * The rows grouped by one or more config keys (`"lr,aux"`), groups in the
 * order of their values (numbers as numbers: lr=0.001 before lr=0.003 before
 * lr=0.01), each with its label and its metrics' aggregates (groups.ts).
 */
export function groupRows(
  rows: ISweepRow[],
  groupBy: string,
  metrics: string[] = []
): { value: string; label: string; key: string; rows: ISweepRow[]; stats: IGroup['stats'] }[] {
  const keys = groupKeys(groupBy);
  const text = configText(rows);
  return groupByKeys(rows, keys, metrics, (v, k) => text(k, v) || '(none)').map(g => ({
    value: keys.length === 1 ? text(keys[0], g.values[keys[0]]) || '(none)' : g.label,
    label: g.label,
    // the colour key: rowColorKey()'s for each of its rows (the label is in the column's notation)
    key: groupLabelOf(g.rows[0], keys),
    rows: g.rows,
    stats: g.stats
  }));
}

/** The mean of a group's curves at each x, and the spread (± one standard deviation), from the curves that have x. */
export interface IBandPoint {
  x: number;
  mean: number;
  lo: number;
  hi: number;
  n: number;
}

/**
 * Mean ± standard deviation of several curves, at every x any of them has
 * (each x from the curves with a finite value there; n says how many).
 */
export function meanBand(curves: Point[][]): IBandPoint[] {
  const byX = new Map<number, number[]>();
  for (const curve of curves) {
    for (const [x, y] of curve) {
      if (y === null || !Number.isFinite(y)) {
        continue;
      }
      const list = byX.get(x);
      if (list) {
        list.push(y);
      } else {
        byX.set(x, [y]);
      }
    }
  }
  return [...byX.entries()]
    .sort((a, b) => a[0] - b[0])
    .map(([x, ys]) => {
      const mean = ys.reduce((s, y) => s + y, 0) / ys.length;
      const sd = Math.sqrt(ys.reduce((s, y) => s + (y - mean) ** 2, 0) / ys.length);
      return { x, mean, lo: mean - sd, hi: mean + sd, n: ys.length };
    });
}

/** What the curves chart draws: its lines (a row or a group's mean) and bands, for the tests and the legend. */
export interface ICurvesChart {
  option: { [key: string]: unknown };
  lines: string[];
  /** whether a legend is drawn (else the tooltip names the lines) */
  legend: boolean;
}

/** Most rows the curves chart's legend wraps onto, and most lines it names; beyond, the tooltip does. */
export const CURVES_LEGEND_ROWS = 4;
export const CURVES_LEGEND_LINES = 12;

/**
 * The curves of `metric` for `rows`, each in its colour; or, grouped by a
 * config key, each group's mean with a ± one standard deviation band.  The
 * legend wraps onto rows in a chart `width` pixels wide when it fits in a
 * few; otherwise there is none and the tooltip names the lines.
 */
export function curvesOption(
  sweep: ISweep,
  rows: ISweepRow[],
  metric: string,
  colorOf: (key: string) => string,
  groupBy: string | null = null,
  width = 480
): ICurvesChart {
  const curves = sweep.curves[metric] ?? {};
  const series: object[] = [];
  const lines: string[] = [];
  if (groupBy) {
    for (const g of groupRows(rows, groupBy)) {
      const band = meanBand(g.rows.map(r => curves[r.id] ?? []));
      if (!band.length) {
        continue;
      }
      const name = `${g.label} (n=${g.rows.length})`;
      const color = colorOf(g.key);
      const stack = `band:${g.value}`;
      lines.push(name);
      // the band: an invisible line at mean - sd, and the spread stacked on it as a filled area
      series.push({
        id: `${stack}:lo`,
        type: 'line',
        data: band.map(b => [b.x, b.lo]),
        stack,
        lineStyle: { opacity: 0 },
        showSymbol: false,
        silent: true,
        tooltip: { show: false }
      });
      series.push({
        id: `${stack}:spread`,
        type: 'line',
        data: band.map(b => [b.x, b.hi - b.lo]),
        stack,
        lineStyle: { opacity: 0 },
        areaStyle: { color, opacity: 0.2 },
        showSymbol: false,
        silent: true,
        tooltip: { show: false }
      });
      series.push({
        id: `mean:${g.value}`,
        name,
        type: 'line',
        data: band.map(b => [b.x, b.mean]),
        showSymbol: band.length < 2,
        itemStyle: { color },
        lineStyle: { width: 2, color }
      });
    }
  } else {
    for (const r of rows) {
      const data = curves[r.id];
      if (!data || !data.length) {
        continue;
      }
      lines.push(r.name);
      series.push({
        id: `row:${r.id}`,
        name: r.name,
        type: 'line',
        data,
        showSymbol: data.length < 2,
        sampling: 'lttb',
        itemStyle: { color: colorOf(rowColorKey(r)) },
        lineStyle: { width: 1.5, color: colorOf(rowColorKey(r)) },
        emphasis: { focus: 'series' }
      });
    }
  }
  const fit = overlayLegend(lines, width);
  const legend =
    lines.length > 1 && lines.length <= CURVES_LEGEND_LINES && !fit.paged && fit.rows <= CURVES_LEGEND_ROWS;
  const option = {
    animation: false,
    backgroundColor: 'transparent',
    title: {
      text: groupBy ? `${metric}: mean ± sd by ${groupBy}` : metric,
      left: 4,
      top: 2,
      textStyle: { fontSize: 12 }
    },
    tooltip: {
      trigger: 'axis',
      confine: true,
      formatter: (params: unknown) => {
        const list = (Array.isArray(params) ? params : [params]) as {
          seriesName?: string;
          marker?: string;
          value?: Point;
          axisValue?: unknown;
        }[];
        const named = list
          .filter(p => p.seriesName)
          .sort((a, b) => (b.value?.[1] ?? -Infinity) - (a.value?.[1] ?? -Infinity));
        const rowsHtml = named
          .slice(0, 12)
          .map(p => `${p.marker ?? ''}${escapeHTML(p.seriesName ?? '')}: <b>${formatNumber(p.value?.[1] ?? null)}</b>`);
        if (named.length > 12) {
          rowsHtml.push(`… ${named.length - 12} more`);
        }
        return [`step ${formatNumber(Number(list[0]?.axisValue))}`, ...rowsHtml].join('<br/>');
      }
    },
    legend: { show: legend, type: 'plain', bottom: 0, itemWidth: 14, itemHeight: 8, textStyle: { fontSize: 10 } },
    // the x axis's name, then the legend's rows
    grid: { left: 56, right: 16, top: 28, bottom: legend ? 34 + 18 * fit.rows : 30 },
    xAxis: { type: 'value', name: 'step', nameLocation: 'middle', nameGap: 20, min: 'dataMin', max: 'dataMax' },
    yAxis: { type: 'value', scale: true, axisLabel: { formatter: (v: number) => formatNumber(v) } },
    dataZoom: [{ type: 'inside', filterMode: 'none' }],
    series
  };
  return { option, lines, legend };
}

/** A row of `jupyter_cluster.tracking.runs.table()` as the server's `GET runs/RUN` and `jc.runs()` have it. */
export interface ITableRow {
  run: string;
  key?: string | null;
  item?: number | null;
  name?: string | null;
  state?: string | null;
  duration?: number | null;
  config?: { [key: string]: unknown };
  final?: { [metric: string]: number | null };
  best?: { [metric: string]: number | null };
}

/** A config value as a series key writes it (Python's str(): True, 0.1, 3). */
function keyText(v: unknown): string {
  if (typeof v === 'boolean') {
    return v ? 'True' : 'False';
  }
  return String(v);
}

/**
 * The series (of `keys`) that holds a row's curve: the one named by the
 * row's item key, or the first (natural order) whose identity fields
 * ("trial=3, member=1") all equal the row's config values; null when none.
 * The same rule as jupyter_cluster/widgets/sweep.py's series_of().
 */
export function seriesOfRow(row: ITableRow, keys: string[]): string | null {
  const sorted = [...keys].sort((a, b) => naturalCompare(a, b) || (a < b ? -1 : a > b ? 1 : 0));
  if (row.key && sorted.includes(row.key)) {
    return row.key;
  }
  const config = row.config ?? {};
  for (const k of sorted) {
    if (k === 'all') {
      continue;
    }
    const parts = k.split(', ').map(p => {
      const eq = p.indexOf('=');
      return eq > 0 ? [p.slice(0, eq), p.slice(eq + 1)] : null;
    });
    if (parts.every(p => p !== null && p[0] in config && keyText(config[p[0]]) === p[1])) {
      return k;
    }
  }
  return null;
}

function toNumber(v: unknown): number | null {
  return typeof v === 'number' && Number.isFinite(v) ? v : null;
}

/** Each run's items' own curves: run id -> metric -> item key ("" for the run itself) -> points. */
export type ItemCurves = { [run: string]: { [metric: string]: { [key: string]: Point[] } } };

/**
 * Whether every item row of a run has what its item reported: its final values and each one's curve.
 * The server hears a finished run's record before the last reports (both reach it through the
 * scheduler), so a table read at once may show rows whose values and curves are still on their way.
 */
export function rowsComplete(rows: ITableRow[], curves: ItemCurves[string]): boolean {
  return rows.every(r => {
    if (!r.key) {
      return true; // a row of the run itself: no item curves
    }
    const metrics = Object.keys(r.final ?? {});
    return metrics.length > 0 && metrics.every(m => (curves[m]?.[r.key as string]?.length ?? 0) > 0);
  });
}

/** A topic's model as far as the sweep reads it. */
export interface ISweepTopic {
  topic?: string;
  scalars: { [value: string]: { [series: string]: Point[] } };
  vectors?: { [value: string]: { [series: string]: unknown } };
}

/**
 * Each row's series key in the metric charts, and the key set those charts
 * colour over: in the topics (natural order of name) a row's series is the
 * one seriesOfRow() finds among the topic's series keys (scalar and vector
 * values alike, as the charts list them); the key set is every key of the
 * topics some row's series is in.  jupyter_cluster/widgets/sweep.py's
 * row_series() is the same rule.
 */
export function rowSeries(
  rows: ITableRow[],
  models: ISweepTopic[]
): { series: (string | null)[]; colorKeys: string[] } {
  const topics = [...models].sort((a, b) => naturalCompare(a.topic ?? '', b.topic ?? ''));
  const series: (string | null)[] = rows.map(() => null);
  const colorKeys = new Set<string>();
  for (const model of topics) {
    const keys = new Set<string>();
    for (const bySeries of [...Object.values(model.scalars ?? {}), ...Object.values(model.vectors ?? {})]) {
      Object.keys(bySeries).forEach(k => keys.add(k));
    }
    const list = [...keys];
    let found = false;
    rows.forEach((r, i) => {
      if (series[i] === null) {
        series[i] = seriesOfRow(r, list);
        found ||= series[i] !== null;
      }
    });
    if (found) {
      list.forEach(k => colorKeys.add(k));
    }
  }
  return { series, colorKeys: [...colorKeys].sort(naturalCompare) };
}

/**
 * The sweep the view draws from table rows: a row's curve is its item's own
 * (`itemCurves`, as `GET runs/RUN/curves` and `runs.merge_curves()` give
 * them), else the series of `models` that seriesOfRow() finds; its colour
 * its series' in the metric charts (rowSeries()).
 */
export function sweepFromTable(
  rows: ITableRow[],
  models: ISweepTopic[],
  title = '',
  itemCurves: ItemCurves = {}
): ISweep {
  const { series, colorKeys } = rowSeries(rows, models);
  const out: ISweepRow[] = rows.map((r, i) => ({
    id: `${r.run}:${r.key ? r.key : r.item === null || r.item === undefined ? '' : String(r.item)}`,
    name: String(r.key || r.name || r.run),
    series: series[i],
    state: r.state ?? null,
    duration: toNumber(r.duration),
    config: Object.fromEntries(
      Object.entries(r.config ?? {}).map(([k, v]) => [
        k,
        v === null || ['string', 'number', 'boolean'].includes(typeof v) ? (v as ConfigValue) : String(v)
      ])
    ),
    final: Object.fromEntries(Object.entries(r.final ?? {}).map(([k, v]) => [k, toNumber(v)])),
    best: Object.fromEntries(Object.entries(r.best ?? {}).map(([k, v]) => [k, toNumber(v)]))
  }));
  const curves: ISweep['curves'] = {};
  rows.forEach((r, i) => {
    for (const [metric, byKey] of Object.entries(itemCurves[r.run] ?? {})) {
      const points = byKey[r.key ?? ''];
      if (points?.length) {
        (curves[metric] ??= {})[out[i].id] = points;
      }
    }
  });
  for (const model of models) {
    for (const [metric, bySeries] of Object.entries(model.scalars)) {
      const keys = Object.keys(bySeries);
      rows.forEach((r, i) => {
        const key = curves[metric]?.[out[i].id] ? null : seriesOfRow(r, keys);
        if (key !== null) {
          (curves[metric] ??= {})[out[i].id] = bySeries[key];
        }
      });
    }
  }
  return { title, rows: out, curves, colorKeys };
}
