/**
 * A scalar value's line chart as an ECharts option, plain data (no DOM, no
 * ECharts import, unit-tested with Jest).
 *
 * What the option builder decides, so a researcher reads the chart at once:
 * - the y scale: linear, log (points <= 0 cannot be drawn: they are counted
 *   and the chart says so, per series) or symlog (sign(y) log10(1 + |y|/c),
 *   which draws zero and negative values too);
 * - which series are drawn: all, or the top / bottom k by their last value;
 * - the legend: wrapped onto rows when it fits in a few, else (and for more
 *   than `manySeries` series) none, and the tooltip lists the series nearest
 *   the pointer instead;
 * - the tooltip: smoothed and raw values side by side when smoothing is on,
 *   the real values on a symlog axis.
 */
import type { Point, XAxisMode } from './data';
import { ema, formatX, seriesLabel, xAxisOption } from './data';
import { escapeHTML, formatNumber, naturalCompare } from '../common/text';
import { overlayLegend } from './overlay';

/** How the y axis maps values. */
export type YScale = 'linear' | 'log' | 'symlog';

/** Which series a chart draws: all, or the k with the highest ('top') or lowest ('bottom') last value. */
export interface ITopK {
  k: number;
  order: 'top' | 'bottom';
}

/** How a line chart is drawn (the toolbar's choices). */
export interface ILineView {
  /** EMA weight in [0, 1) */
  smoothing: number;
  /** the y scale (logY true is the same as 'log') */
  yScale?: YScale;
  logY?: boolean;
  /** what the x axis shows; the points are already on it (pointsOnAxis) */
  x?: XAxisMode;
  /** narrow host: fewer ticks, legend only when it fits in fewer rows */
  compact: boolean;
  /** the chart's width in pixels (for the legend's rows) */
  width?: number;
  /** draw only these series (null: all) */
  topK?: ITopK | null;
}

/** The y scale a view asks for. */
export function yScaleOf(view: Partial<ILineView>): YScale {
  return view.yScale ?? (view.logY ? 'log' : 'linear');
}

/** A series' last finite value, or null when it has none. */
export function lastValue(points: Point[]): number | null {
  for (let i = points.length - 1; i >= 0; i--) {
    const y = points[i][1];
    if (y !== null && Number.isFinite(y)) {
      return y;
    }
  }
  return null;
}

/**
 * The keys of the k series with the highest (top) or lowest (bottom) last
 * value, in natural order; series with no value come last.  null or k <= 0
 * keeps every key.
 */
export function topKeys(bySeries: { [series: string]: Point[] }, topK: ITopK | null | undefined): string[] {
  const keys = Object.keys(bySeries).sort(naturalCompare);
  if (!topK || topK.k <= 0 || keys.length <= topK.k) {
    return keys;
  }
  const sign = topK.order === 'top' ? -1 : 1;
  const ranked = keys
    .map(key => ({ key, y: lastValue(bySeries[key]) }))
    .sort((a, b) => {
      if (a.y === null || b.y === null) {
        return a.y === null ? (b.y === null ? 0 : 1) : -1;
      }
      return sign * (a.y - b.y) || naturalCompare(a.key, b.key);
    });
  const kept = new Set(ranked.slice(0, topK.k).map(r => r.key));
  return keys.filter(k => kept.has(k));
}

/** Log y: the points <= 0 (or not finite) of each series, which a log axis cannot draw. */
export function logDropped(bySeries: { [series: string]: Point[] }): { [series: string]: number } {
  const out: { [series: string]: number } = {};
  for (const [key, points] of Object.entries(bySeries)) {
    const n = points.filter(([, y]) => y !== null && !(y > 0)).length;
    if (n > 0) {
      out[key] = n;
    }
  }
  return out;
}

/** The chart's notice for what log y left out: "log y: 50 points ≤ 0 not drawn (walk 0: all 50; walk 1: 3)". */
export function logDroppedText(dropped: { [series: string]: number }, counts: { [series: string]: number }): string {
  const keys = Object.keys(dropped).sort(naturalCompare);
  if (!keys.length) {
    return '';
  }
  const total = keys.reduce((s, k) => s + dropped[k], 0);
  const parts = keys
    .slice(0, 3)
    .map(k => `${seriesLabel(k)}: ${dropped[k] === counts[k] ? `all ${dropped[k]}` : dropped[k]}`);
  const more = keys.length > 3 ? `; ${keys.length - 3} more series` : '';
  return `log y: ${total.toLocaleString()} point${total === 1 ? '' : 's'} ≤ 0 not drawn (${parts.join('; ')}${more}) — try symlog`;
}

/** Symlog's linear range c: the smallest non-zero |y| rounded down to a power of ten (1 when there is none). */
export function symlogConstant(bySeries: { [series: string]: Point[] }): number {
  let m = Infinity;
  for (const points of Object.values(bySeries)) {
    for (const [, y] of points) {
      if (y !== null && Number.isFinite(y) && y !== 0) {
        m = Math.min(m, Math.abs(y));
      }
    }
  }
  return Number.isFinite(m) ? Math.pow(10, Math.floor(Math.log10(m))) : 1;
}

/** sign(y) log10(1 + |y|/c): linear near 0, logarithmic far from it, defined for every real y. */
export function symlog(y: number, c: number): number {
  return Math.sign(y) * Math.log10(1 + Math.abs(y) / c);
}

/** The inverse of symlog (for the axis labels). */
export function symexp(v: number, c: number): number {
  return Math.sign(v) * c * (Math.pow(10, Math.abs(v)) - 1);
}

/**
 * A symlog axis's ticks, on the drawn (transformed) scale: 0 and ±c·10^k, the
 * round real values (0.01, 0.1, 1, 10, …), so the labels read "0.1 / 1 / 10"
 * and never the "0.99 / 100" of evenly spaced transformed ticks.  Every
 * second (third, …) decade when more than `most` would show; the first and
 * last enclose [lo, hi] (the axis's ends).
 */
export function symlogTicks(lo: number, hi: number, c: number, most = 7): number[] {
  if (!(Number.isFinite(lo) && Number.isFinite(hi) && c > 0 && most >= 2)) {
    return [];
  }
  const top = Math.ceil(Math.log10(Math.max(Math.abs(symexp(lo, c)), Math.abs(symexp(hi, c)), c) / c));
  const between = (step: number): number[] => {
    // the ticks 0, ±c·10^(step·j) from the last at or below lo to the first at or above hi
    const real = [0];
    for (let k = 0; k <= top + step; k += step) {
      real.push(c * Math.pow(10, k), -c * Math.pow(10, k));
    }
    const all = real.map(v => symlog(Number(v.toPrecision(12)), c)).sort((a, b) => a - b);
    const first = Math.max(0, all.filter(t => t <= lo + 1e-9).length - 1);
    const over = all.findIndex(t => t >= hi - 1e-9);
    return all.slice(first, (over < 0 ? all.length - 1 : over) + 1);
  };
  let step = 1;
  let ticks = between(step);
  while (ticks.length > most && step < top + 1) {
    step += 1;
    ticks = between(step);
  }
  return ticks;
}

/** A symlog tick's label: the round real value it stands for. */
export function symlogLabel(v: number, c: number): string {
  return formatNumber(Number(symexp(v, c).toPrecision(3)));
}

/** The y values as a scale draws them: log's unusable points become gaps, symlog's are transformed. */
export function onScale(points: Point[], scale: YScale, c = 1): Point[] {
  if (scale === 'log') {
    return points.map(([x, y]) => [x, y !== null && y > 0 ? y : null]);
  }
  if (scale === 'symlog') {
    return points.map(([x, y]) => [x, y !== null && Number.isFinite(y) ? symlog(y, c) : null]);
  }
  return points;
}

interface IAxisParam {
  seriesId?: string;
  seriesName?: string;
  marker?: string;
  value?: unknown;
  axisValue?: unknown;
  dataIndex?: number;
}

/** One tooltip row: a series, its (smoothed) value and, when smoothing, its raw value. */
export interface ITooltipRow {
  key: string;
  name: string;
  marker: string;
  value: number | null;
  raw: number | null;
}

/**
 * The rows a tooltip lists at x: nearest the pointer's y first when it is
 * known (many series: the hover list), else the highest value first; at
 * most `limit`.  Returns the rows and how many were left out.
 */
export function tooltipRows(rows: ITooltipRow[], limit: number, pointerY: number | null): [ITooltipRow[], number] {
  const sorted = [...rows].sort((a, b) => {
    if (a.value === null || b.value === null) {
      return a.value === null ? (b.value === null ? 0 : 1) : -1;
    }
    return pointerY === null ? b.value - a.value : Math.abs(a.value - pointerY) - Math.abs(b.value - pointerY);
  });
  return [sorted.slice(0, limit), Math.max(0, sorted.length - limit)];
}

/** The y value at x of a series: at `index` when that point is at x, else the first point at x. */
function valueAt(points: Point[], x: number, index?: number): number | null {
  if (index !== undefined && points[index]?.[0] === x) {
    return points[index][1];
  }
  for (const [px, y] of points) {
    if (px === x) {
      return y;
    }
  }
  return null;
}

/** What lineChart() drew besides the option: the notices and counts the chart shows and tests read. */
export interface ILineChart {
  option: { [key: string]: unknown };
  /** the series drawn (after top-k) */
  keys: string[];
  /** series left out by top-k */
  hiddenByTopK: number;
  /** log y: points <= 0 per series, not drawn */
  dropped: { [series: string]: number };
  /** the notices under the title ('' when none) */
  notice: string;
  /** whether a legend is drawn (else the tooltip names the series) */
  legend: boolean;
}

/**
 * The line chart of one scalar value: one line per series, in the colour
 * `colorOf(key)` gives (the same in every chart).
 *
 * @param pointerY the pointer's y in data units while it is over the chart
 *   (symlog: on the drawn scale), for the tooltip's nearest-first list.
 */
export function lineChart(
  name: string,
  bySeries: { [series: string]: Point[] },
  view: Partial<ILineView> = {},
  colorOf: (key: string) => string | undefined = () => undefined,
  manySeries = 12,
  pointerY: () => number | null = () => null
): ILineChart {
  const keys = topKeys(bySeries, view.topK);
  const hiddenByTopK = Object.keys(bySeries).length - keys.length;
  const many = keys.length > manySeries;
  const compact = !!view.compact;
  const smoothing = view.smoothing ?? 0;
  const mode = view.x ?? 'step';
  const scale = yScaleOf(view);
  const shown: { [series: string]: Point[] } = {};
  keys.forEach(k => (shown[k] = bySeries[k]));
  const dropped = scale === 'log' ? logDropped(shown) : {};
  const c = scale === 'symlog' ? symlogConstant(shown) : 1;
  const smoothed: { [series: string]: Point[] } = {};
  const names = keys.map(seriesLabel);
  // a legend that fits in a few rows; otherwise none, and the tooltip names the series nearest the pointer
  const fit = overlayLegend(names, view.width ?? (compact ? 250 : 600));
  const legend = keys.length > 1 && !many && !fit.paged && fit.rows <= (compact ? 2 : 4);
  const series: object[] = [];
  for (const key of keys) {
    const data = bySeries[key];
    const color = colorOf(key);
    smoothed[key] = smoothing > 0 ? ema(data, smoothing) : data;
    if (smoothing > 0) {
      series.push({
        id: `raw:${key}`,
        name: seriesLabel(key),
        type: 'line',
        data: onScale(data, scale, c),
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
      data: onScale(smoothed[key], scale, c),
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
  const limit = many ? 8 : compact ? 6 : 12;
  const tooltip = (params: unknown): string => {
    const list = (Array.isArray(params) ? params : [params]) as IAxisParam[];
    const drawn = list.filter(p => !(p.seriesId ?? '').startsWith('raw:'));
    const x = Number(drawn[0]?.axisValue ?? (drawn[0]?.value as Point | undefined)?.[0]);
    const rows: ITooltipRow[] = drawn.map(p => {
      const key = p.seriesId ?? '';
      const px = Number((p.value as Point | undefined)?.[0] ?? x);
      return {
        key,
        name: p.seriesName ?? '',
        marker: p.marker ?? '',
        // the real values (symlog draws transformed ones): smoothed and raw
        value: valueAt(smoothed[key] ?? [], px, p.dataIndex),
        raw: valueAt(bySeries[key] ?? [], px, p.dataIndex)
      };
    });
    let at = pointerY();
    if (at !== null && scale === 'symlog') {
      at = symexp(at, c);
    }
    const [top, rest] = tooltipRows(rows, limit, many ? at : null);
    const lines = top.map(
      r =>
        `${r.marker}${escapeHTML(r.name)}: <b>${formatNumber(r.value)}</b>` +
        (smoothing > 0 ? ` <span style="opacity:0.7">(raw ${formatNumber(r.raw)})</span>` : '')
    );
    if (rest > 0) {
      lines.push(many && at !== null ? `… ${rest} more further from the pointer` : `… ${rest} more`);
    }
    return [formatX(x, mode), ...lines].join('<br/>');
  };
  const notes: string[] = [];
  if (hiddenByTopK > 0 && view.topK) {
    notes.push(`${view.topK.order} ${keys.length} of ${keys.length + hiddenByTopK} by last value`);
  }
  const dropText = logDroppedText(
    dropped,
    Object.fromEntries(keys.map(k => [k, bySeries[k].filter(([, y]) => y !== null).length]))
  );
  if (dropText) {
    notes.push(dropText);
  }
  const notice = notes.join(' · ');
  const yAxis: { [key: string]: unknown } = {
    type: scale === 'log' ? 'log' : 'value',
    scale: true,
    splitNumber: compact ? 3 : 5,
    name: scale === 'linear' ? undefined : scale,
    nameGap: 8,
    nameTextStyle: { fontSize: 9, align: 'left' },
    axisLabel: {
      fontSize: 10,
      formatter: (v: number) => (scale === 'symlog' ? symlogLabel(v, c) : formatNumber(v))
    }
  };
  if (scale === 'symlog') {
    // ticks at the round real values (0, ±c, ±10c, …), not evenly over the transformed range
    const drawn = keys.flatMap(k => onScale(smoothed[k], scale, c).map(([, y]) => y));
    const ys = drawn.filter((y): y is number => y !== null && Number.isFinite(y));
    const ticks = ys.length ? symlogTicks(Math.min(...ys), Math.max(...ys), c, compact ? 4 : 7) : [];
    if (ticks.length >= 2) {
      Object.assign(yAxis, {
        min: ticks[0],
        max: ticks[ticks.length - 1],
        axisTick: { customValues: ticks },
        axisLabel: { ...(yAxis.axisLabel as object), customValues: ticks },
        splitLine: { show: true },
        symlogTicks: ticks.map(t => symlogLabel(t, c))
      });
    }
  }
  const top = notice ? 46 : 26;
  const option = {
    animation: false,
    backgroundColor: 'transparent',
    title: {
      text: name,
      subtext: notice,
      left: 4,
      top: 2,
      itemGap: 6,
      textStyle: { fontSize: 12 },
      subtextStyle: {
        fontSize: 10,
        color: '#c77c02',
        width: Math.max(120, (view.width ?? 400) - 90),
        overflow: 'truncate'
      }
    },
    tooltip: {
      trigger: 'axis',
      axisPointer: { type: 'line' },
      confine: true,
      // many series: no legend, so the tooltip is the list of the series nearest the pointer
      formatter: tooltip
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
      type: 'plain',
      bottom: 0,
      itemWidth: 14,
      itemHeight: 8,
      textStyle: { fontSize: 10 },
      data: names
    },
    grid: {
      left: compact ? 44 : 56,
      right: compact ? 10 : 16,
      top: top + (scale === 'linear' ? 0 : 8),
      bottom: legend ? 34 + 18 * fit.rows : 34
    },
    xAxis: xAxisOption(mode, compact),
    yAxis,
    dataZoom: [{ type: 'inside', filterMode: 'none' }],
    series
  };
  return { option, keys, hiddenByTopK, dropped, notice, legend };
}
