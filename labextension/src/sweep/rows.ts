/**
 * A row of the sweep table, as `GET runs/RUN` and `jc.runs()` give it: the
 * types the table's modules (model, filter, groups) share.
 */

/** A config value as a table cell holds it. */
export type ConfigValue = string | number | boolean | null;

/** One row of the sweep table. */
export interface ISweepRow {
  /** unique in the table: the run id, and the item's key for a sweep item */
  id: string;
  /** what the row is called: the item's key ("lr=0.1, aux=on") or the run's name */
  name: string;
  /**
   * the series key its curve has in its topic's metric charts ("trial=3"), by
   * which it gets that series' colour; null or absent when it has none there
   */
  series?: string | null;
  state?: string | null;
  duration?: number | null;
  config: { [key: string]: ConfigValue };
  /** each metric's value at its last step */
  final: { [metric: string]: number | null };
  /** each metric's best value (lowest for loss-like names, else highest) */
  best: { [metric: string]: number | null };
}
