/**
 * One colour per run, the same in every chart, legend, series list and sweep
 * table (no DOM, no ECharts).
 *
 * A colour comes from the series key itself (a hash picks its slot in the
 * palette), not from its position in one chart's list: a run drawn alone, or
 * with another value's runs, or in the overlay, keeps its colour.  Keys whose
 * hash slot is taken by an earlier key (in natural order) move to the next
 * free slot, so up to PALETTE.length runs never share a colour; beyond that
 * colours repeat.  Both palettes have the same hues in the same order, the
 * dark one lighter so that every line reads on a dark background.
 */
import { naturalCompare } from './data';

/** 12 hues that stay apart for readers with the common colour-vision deficiencies (Tableau 10 and two more). */
export const LIGHT_PALETTE = [
  '#4e79a7',
  '#f28e2b',
  '#e15759',
  '#59a14f',
  '#b07aa1',
  '#76b7b2',
  '#edc948',
  '#9c755f',
  '#ff9da7',
  '#6f4e7c',
  '#86bcb6',
  '#d37295'
];

/** The same hues, lightened for a dark background (none darker than 50 % lightness). */
export const DARK_PALETTE = [
  '#7aa6d6',
  '#ffaa55',
  '#ff7f81',
  '#86cf7b',
  '#d5a2c8',
  '#9fe0da',
  '#ffe27a',
  '#d1a98c',
  '#ffc2c8',
  '#b08cc0',
  '#b1e3dd',
  '#f59dbd'
];

/** FNV-1a: a stable 32-bit hash of a string (the same in every browser and in Python's sweep widget). */
export function hashKey(key: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < key.length; i++) {
    h ^= key.charCodeAt(i);
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h >>> 0;
}

/**
 * The colour of each key: its hash's slot in the palette, or the next free
 * one when an earlier key (natural order) holds it.  The same key set always
 * gets the same colours, whichever chart asks.
 */
export function assignColors(keys: Iterable<string>, dark = false): Map<string, string> {
  const palette = dark ? DARK_PALETTE : LIGHT_PALETTE;
  const n = palette.length;
  const sorted = [...new Set(keys)].sort(naturalCompare);
  const out = new Map<string, string>();
  let used = new Set<number>();
  for (const key of sorted) {
    if (used.size === n) {
      used = new Set(); // every colour taken once: a second round
    }
    let slot = hashKey(key) % n;
    while (used.has(slot)) {
      slot = (slot + 1) % n;
    }
    used.add(slot);
    out.set(key, palette[slot]);
  }
  return out;
}

/** A colour lookup over `keys` for the option builders (a key not among them gets its hash's slot). */
export function colorLookup(keys: Iterable<string>, dark = false): (key: string) => string {
  const colors = assignColors(keys, dark);
  const palette = dark ? DARK_PALETTE : LIGHT_PALETTE;
  return key => colors.get(key) ?? palette[hashKey(key) % palette.length];
}
