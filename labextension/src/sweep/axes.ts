/**
 * The scale of a parallel-coordinates axis, chosen from its values: log for
 * positive values spanning two decades or more (a learning rate), categories
 * for few distinct values (a seed, an on/off switch), linear otherwise.
 */
export type AxisKind = 'log' | 'category' | 'linear';

/** At most this many distinct values make a categorical axis. */
export const MAX_CATEGORIES = 6;

/** The axis kind for these values (non-numbers make it categorical). */
export function axisKind(values: unknown[]): AxisKind {
  const present = values.filter(v => v !== null && v !== undefined && v !== '');
  if (!present.length) {
    return 'linear';
  }
  if (present.some(v => typeof v !== 'number' || !Number.isFinite(v))) {
    return 'category';
  }
  const nums = present as number[];
  const distinct = new Set(nums);
  const min = Math.min(...nums);
  const max = Math.max(...nums);
  if (min > 0 && max / min >= 100) {
    return 'log';
  }
  if (distinct.size <= MAX_CATEGORIES && nums.every(Number.isInteger)) {
    return 'category';
  }
  return 'linear';
}

/** The kinds a user may switch an axis to (a non-positive value rules log out, non-numbers all but categories). */
export function axisChoices(values: unknown[]): AxisKind[] {
  const present = values.filter(v => v !== null && v !== undefined && v !== '');
  if (present.some(v => typeof v !== 'number' || !Number.isFinite(v))) {
    return ['category'];
  }
  const nums = present as number[];
  return nums.length && Math.min(...nums) > 0 ? ['log', 'linear', 'category'] : ['linear', 'category'];
}
