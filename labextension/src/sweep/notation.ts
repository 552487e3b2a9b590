/**
 * One notation per column: a column whose values need an exponent somewhere
 * (lr = 1e-4 … 1e-2) writes all of them with one (1e-4, 3e-4, 1e-3, 1e-2),
 * never 1e-4 beside 0.001; other columns keep the plain form.
 */
import { formatNumber } from '../common/text';

/** `v` with an exponent, at most 4 significant digits: 0.001 -> "1e-3", 0.00025 -> "2.5e-4". */
export function exponential(v: number): string {
  return v
    .toExponential(3)
    .replace(/\.?0+e/, 'e')
    .replace('e+', 'e');
}

/** The formatter of a column's numbers: exponents for all where one needs it, else the plain form. */
export function columnNotation(values: unknown[]): (v: number) => string {
  const nums = values.filter((v): v is number => typeof v === 'number' && Number.isFinite(v));
  const needs = nums.some(v => formatNumber(v).includes('e'));
  const allIntegers = nums.every(Number.isInteger);
  return needs && !allIntegers ? v => (v === 0 ? '0' : exponential(v)) : formatNumber;
}
