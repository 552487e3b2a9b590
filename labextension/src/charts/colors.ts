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

/**
 * The light theme's 12 colours: Tableau 10's hues and two more, each at least
 * 3:1 against white (WCAG's contrast for graphics), so no line is a faint
 * tint: the light tints of Tableau 10 (orange, teal, pink, light teal) are
 * darkened or replaced, and its yellow (1.6:1 on white) is a dark gold that
 * reads on white and on JupyterLab's dark backgrounds alike.  The static
 * copies of the charts (jupyter_cluster/widgets/static_render.py, PALETTE)
 * use the same list, in the same order.
 */
export const LIGHT_PALETTE = [
  '#4e79a7',
  '#d9730d',
  '#e15759',
  '#59a14f',
  '#b07aa1',
  '#3f9b94',
  '#b8860b',
  '#9c755f',
  '#8a8a1a',
  '#6f4e7c',
  '#2f95b8',
  '#d37295'
];

/**
 * The same hues for a dark background, each at least 3:1 against JupyterLab
 * dark's backgrounds (#111 and #212121): lighter, so that no line is a dark
 * slate on black; the gold is the light palette's, which reads on both.
 */
export const DARK_PALETTE = [
  '#7aa6d6',
  '#ffaa55',
  '#ff7f81',
  '#86cf7b',
  '#d5a2c8',
  '#9fe0da',
  '#b8860b',
  '#d1a98c',
  '#c9c95a',
  '#b08cc0',
  '#7cc6e6',
  '#f59dbd'
];

/** The backgrounds the palettes must read on: JupyterLab light's and dark's layout colours 0 and 1. */
export const THEME_BACKGROUNDS = { light: ['#ffffff'], dark: ['#111111', '#212121'] };

/** WCAG's relative luminance of a #rrggbb colour. */
export function luminance(hex: string): number {
  const [r, g, b] = [1, 3, 5].map(i => {
    const c = parseInt(hex.slice(i, i + 2), 16) / 255;
    return c <= 0.03928 ? c / 12.92 : Math.pow((c + 0.055) / 1.055, 2.4);
  });
  return 0.2126 * r + 0.7152 * g + 0.0722 * b;
}

/** WCAG's contrast ratio of two #rrggbb colours (1 to 21; 3 is the least for lines and marks). */
export function contrastRatio(a: string, b: string): number {
  const [hi, lo] = [luminance(a), luminance(b)].sort((x, y) => y - x);
  return (hi + 0.05) / (lo + 0.05);
}

/** FNV-1a: a stable 32-bit hash of a string (the same in every browser and in Python's sweep widget). */
export function hashKey(key: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < key.length; i++) {
    h ^= key.charCodeAt(i);
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h >>> 0;
}

/** Natural order, ties (e.g. "lr=0.1" and "lr=0.01") by code unit: the same whatever order the keys came in. */
function keyOrder(a: string, b: string): number {
  return naturalCompare(a, b) || (a < b ? -1 : a > b ? 1 : 0);
}

/**
 * The colour of each key: its hash's slot in the palette, or the next free
 * one when an earlier key (natural order) holds it.  The same key set always
 * gets the same colours, whichever chart asks.
 *
 * `more` are keys coloured after all of `keys` (natural order, the next free
 * slots): `keys` get exactly the colours they get alone.  The sweep table
 * passes its topic's series keys as `keys` (so each row's colour is its
 * series' colour in that topic's charts) and the rows with no series of
 * their own as `more`.  jupyter_cluster/widgets/static_render.py's
 * assign_colors() is the same rule (a shared fixture checks both).
 */
export function assignColors(keys: Iterable<string>, dark = false, more: Iterable<string> = []): Map<string, string> {
  const palette = dark ? DARK_PALETTE : LIGHT_PALETTE;
  const n = palette.length;
  const first = [...new Set(keys)].sort(keyOrder);
  const seen = new Set(first);
  const after = [...new Set(more)].filter(k => !seen.has(k)).sort(keyOrder);
  const out = new Map<string, string>();
  let used = new Set<number>();
  for (const key of [...first, ...after]) {
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

/** A colour lookup over `keys` (then `more`) for the option builders (a key not among them gets its hash's slot). */
export function colorLookup(
  keys: Iterable<string>,
  dark = false,
  more: Iterable<string> = []
): (key: string) => string {
  const colors = assignColors(keys, dark, more);
  const palette = dark ? DARK_PALETTE : LIGHT_PALETTE;
  return key => colors.get(key) ?? palette[hashKey(key) % palette.length];
}
