/**
 * The sweep table's filter box: terms separated by spaces, all must hold.
 * `key=value`, `key!=value`, `key>n`, `key>=n`, `key<n`, `key<=n` on a config
 * key, a metric (its final value) or `state`; any other word is text found in
 * a row's name or config.  `on/off/yes/no/true/false` match booleans (and
 * those words), numbers match numerically (`lr=1e-3` is `lr=0.001`).  An
 * unknown key is named, never a silently empty table.
 */
import type { ConfigValue } from './rows';

export const OPERATORS = ['=', '!=', '>', '>=', '<', '<='] as const;
export type Operator = (typeof OPERATORS)[number];

export interface IFilterTerm {
  key: string | null;
  op: Operator | null;
  value: string;
}

export interface IParsedFilter {
  terms: IFilterTerm[];
  /** one sentence per problem ("no column 'lrr'; keys: lr, aux, seed, loss"), empty when none */
  problems: string[];
}

const TRUE_WORDS = new Set(['on', 'yes', 'true', 'y', '1']);
const FALSE_WORDS = new Set(['off', 'no', 'false', 'n', '0']);

/** The boolean a word means (`on`, `yes`, `true` / `off`, `no`, `false`), or null. */
export function booleanWord(word: string): boolean | null {
  const w = word.trim().toLowerCase();
  return TRUE_WORDS.has(w) ? true : FALSE_WORDS.has(w) ? false : null;
}

/** The filter's terms, and what is wrong with them given the keys the rows have. */
export function parseFilter(text: string, keys: string[]): IParsedFilter {
  const terms: IFilterTerm[] = [];
  const problems: string[] = [];
  const known = new Set(keys.map(k => k.toLowerCase()));
  for (const word of text
    .trim()
    .split(/\s+/)
    .filter(t => t)) {
    const m = /^([^<>=!]+?)\s*(!=|>=|<=|=|>|<)\s*(.*)$/.exec(word);
    if (!m) {
      terms.push({ key: null, op: null, value: word });
      continue;
    }
    const [, key, op, value] = m;
    if (!known.has(key.toLowerCase())) {
      problems.push(`no column '${key}'; filter on: ${keys.join(', ') || '(no columns yet)'}.`);
      continue;
    }
    if ((op === '>' || op === '<' || op === '>=' || op === '<=') && !Number.isFinite(Number(value))) {
      problems.push(`'${word}': ${op} needs a number, such as ${key}${op}0.01.`);
      continue;
    }
    terms.push({ key: keys.find(k => k.toLowerCase() === key.toLowerCase()) ?? key, op: op as Operator, value });
  }
  return { terms, problems };
}

/** Whether a cell's value `v` is `raw` as a filter means it. */
export function sameValue(v: ConfigValue | undefined, raw: string): boolean {
  if (v === undefined || v === null) {
    return raw === '' || raw.toLowerCase() === 'none' || raw.toLowerCase() === 'null';
  }
  if (typeof v === 'boolean') {
    const b = booleanWord(raw);
    return b !== null ? b === v : String(v) === raw.toLowerCase();
  }
  if (typeof v === 'number') {
    const n = Number(raw);
    if (raw.trim() !== '' && Number.isFinite(n)) {
      return v === n || Math.abs(v - n) <= 1e-12 * Math.max(Math.abs(v), Math.abs(n));
    }
    const b = booleanWord(raw);
    return b !== null && (v === 1) === b && (v === 0 || v === 1);
  }
  const b = booleanWord(raw);
  const word = v.toLowerCase();
  if (word === raw.toLowerCase()) {
    return true;
  }
  return b !== null && booleanWord(word) === b;
}

/** Whether a term holds for a value (`key` terms) or a row's texts (plain words). */
export function termHolds(term: IFilterTerm, value: ConfigValue | undefined, texts: string[]): boolean {
  if (term.key === null || term.op === null) {
    const needle = term.value.toLowerCase();
    return texts.some(t => t.toLowerCase().includes(needle));
  }
  if (term.op === '=' || term.op === '!=') {
    const same = sameValue(value, term.value);
    return term.op === '=' ? same : !same;
  }
  const n = Number(term.value);
  if (typeof value !== 'number') {
    return false;
  }
  return term.op === '>' ? value > n : term.op === '>=' ? value >= n : term.op === '<' ? value < n : value <= n;
}

/** The filter box's help: its keys and operators, with an example that matches these rows. */
export function filterHelp(keys: string[], example = ''): string {
  return (
    `Keep rows where every term holds. Keys: ${keys.join(', ') || '(none yet)'}. ` +
    `Operators: ${OPERATORS.join(' ')}; on/off, yes/no, true/false for booleans; other words search names.` +
    (example ? ` e.g. ${example}` : '')
  );
}

/** A placeholder that matches these rows: a real key with a value a row has (never one that keeps 0 rows). */
export function filterExample(rows: { config: { [key: string]: ConfigValue } }[]): string {
  for (const r of rows) {
    for (const [k, v] of Object.entries(r.config)) {
      if (typeof v === 'boolean') {
        return `${k}=${v ? 'on' : 'off'}`;
      }
    }
  }
  for (const r of rows) {
    for (const [k, v] of Object.entries(r.config)) {
      if (typeof v === 'number' || typeof v === 'string') {
        return `${k}=${String(v)}`;
      }
    }
  }
  return '';
}
