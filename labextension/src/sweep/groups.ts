/**
 * Group rows by one or more config keys: a group row per distinct
 * combination, with each metric's mean ± standard deviation, n and best over
 * its runs (the usual "average over seeds per (lr, aux)"), expanding to them.
 */
import { naturalCompare } from '../common/text';
import { lowerIsBetter } from './direction';
import type { ConfigValue, ISweepRow } from './rows';

export interface IAggregate {
  mean: number | null;
  sd: number | null;
  n: number;
  best: number | null;
}

export interface IGroup {
  /** "lr=0.001, aux=on": the group's values of the keys */
  label: string;
  values: { [key: string]: ConfigValue };
  rows: ISweepRow[];
  /** per metric, over the rows' final values */
  stats: { [metric: string]: IAggregate };
}

function text(v: ConfigValue | undefined): string {
  if (v === null || v === undefined) {
    return '(none)';
  }
  if (typeof v === 'boolean') {
    return v ? 'on' : 'off';
  }
  return String(v);
}

/** Mean, sample standard deviation, count and best (by the metric's direction) of the numbers given. */
export function aggregate(metric: string, values: (number | null | undefined)[]): IAggregate {
  const nums = values.filter((v): v is number => typeof v === 'number' && Number.isFinite(v));
  const n = nums.length;
  if (!n) {
    return { mean: null, sd: null, n: 0, best: null };
  }
  const mean = nums.reduce((a, b) => a + b, 0) / n;
  const sd = n > 1 ? Math.sqrt(nums.reduce((a, b) => a + (b - mean) ** 2, 0) / (n - 1)) : null;
  const best = lowerIsBetter(metric) ? Math.min(...nums) : Math.max(...nums);
  return { mean, sd, n, best };
}

/**
 * The rows grouped by `keys` (in order of their values: numbers as numbers),
 * each group with its metrics' aggregates; `format` writes a value in the
 * label as the table writes it.
 */
export function groupBy(
  rows: ISweepRow[],
  keys: string[],
  metrics: string[],
  format: (v: ConfigValue, key: string) => string = text
): IGroup[] {
  if (!keys.length) {
    return [];
  }
  const groups = new Map<string, IGroup>();
  for (const r of rows) {
    const values: { [key: string]: ConfigValue } = {};
    keys.forEach(k => (values[k] = r.config[k] ?? null));
    const label = keys.map(k => `${k}=${format(values[k], k)}`).join(', ');
    let g = groups.get(label);
    if (!g) {
      g = { label, values, rows: [], stats: {} };
      groups.set(label, g);
    }
    g.rows.push(r);
  }
  const out = [...groups.values()];
  for (const g of out) {
    for (const m of metrics) {
      g.stats[m] = aggregate(
        m,
        g.rows.map(r => r.final[m])
      );
    }
  }
  return out.sort((a, b) => compareGroups(a, b, keys));
}

function compareGroups(a: IGroup, b: IGroup, keys: string[]): number {
  for (const k of keys) {
    const x = a.values[k];
    const y = b.values[k];
    const c = typeof x === 'number' && typeof y === 'number' ? x - y : naturalCompare(text(x), text(y));
    if (c) {
      return c;
    }
  }
  return 0;
}

/** A group's cell for a metric: "0.231 ± 0.012" (n and best are their own columns). */
export function meanText(a: IAggregate, format: (v: number) => string): string {
  if (a.mean === null) {
    return '';
  }
  return a.sd === null ? format(a.mean) : `${format(a.mean)} ± ${format(a.sd)}`;
}
