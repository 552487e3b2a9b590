/**
 * Pure data handling for the metric charts (no DOM, no ECharts): number and
 * series-name formatting, smoothing, shared colour scales, run differences
 * and exports.  Shared by the sidebar panel and the notebook widget, and
 * unit-tested with Jest.
 */
import { formatNumber, naturalCompare } from '../common/text';

/** One point of a line: [step, value]; null values leave a gap. */
export type Point = [number, number | null];

/** A vector value of one series: one row per step. */
export interface IVectorSeries {
  steps: number[];
  rows: (number | null)[][];
}

/** The shared metrics data model (mirrors TopicStore.model() in jupyter_cluster/telemetry/topic_store.py). */
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
  /** series key -> [step, time] of its reports (seconds since the epoch, sorted by step, thinned) */
  times?: { [series: string]: [number, number][] };
  /** points the curves lost from their start to the history cap (optional: older servers send none) */
  truncated?: number;
}

/** What a line chart's x axis shows: the reported step, the wall-clock time, or seconds since the topic began. */
export type XAxisMode = 'step' | 'wall' | 'relative';

/** The notice of a topic whose curves lost their oldest points to the history cap, or null when none did. */
export function truncatedText(model: IMetricsModel): string | null {
  const cut = model.truncated ?? 0;
  if (cut <= 0) {
    return null;
  }
  return ` · curves truncated: the oldest ${cut.toLocaleString()} points were evicted`;
}

/** An empty model, e.g. before the first data arrives. */
export function emptyModel(topic = ''): IMetricsModel {
  return { topic, scalars: {}, vectors: {}, dropped: 0, received: 0, times: {}, truncated: 0 };
}

/** The earliest report time of a model (the origin of relative time), or null when no time is known. */
export function timeOrigin(model: IMetricsModel): number | null {
  let origin: number | null = null;
  for (const pairs of Object.values(model.times ?? {})) {
    for (const [, t] of pairs) {
      if (origin === null || t < origin) {
        origin = t;
      }
    }
  }
  return origin;
}

/** The time of `step` from a series' [step, time] pairs (sorted by step): exact or interpolated; null outside them. */
export function timeAt(pairs: [number, number][], step: number): number | null {
  let lo = 0;
  let hi = pairs.length - 1;
  if (hi < 0 || step < pairs[0][0] || step > pairs[hi][0]) {
    return null;
  }
  while (hi - lo > 1) {
    const mid = (lo + hi) >> 1;
    if (pairs[mid][0] <= step) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  const [s0, t0] = pairs[lo];
  const [s1, t1] = pairs[hi];
  if (step === s0 || s1 === s0) {
    return t0;
  }
  return step === s1 ? t1 : t0 + ((step - s0) / (s1 - s0)) * (t1 - t0);
}

/**
 * A series' points on the chosen x axis: steps as they are, wall time in
 * milliseconds (ECharts' time axis), relative time in seconds from `origin`,
 * both in time order.  Points whose time is not known are left out.
 */
export function pointsOnAxis(
  points: Point[],
  pairs: [number, number][] | undefined,
  mode: XAxisMode,
  origin: number | null
): Point[] {
  if (mode === 'step') {
    return points;
  }
  const out: Point[] = [];
  for (const [step, y] of points) {
    const t = pairs ? timeAt(pairs, step) : null;
    if (t === null) {
      continue;
    }
    out.push([mode === 'wall' ? t * 1000 : t - (origin ?? 0), y]);
  }
  // in time order: reports of parallel tasks need not be made in step order, and a line drawn in step
  // order would run back and forth in time
  return out.sort((a, b) => a[0] - b[0]);
}

/** The x axis's name for each choice of the toolbar. */
export const X_AXIS_NAMES: { [mode in XAxisMode]: string } = {
  step: 'step',
  wall: 'wall time',
  relative: 'time since start'
};

/** Each series' points on the chosen x axis (times and their origin from the whole model, so hiding a series moves nothing). */
export function onAxis(
  bySeries: { [series: string]: Point[] },
  model: IMetricsModel,
  mode: XAxisMode
): { [series: string]: Point[] } {
  if (mode === 'step') {
    return bySeries;
  }
  const origin = timeOrigin(model);
  const out: { [series: string]: Point[] } = {};
  for (const [key, points] of Object.entries(bySeries)) {
    out[key] = pointsOnAxis(points, model.times?.[key], mode, origin);
  }
  return out;
}

/** A line chart's x axis (ECharts option, plain data) for the x axis chosen in the toolbar. */
export function xAxisOption(mode: XAxisMode, compact: boolean): { [key: string]: unknown } {
  return {
    type: mode === 'wall' ? 'time' : 'value',
    name: X_AXIS_NAMES[mode],
    nameLocation: 'middle',
    nameGap: 20,
    nameTextStyle: { fontSize: 10 },
    min: 'dataMin',
    max: 'dataMax',
    splitNumber: compact ? 3 : 6,
    axisLabel:
      mode === 'wall'
        ? { hideOverlap: true, fontSize: 10 }
        : {
            hideOverlap: true,
            fontSize: 10,
            formatter: (v: number) => (mode === 'relative' ? formatDuration(v) : formatNumber(v))
          }
  };
}

/** An x value as the tooltip shows it: "step 12", "14:03:21", "+1:05" (relative, m:ss or h:mm:ss). */
export function formatX(x: number, mode: XAxisMode): string {
  if (mode === 'wall') {
    const d = new Date(x);
    const pad = (n: number): string => String(n).padStart(2, '0');
    return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  }
  if (mode === 'relative') {
    return `+${formatDuration(x)}`;
  }
  return `step ${formatNumber(x)}`;
}

/** Seconds as "4.5 s" below a minute, else "m:ss" or "h:mm:ss". */
export function formatDuration(seconds: number): string {
  if (!Number.isFinite(seconds)) {
    return '-';
  }
  if (Math.abs(seconds) < 60) {
    return `${formatNumber(Number(seconds.toFixed(1)))} s`;
  }
  const total = Math.round(seconds);
  const h = Math.floor(total / 3600);
  const m = Math.floor((total % 3600) / 60);
  const sec = String(total % 60).padStart(2, '0');
  return h ? `${h}:${String(m).padStart(2, '0')}:${sec}` : `${m}:${sec}`;
}

/**
 * A series key as a short legend name: "walk=walk 0" -> "walk 0",
 * "member=3" -> "member 3", "run=lr=0.1" -> "lr=0.1", "all" -> "all".
 */
export function seriesLabel(key: string): string {
  if (key === 'all') {
    return key;
  }
  return key
    .split(', ')
    .map(part => {
      const eq = part.indexOf('=');
      if (eq <= 0) {
        return part;
      }
      const field = part.slice(0, eq);
      const value = part.slice(eq + 1);
      if (/^-?\d+(\.\d+)?$/.test(value)) {
        return `${field} ${value}`;
      }
      return value;
    })
    .join(', ');
}

/** The name of a vector's index axis from its value name: "tokens_per_expert" -> "expert". */
export function vectorAxisName(name: string): string {
  const m = /(?:^|_)per_([A-Za-z][A-Za-z0-9]*)$/.exec(name);
  // no "per_X" in the name: its entries, named after it ("histogram[i]"), not a bare "index"
  return m ? m[1] : `${name}[i]`;
}

/**
 * TensorBoard's smoothing: an exponential moving average with the start-up
 * bias removed, so the first points are not pulled towards zero.  Gaps
 * (null) are kept and do not reset the average.  weight 0 returns the input.
 */
export function ema(points: Point[], weight: number): Point[] {
  if (!(weight > 0)) {
    return points;
  }
  const w = Math.min(weight, 0.999);
  let last = 0;
  let n = 0;
  return points.map(([x, y]) => {
    if (y === null || !Number.isFinite(y)) {
      return [x, y];
    }
    last = last * w + (1 - w) * y;
    n++;
    return [x, last / (1 - Math.pow(w, n))];
  });
}

/** One colour scale for every run of a vector value: [min, max] over all their cells. */
export function sharedRange(bySeries: { [series: string]: IVectorSeries }): [number, number] {
  let lo = Infinity;
  let hi = -Infinity;
  for (const s of Object.values(bySeries)) {
    for (const row of s.rows) {
      for (const v of row) {
        if (v !== null && Number.isFinite(v)) {
          lo = Math.min(lo, v);
          hi = Math.max(hi, v);
        }
      }
    }
  }
  if (!Number.isFinite(lo)) {
    return [0, 1];
  }
  return lo === hi ? [lo, lo + 1] : [lo, hi];
}

/** The largest absolute value in a vector series (for a difference's symmetric scale). */
export function absMax(data: IVectorSeries): number {
  let m = 0;
  for (const row of data.rows) {
    for (const v of row) {
      if (v !== null && Number.isFinite(v)) {
        m = Math.max(m, Math.abs(v));
      }
    }
  }
  return m || 1;
}

/**
 * The cell-by-cell difference a - b of two runs, at the steps both have.
 * Entries missing in either run are null.
 */
export function diffVectors(a: IVectorSeries, b: IVectorSeries): IVectorSeries {
  const rowOf = new Map<number, (number | null)[]>();
  b.steps.forEach((s, i) => rowOf.set(s, b.rows[i]));
  const steps: number[] = [];
  const rows: (number | null)[][] = [];
  a.steps.forEach((s, i) => {
    const other = rowOf.get(s);
    if (!other) {
      return;
    }
    const mine = a.rows[i];
    const width = Math.max(mine.length, other.length);
    const row: (number | null)[] = [];
    for (let j = 0; j < width; j++) {
      const x = mine[j];
      const y = other[j];
      row.push(x === null || x === undefined || y === null || y === undefined ? null : x - y);
    }
    steps.push(s);
    rows.push(row);
  });
  return { steps, rows };
}

/** The model without the hidden series (values left with no series are dropped). */
export function withoutSeries(model: IMetricsModel, hidden: Iterable<string>): IMetricsModel {
  const off = new Set(hidden);
  if (off.size === 0) {
    return model;
  }
  const keep = <T>(bySeries: { [key: string]: T }): { [key: string]: T } | null => {
    const out: { [key: string]: T } = {};
    let any = false;
    for (const [key, value] of Object.entries(bySeries)) {
      if (!off.has(key)) {
        out[key] = value;
        any = true;
      }
    }
    return any ? out : null;
  };
  const scalars: IMetricsModel['scalars'] = {};
  for (const [name, bySeries] of Object.entries(model.scalars)) {
    const kept = keep(bySeries);
    if (kept) {
      scalars[name] = kept;
    }
  }
  const vectors: IMetricsModel['vectors'] = {};
  for (const [name, bySeries] of Object.entries(model.vectors)) {
    const kept = keep(bySeries);
    if (kept) {
      vectors[name] = kept;
    }
  }
  return { ...model, scalars, vectors };
}

/** Keep the series whose key or label contains `text` (case-insensitive); "" keeps all. */
export function matchSeries(model: IMetricsModel, text: string): IMetricsModel {
  const needle = text.trim().toLowerCase();
  if (!needle) {
    return model;
  }
  const keep = (key: string): boolean =>
    key.toLowerCase().includes(needle) || seriesLabel(key).toLowerCase().includes(needle);
  const pick = <T>(byValue: { [v: string]: { [s: string]: T } }): { [v: string]: { [s: string]: T } } => {
    const out: { [v: string]: { [s: string]: T } } = {};
    for (const [name, bySeries] of Object.entries(byValue)) {
      const kept = Object.entries(bySeries).filter(([k]) => keep(k));
      if (kept.length) {
        out[name] = Object.fromEntries(kept);
      }
    }
    return out;
  };
  return { ...model, scalars: pick(model.scalars), vectors: pick(model.vectors) };
}

function csvField(s: string): string {
  return /[",\n]/.test(s) ? `"${s.replace(/"/g, '""')}"` : s;
}

/** The drawn data as CSV: one line per point (scalars) or cell (vectors). */
export function toCSV(model: IMetricsModel): string {
  const lines = ['value,series,step,index,y'];
  for (const name of Object.keys(model.scalars).sort(naturalCompare)) {
    for (const key of Object.keys(model.scalars[name]).sort(naturalCompare)) {
      for (const [x, y] of model.scalars[name][key]) {
        lines.push([csvField(name), csvField(key), String(x), '', y === null ? '' : String(y)].join(','));
      }
    }
  }
  for (const name of Object.keys(model.vectors).sort(naturalCompare)) {
    for (const key of Object.keys(model.vectors[name]).sort(naturalCompare)) {
      const { steps, rows } = model.vectors[name][key];
      rows.forEach((row, i) =>
        row.forEach((y, j) =>
          lines.push(
            [csvField(name), csvField(key), String(steps[i]), String(j), y === null ? '' : String(y)].join(',')
          )
        )
      );
    }
  }
  return lines.join('\n') + '\n';
}

/** The notebook code that gets a topic's full history as a DataFrame. */
export function metricsCode(topic: string): string {
  return `import jupyter_cluster as jc\ndf = jc.metrics(${JSON.stringify(topic)})`;
}
