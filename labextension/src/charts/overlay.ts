/**
 * The overlay chart (no DOM, no ECharts import): chosen scalar metrics, from
 * one or several topics and runs, as lines on one chart, and the chart's
 * ECharts option as plain data.
 *
 * How the y axes are shared, as a researcher reads it: one axis, with the
 * real values, unless two are asked for.  Metrics of one unit belong on one
 * axis (`reward` of three runs; `policy_mean` 0-500 and `population_mean`
 * 20-160: two axes would draw the lower one above).  The unit is not known,
 * so it is judged from the data: metrics whose ranges overlap and whose
 * magnitudes are within a factor of ten are one unit.  When the metrics are
 * of two units or more (`reward` 0-400 and `loss` 0-1) the chart still
 * starts on one axis and offers a "two axes" toggle (the first unit on the
 * left, the others on the right); the toolbar can also scale each metric to
 * 0-1 over its own range, so that their shapes compare (the tooltip still
 * shows the real values).
 *
 * A line's colour is its run's (series key, and kept cluster), the same as
 * in every other chart; which metric it is shows in its dash (the first
 * metric solid, the second dashed, the third dotted).
 */
import type { IMetricsModel, Point, XAxisMode } from './data';
import { ema, formatX, pointsOnAxis, seriesLabel, xAxisOption } from './data';
import { escapeHTML, formatNumber, naturalCompare } from '../common/text';

/**
 * One chosen metric: a scalar value of a topic, one of its series or all of
 * them (series null), of the charts' own cluster or (cluster set) of an
 * earlier run the server kept ("NAME.stopped-HHMMSS").
 */
export interface IOverlayPick {
  topic: string;
  value: string;
  series: string | null;
  cluster?: string | null;
}

/** Where the model of a pick's topic is kept: its topic, or its kept cluster and topic. */
export function sourceKey(topic: string, cluster?: string | null): string {
  return cluster ? `${cluster}\u0000${topic}` : topic;
}

function sameValue(a: IOverlayPick, b: IOverlayPick): boolean {
  return a.topic === b.topic && a.value === b.value && (a.cluster ?? null) === (b.cluster ?? null);
}

/** How the overlay's y axes are shared: 'auto' is one axis; the others are the user's request. */
export type OverlayAxes = 'auto' | 'shared' | 'dual' | 'normalised';

/** One line of the overlay. */
export interface IOverlayLine {
  /** unique: topic, value and series */
  id: string;
  /** the legend's name: "reward · member 1", with the topic when picks span topics */
  name: string;
  /** the metric the line belongs to ("topic/value"): lines of one metric share an axis and a scale */
  metric: string;
  /** what is drawn: on the x axis chosen, normalised when the axes are */
  points: Point[];
  /** the real values, at the same x (the tooltip shows these) */
  raw: Point[];
  /** 0: left axis, 1: right axis */
  axis: 0 | 1;
  /** the series key the line draws and the kept cluster it comes from (its colour) */
  series: string;
  cluster: string | null;
  /** the metric's place among those picked (its dash) */
  metricIndex: number;
}

export interface IOverlay {
  lines: IOverlayLine[];
  /** the sharing used ('auto' resolved) */
  axes: Exclude<OverlayAxes, 'auto'>;
  /** the y axes' names: one, or left and right */
  axisNames: string[];
  /** how many units the metrics are of (judged from their ranges): above 1 the chart offers two axes */
  units: number;
}

/** A pick as a string (for a <select> value and for de-duplication). */
export function pickKey(pick: IOverlayPick): string {
  return JSON.stringify([pick.topic, pick.value, pick.series, pick.cluster ?? null]);
}

/** The pick a pickKey() names, or null when the text is not one. */
export function parsePick(key: string): IOverlayPick | null {
  try {
    const v = JSON.parse(key) as unknown;
    if (
      Array.isArray(v) &&
      (v.length === 3 || v.length === 4) &&
      typeof v[0] === 'string' &&
      typeof v[1] === 'string' &&
      (v[2] === null || typeof v[2] === 'string') &&
      (v[3] === undefined || v[3] === null || typeof v[3] === 'string')
    ) {
      return { topic: v[0], value: v[1], series: v[2], cluster: v[3] ?? null };
    }
  } catch {
    // not JSON: not a pick
  }
  return null;
}

/** Add a pick (no duplicates; a value's "all series" replaces its single series and is not added twice). */
export function addPick(picks: IOverlayPick[], pick: IOverlayPick): IOverlayPick[] {
  const key = pickKey(pick);
  if (picks.some(p => pickKey(p) === key)) {
    return picks;
  }
  if (pick.series !== null && picks.some(p => sameValue(p, pick) && p.series === null)) {
    return picks; // already drawn with every series of its value
  }
  const rest = pick.series === null ? picks.filter(p => !sameValue(p, pick)) : picks;
  return [...rest, pick];
}

/** Remove a pick. */
export function removePick(picks: IOverlayPick[], pick: IOverlayPick): IOverlayPick[] {
  const key = pickKey(pick);
  return picks.filter(p => pickKey(p) !== key);
}

/** Topics of the charts' own cluster the picks need besides `topic` (the panel watches them too). */
export function pickTopics(picks: IOverlayPick[], topic: string): string[] {
  return [...new Set(picks.filter(p => !p.cluster).map(p => p.topic))].filter(t => t !== topic).sort(naturalCompare);
}

/** The kept clusters' topics the picks need (read once: they no longer change). */
export function pickKept(picks: IOverlayPick[]): { cluster: string; topic: string }[] {
  const seen = new Map<string, { cluster: string; topic: string }>();
  for (const p of picks) {
    if (p.cluster) {
      seen.set(sourceKey(p.topic, p.cluster), { cluster: p.cluster, topic: p.topic });
    }
  }
  return [...seen.values()];
}

/** Whether two value ranges look like one unit: they overlap and their magnitudes are within 10x. */
export function sameUnit(a: [number, number] | null, b: [number, number] | null): boolean {
  if (!a || !b) {
    return true; // nothing drawn yet: no reason to split
  }
  if (a[0] > b[1] || b[0] > a[1]) {
    return false;
  }
  const mag = (r: [number, number]): number => Math.max(Math.abs(r[0]), Math.abs(r[1]));
  const [x, y] = [mag(a), mag(b)];
  return Math.max(x, y) <= 10 * Math.min(x, y) || Math.max(x, y) === 0;
}

/** Each metric's unit group (0, 1, ...): a metric joins the first group all of whose metrics look like its unit. */
export function unitGroups(ranges: ([number, number] | null)[]): number[] {
  const groups: ([number, number] | null)[][] = [];
  return ranges.map(r => {
    let g = groups.findIndex(members => members.every(m => sameUnit(m, r)));
    if (g < 0) {
      g = groups.length;
      groups.push([]);
    }
    groups[g].push(r);
    return g;
  });
}

function range(lines: Point[][]): [number, number] | null {
  let lo = Infinity;
  let hi = -Infinity;
  for (const points of lines) {
    for (const [, y] of points) {
      if (y !== null && Number.isFinite(y)) {
        lo = Math.min(lo, y);
        hi = Math.max(hi, y);
      }
    }
  }
  return lo <= hi ? [lo, hi] : null;
}

/**
 * The overlay's lines from the models of their topics (`sources`, keyed by
 * sourceKey()).  Picks whose topic, value or series is not (yet) there draw
 * nothing.  Relative time counts from the earliest report of all the topics
 * drawn of one run, so lines from several topics share one origin and an
 * earlier run's lines start at 0 too.
 */
export function overlayLines(
  sources: { [topic: string]: IMetricsModel | undefined },
  picks: IOverlayPick[],
  mode: XAxisMode = 'step',
  axes: OverlayAxes = 'auto',
  home?: string
): IOverlay {
  const topics = new Set(picks.map(p => p.topic));
  // names say the topic when the lines come from several, or from another than the chart's own
  const many = topics.size > 1 || (home !== undefined && picks.some(p => p.topic !== home));
  // relative time counts from each run's first report (its cluster's topics drawn), so an earlier
  // run's curve starts where the current one does
  const origins = new Map<string, number>();
  for (const p of picks) {
    const run = p.cluster ?? '';
    for (const pairs of Object.values(sources[sourceKey(p.topic, p.cluster)]?.times ?? {})) {
      for (const [, time] of pairs) {
        origins.set(run, Math.min(origins.get(run) ?? Infinity, time));
      }
    }
  }
  const metricOrder: string[] = [];
  const metricLabel = new Map<string, string>();
  const found: { id: string; name: string; metric: string; points: Point[]; series: string; cluster: string | null }[] =
    [];
  const seen = new Set<string>();
  for (const pick of picks) {
    const model = sources[sourceKey(pick.topic, pick.cluster)];
    const bySeries = model?.scalars[pick.value];
    if (!model || !bySeries) {
      continue;
    }
    // one metric (one axis, one scale) whichever run it comes from: an earlier run's reward is a reward
    const metric = `${pick.topic}/${pick.value}`;
    const keys = pick.series === null ? Object.keys(bySeries).sort(naturalCompare) : [pick.series];
    for (const key of keys) {
      const id = `${sourceKey(metric, pick.cluster)}/${key}`;
      if (!bySeries[key] || seen.has(id)) {
        continue;
      }
      seen.add(id);
      if (!metricOrder.includes(metric)) {
        metricOrder.push(metric);
        metricLabel.set(metric, many ? `${pick.topic}: ${pick.value}` : pick.value);
      }
      const label = key === 'all' ? pick.value : `${pick.value} · ${seriesLabel(key)}`;
      const name = many ? `${pick.topic}: ${label}` : label;
      found.push({
        id,
        name: pick.cluster ? `${pick.cluster} · ${name}` : name,
        metric,
        series: key,
        cluster: pick.cluster ?? null,
        points: pointsOnAxis(bySeries[key], model.times?.[key], mode, origins.get(pick.cluster ?? '') ?? null)
      });
    }
  }
  const metricRanges = metricOrder.map(metric => range(found.filter(f => f.metric === metric).map(f => f.points)));
  const unit = unitGroups(metricRanges);
  const groupCount = new Set(unit).size;
  // one axis unless two (or 0-1) are asked for: a second axis makes lines of two units look
  // comparable when they are not, so the chart offers it (groupCount > 1) and the reader asks
  const used = axes === 'auto' ? 'shared' : axes;
  // forced onto two axes: the metrics of the first unit on the left, the others on the right
  const side = (metric: string): 0 | 1 => {
    const i = metricOrder.indexOf(metric);
    return groupCount > 1 ? (unit[i] === 0 ? 0 : 1) : i === 0 ? 0 : 1;
  };
  const valueName = (metric: string): string => metricLabel.get(metric) ?? metric;
  const ranges = new Map<string, [number, number] | null>();
  if (used === 'normalised') {
    metricOrder.forEach((metric, i) => ranges.set(metric, metricRanges[i]));
  }
  const lines: IOverlayLine[] = found.map(f => {
    const axis: 0 | 1 = used === 'dual' ? side(f.metric) : 0;
    let points = f.points;
    const r = ranges.get(f.metric);
    if (used === 'normalised' && r) {
      const span = r[1] - r[0];
      points = f.points.map(([x, y]) => [x, y === null ? null : span > 0 ? (y - r[0]) / span : 0.5]);
    }
    return {
      id: f.id,
      name: f.name,
      metric: f.metric,
      points,
      raw: f.points,
      axis,
      series: f.series,
      cluster: f.cluster,
      metricIndex: metricOrder.indexOf(f.metric)
    };
  });
  let axisNames: string[];
  if (used === 'normalised') {
    axisNames = ['each metric scaled to 0–1'];
  } else if (used === 'dual') {
    const onSide = (a: 0 | 1): string =>
      metricOrder
        .filter(m => side(m) === a)
        .map(valueName)
        .join(', ');
    axisNames = [onSide(0), onSide(1)];
  } else {
    axisNames = [[...new Set(metricOrder.map(valueName))].join(', ')];
  }
  return { lines, axes: used, axisNames, units: Math.max(1, groupCount) };
}

/** Each metric's dash, in the order picked. */
export const OVERLAY_DASHES = ['solid', 'dashed', 'dotted'];

/** The key an overlay line's colour comes from: its series, of its kept cluster (the same as in the other charts). */
export function lineColorKey(line: IOverlayLine): string {
  return line.cluster ? `${line.cluster} · ${line.series}` : line.series;
}

/** Most rows the overlay's legend wraps onto; beyond, it pages (one row). */
export const LEGEND_ROWS = 6;

/**
 * How the overlay's legend sits in a chart `width` pixels wide: no row for
 * one line; the names wrapped as ECharts wraps them (estimated at 6 px a
 * character and 30 px for the symbol and gap); or, beyond LEGEND_ROWS rows,
 * one row that pages.
 */
export function overlayLegend(names: string[], width = 360): { rows: number; paged: boolean } {
  if (names.length <= 1) {
    return { rows: 0, paged: false };
  }
  const room = Math.max(100, width - 10);
  let rows = 1;
  let used = 0;
  for (const name of names) {
    const w = 30 + 6 * name.length;
    if (used > 0 && used + w > room) {
      rows++;
      used = 0;
    }
    used += w;
  }
  return rows > LEGEND_ROWS ? { rows: 1, paged: true } : { rows, paged: false };
}

/**
 * Option for the overlay chart: chosen metrics as lines on one chart, on one
 * y axis, two (left and right), or each scaled to 0-1 (see overlay.ts); the
 * tooltip shows each line's real value.
 */
export function overlayOption(
  overlay: IOverlay,
  view: { smoothing?: number; logY?: boolean; x?: XAxisMode; compact?: boolean; width?: number },
  colorOf: (line: IOverlayLine, index: number) => string
): { [key: string]: unknown } {
  const compact = !!view.compact;
  const mode = view.x ?? 'step';
  const smoothing = view.smoothing ?? 0;
  const dual = overlay.axes === 'dual';
  const logY = !!view.logY && overlay.axes !== 'normalised';
  const lines = overlay.lines;
  const yAxis = overlay.axisNames.map((name, i) => ({
    type: logY ? 'log' : 'value',
    scale: overlay.axes !== 'normalised',
    min: overlay.axes === 'normalised' ? 0 : undefined,
    max: overlay.axes === 'normalised' ? 1 : undefined,
    name,
    nameGap: 8,
    nameTextStyle: { fontSize: 10, align: i === 0 ? 'left' : 'right' },
    position: i === 0 ? 'left' : 'right',
    splitNumber: compact ? 3 : 5,
    splitLine: { show: i === 0 },
    axisLabel: { fontSize: 10, formatter: (v: number) => formatNumber(v) }
  }));
  const tooltip = (params: unknown): string => {
    const list = (Array.isArray(params) ? params : [params]) as {
      seriesId?: string;
      seriesName?: string;
      marker?: string;
      value?: unknown;
      axisValue?: unknown;
      dataIndex?: number;
    }[];
    const x = Number(list[0]?.axisValue ?? (list[0]?.value as Point | undefined)?.[0]);
    const rows = list.map(p => {
      const line = lines.find(l => l.id === p.seriesId);
      const real = line && p.dataIndex !== undefined ? line.raw[p.dataIndex]?.[1] : null;
      return `${p.marker ?? ''}${escapeHTML(p.seriesName ?? '')}: <b>${formatNumber(real ?? null)}</b>`;
    });
    return [formatX(x, mode), ...rows.slice(0, compact ? 6 : 12)].join('<br/>');
  };
  const legend = lines.length > 1;
  // the legend says which line is which metric: it wraps onto rows rather than paging (unless there
  // are very many), and the plot leaves them room
  const names = lines.map(l => l.name);
  const { rows: legendRows, paged } = overlayLegend(names, view.width);
  return {
    animation: false,
    backgroundColor: 'transparent',
    title: { text: 'overlay', left: 4, top: 2, textStyle: { fontSize: 12 } },
    tooltip: { trigger: 'axis', confine: true, formatter: tooltip },
    toolbox: {
      right: dual ? 40 : 4,
      top: 0,
      itemSize: 12,
      itemGap: 6,
      feature: {
        dataZoom: { yAxisIndex: 'none', title: { zoom: 'zoom (drag)', back: 'reset zoom' } },
        saveAsImage: { title: 'PNG', name: 'overlay', pixelRatio: 2 }
      }
    },
    legend: {
      show: legend,
      type: paged ? 'scroll' : 'plain',
      bottom: 0,
      itemWidth: 14,
      itemHeight: 8,
      textStyle: { fontSize: 10 },
      data: lines.map(l => l.name)
    },
    grid: {
      left: compact ? 44 : 56,
      right: dual ? (compact ? 44 : 56) : compact ? 10 : 16,
      top: 50, // the title and the tools, then the axes' names
      bottom: 34 + 18 * legendRows
    },
    xAxis: xAxisOption(mode, compact),
    yAxis,
    dataZoom: [{ type: 'inside', filterMode: 'none' }],
    series: lines.map((l, i) => ({
      id: l.id,
      name: l.name,
      type: 'line',
      yAxisIndex: dual ? l.axis : 0,
      data: smoothing > 0 ? ema(l.points, smoothing) : l.points,
      showSymbol: l.points.length < 2,
      symbolSize: 4,
      connectNulls: false,
      itemStyle: { color: colorOf(l, i) },
      // the colour is the run's; the dash is the metric's (the right axis's metrics dashed or dotted)
      lineStyle: { width: 1.5, color: colorOf(l, i), type: OVERLAY_DASHES[l.metricIndex % OVERLAY_DASHES.length] },
      emphasis: { focus: 'series' }
    }))
  };
}
