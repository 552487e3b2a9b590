/**
 * Which way a metric is better: loss-like names (loss, error, mse, …) are
 * better lower, the rest (accuracy, reward, score, …) higher.  The table's
 * first click, its "best" and the saved copy's choice of runs follow it; the
 * kernel's `best` values use the same rule (jupyter_cluster/telemetry/topic_store.py).
 */

/** words that make a metric's best value its lowest: topic_store.py's _LOWER_IS_BETTER, the same list */
export const LOWER_IS_BETTER = [
  'loss',
  'error',
  'err',
  'regret',
  'perplexity',
  'ppl',
  'mse',
  'mae',
  'rmse',
  'nll',
  'cost',
  'time'
];

/** Whether lower values of `metric` are better (its name is loss-like, as the kernel decides its `best`). */
export function lowerIsBetter(metric: string): boolean {
  const low = metric.toLowerCase();
  return LOWER_IS_BETTER.some(w => low.includes(w));
}

/** The best of `values` for `metric` (the lowest for a loss-like name), or null when none is a number. */
export function bestValue(metric: string, values: (number | null | undefined)[]): number | null {
  const nums = values.filter((v): v is number => typeof v === 'number' && Number.isFinite(v));
  if (!nums.length) {
    return null;
  }
  return lowerIsBetter(metric) ? Math.min(...nums) : Math.max(...nums);
}

/** The default metric of a table: the first loss-like one (what a sweep minimises), else the first. */
export function defaultMetric(metrics: string[]): string {
  return metrics.find(lowerIsBetter) ?? metrics[0] ?? '';
}

/** Whether a first click on a metric column sorts descending: best first, whichever way best is. */
export function bestFirstDescending(metric: string): boolean {
  return !lowerIsBetter(metric);
}

/**
 * Metric -> the id of the row with the best final value (the lowest for a
 * loss-like name, else the highest); the first row given wins a tie, and a
 * metric no row has a number for is left out.  The table marks these cells
 * (★); the saved copy marks the same ones (jupyter_cluster/widgets/sweep.py
 * best_rows()).
 */
export function bestRowIds(
  rows: { id: string; final: { [metric: string]: number | null | undefined } }[],
  metrics: string[]
): Map<string, string> {
  const out = new Map<string, string>();
  for (const m of metrics) {
    const lower = lowerIsBetter(m);
    let found: { v: number; id: string } | null = null;
    for (const r of rows) {
      const v = r.final[m];
      if (typeof v === 'number' && Number.isFinite(v) && (found === null || (lower ? v < found.v : v > found.v))) {
        found = { v, id: r.id };
      }
    }
    if (found) {
      out.set(m, found.id);
    }
  }
  return out;
}
