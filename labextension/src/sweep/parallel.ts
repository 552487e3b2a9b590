/**
 * The parallel-coordinates view of a sweep (as TensorBoard's HParams): its
 * axes (log, categories or linear, axes.ts), its line colours and ticked rows.
 */
import { formatNumber, naturalCompare } from '../common/text';
import { AxisKind, axisChoices, axisKind } from './axes';
import { cellText, configKeys } from './model';
import type { ISweepRow } from './rows';

/** A parallel axis of the parallel-coordinates view: numbers on a value axis, anything else as categories. */
export function parallelAxis(
  rows: ISweepRow[],
  key: string,
  dim: number,
  isMetric: boolean,
  kind: AxisKind | null = null
): { [key: string]: unknown } {
  const values = rows.map(r => (isMetric ? r.final[key] : r.config[key]));
  // log for a learning rate's decades, categories for a seed's few values (axes.ts); `kind` is the user's switch
  const chosen = kind ?? axisKind(values);
  if (chosen === 'log') {
    return { dim, name: key, type: 'log', scale: true, nameTextStyle: { fontSize: 10 }, axisKind: 'log' };
  }
  if (chosen === 'linear') {
    return { dim, name: key, type: 'value', scale: true, nameTextStyle: { fontSize: 10 }, axisKind: 'linear' };
  }
  const present = values.filter(v => v !== null && v !== undefined);
  const numeric = present.length > 0 && present.every(v => typeof v === 'number');
  const cats = numeric
    ? [...new Set(present as number[])].sort((a, b) => a - b).map(v => cellText(v))
    : [...new Set(values.map(v => cellText(v) || '(none)'))].sort(naturalCompare);
  return { dim, name: key, type: 'category', data: cats, nameTextStyle: { fontSize: 10 }, axisKind: 'category' };
}

/**
 * The parallel-coordinates lines' colour scale, low to high final value:
 * viridis-like, with ends that read as lines on the theme's background
 * (viridis's own ends, a dark purple and a pale yellow, vanish on dark and on
 * white backgrounds respectively).
 */
export function parallelColours(dark: boolean): string[] {
  return dark ? ['#7b6fd6', '#2fb5a5', '#fde725'] : ['#440154', '#21918c', '#b8860b'];
}

/**
 * The parallel-coordinates view (as TensorBoard's HParams): an axis per
 * config key and a last one for `metric`'s final value; a line per row, in
 * the row's own colour (`rowColor`, the colour of its swatch and its curve),
 * or without it coloured by the metric's value on one scale.
 */
export function parallelOption(
  rows: ISweepRow[],
  metric: string,
  dark = false,
  rowColor: ((row: ISweepRow) => string) | null = null,
  ticked: Set<string> | null = null,
  axisKinds: { [key: string]: AxisKind } = {}
): { [key: string]: unknown } {
  const keys = configKeys(rows);
  const axes = keys.map((k, i) => parallelAxis(rows, k, i, false, axisKinds[k] ?? null));
  // a metric is a value (never a few categories): log where it spans decades
  const metricKind = axisKinds[metric] ?? (axisKind(rows.map(r => r.final[metric])) === 'log' ? 'log' : 'linear');
  axes.push(parallelAxis(rows, metric, keys.length, true, metricKind));
  const emphasis = ticked !== null && ticked.size > 0;
  const data = rows.map(r => {
    const style: { [key: string]: unknown } = rowColor ? { color: rowColor(r) } : {};
    if (emphasis) {
      // ticked rows stand out, the others stay as context
      Object.assign(style, ticked.has(r.id) ? { width: 3, opacity: 1 } : { width: 1, opacity: 0.15 });
    }
    return {
      name: r.name,
      id: r.id,
      value: [
        ...keys.map((k, i) =>
          (axes[i] as { type: string }).type !== 'category' ? (r.config[k] ?? null) : cellText(r.config[k]) || '(none)'
        ),
        r.final[metric] ?? null
      ],
      ...(Object.keys(style).length ? { lineStyle: style } : {})
    };
  });
  const finals = rows.map(r => r.final[metric]).filter((v): v is number => typeof v === 'number' && Number.isFinite(v));
  const lo = finals.length ? Math.min(...finals) : 0;
  const hi = finals.length ? Math.max(...finals) : 1;
  return {
    animation: false,
    backgroundColor: 'transparent',
    title: { text: `config → ${metric}`, left: 4, top: 2, textStyle: { fontSize: 12 } },
    tooltip: { trigger: 'item', confine: true },
    // room on the right for the metric axis's labels and then the colour bar (if any)
    parallel: { left: 40, right: rowColor ? 60 : 110, top: 50, bottom: 24 },
    parallelAxis: axes,
    // coloured by row: no value scale (each line is in its row's colour)
    ...(rowColor
      ? {}
      : {
          visualMap: {
            type: 'continuous',
            dimension: keys.length,
            min: lo,
            max: hi === lo ? lo + 1 : hi,
            right: 6,
            top: 50,
            itemHeight: 100,
            itemWidth: 10,
            calculable: true,
            textStyle: { fontSize: 10 },
            formatter: (v: number) => formatNumber(Number(Number(v).toPrecision(3))),
            inRange: { color: parallelColours(dark) }
          }
        }),
    series: [
      {
        type: 'parallel',
        lineStyle: { width: 1.5, opacity: 0.6 },
        emphasis: { lineStyle: { width: 3, opacity: 1 } },
        inactiveOpacity: dark ? 0.1 : 0.05,
        data
      }
    ]
  };
}

/** One parallel axis as the axis switch offers it: its key, the scale drawn, the scale chosen from the values, the others allowed. */
export interface IAxisSwitch {
  key: string;
  kind: AxisKind;
  auto: AxisKind;
  choices: AxisKind[];
}

/**
 * The axes the switch offers (each config key, then `metric`), each with the
 * scale drawn: the user's choice in `chosen` where the values allow it, else
 * the one chosen from the values (axisKind(); a metric is never categorical).
 * The choices are axisChoices()'s (no log with a value <= 0).
 */
export function axisSwitches(rows: ISweepRow[], metric: string, chosen: { [key: string]: AxisKind }): IAxisSwitch[] {
  const one = (key: string, values: unknown[], isMetric: boolean): IAxisSwitch => {
    const found = axisKind(values);
    const auto: AxisKind = isMetric && found === 'category' ? 'linear' : found;
    const choices = axisChoices(values).filter(k => !isMetric || k !== 'category');
    const want = chosen[key];
    return { key, auto, choices, kind: want && choices.includes(want) ? want : auto };
  };
  const out = configKeys(rows).map(k =>
    one(
      k,
      rows.map(r => r.config[k]),
      false
    )
  );
  if (metric) {
    out.push(
      one(
        metric,
        rows.map(r => r.final[metric]),
        true
      )
    );
  }
  return out;
}

/** The axis kinds to draw (parallelOption()'s `axisKinds`): only the axes switched away from their automatic scale. */
export function switchedKinds(axes: IAxisSwitch[]): { [key: string]: AxisKind } {
  return Object.fromEntries(axes.filter(a => a.kind !== a.auto).map(a => [a.key, a.kind]));
}
