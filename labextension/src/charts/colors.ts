/**
 * One colour per run, the same in every chart, legend, series list and sweep
 * table (no DOM, no ECharts).
 *
 * Colours are assigned, not hashed: the keys of a chart's topic (or a sweep's
 * rows, or its groups) are put in natural order and take the palette's slots
 * in turn, so up to PALETTE.length keys never share a colour, and the first
 * few keys get the most different ones (the palette is ordered so that every
 * prefix of it is as well separated as it can be).  Every chart of a topic
 * assigns over the topic's whole key set, so a run keeps its colour in a chart
 * that draws only some of the runs.  Where the rows on screen would share a
 * colour (a filter keeps three rows that the topic's order put 12 apart), the
 * sweep table colours the rows shown instead (distinctColors()).  Both
 * palettes have the same hues in the same order, the dark one lighter so that
 * every line reads on a dark background.
 */
import { naturalCompare } from '../common/text';

/**
 * The light theme's 12 colours (blue, olive, red, magenta, pine, orange, umber, teal, green, plum, rose, violet): chosen to be as far
 * apart as 12 colours can be (the least CIEDE2000 difference of any two is
 * 22, where Tableau 10 and two more had 9: red, pink and mauve) among those
 * with at least 3:1 contrast against white (WCAG's contrast for graphics).
 * The static copies of the charts (jupyter_cluster/widgets/static_render.py,
 * PALETTE) use the same list, in the same order.
 */
export const LIGHT_PALETTE = [
  '#3177ac',
  '#979500',
  '#a91315',
  '#de5dd4',
  '#045137',
  '#d47b10',
  '#584416',
  '#07a1a3',
  '#17a743',
  '#6f334c',
  '#c47f77',
  '#4a2ea7'
];

/**
 * The same hues for a dark background, each at least 3:1 against JupyterLab
 * dark's backgrounds (#111 and #212121): lighter, so that no line is a dark
 * slate on black (least CIEDE2000 difference of two: 21).
 */
export const DARK_PALETTE = [
  '#5190c8',
  '#b4b02a',
  '#d54234',
  '#fc79f0',
  '#418366',
  '#f39530',
  '#8c7444',
  '#3dbcbe',
  '#41c35c',
  '#a4637d',
  '#e19991',
  '#845fdf'
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
 * The colour of each key: the keys in natural order take the palette's slots
 * in turn (the 13th key the first slot again).  The same key set always gets
 * the same colours, whichever chart asks and in whatever order.
 *
 * `more` are keys coloured after all of `keys` (natural order, the next
 * slots): `keys` get exactly the colours they get alone.  The sweep table
 * passes its topic's series keys as `keys` (so each row's colour is its
 * series' colour in that topic's charts) and the rows with no series of
 * their own as `more`.  jupyter_cluster/widgets/static_render.py's
 * assign_colors() is the same rule (a shared fixture checks both).
 */
export function assignColors(keys: Iterable<string>, dark = false, more: Iterable<string> = []): Map<string, string> {
  const palette = dark ? DARK_PALETTE : LIGHT_PALETTE;
  const first = [...new Set(keys)].sort(keyOrder);
  const seen = new Set(first);
  const after = [...new Set(more)].filter(k => !seen.has(k)).sort(keyOrder);
  const out = new Map<string, string>();
  [...first, ...after].forEach((key, i) => out.set(key, palette[i % palette.length]));
  return out;
}

/**
 * Whether the colours `shown` keys get from `colors` are as distinct as they
 * can be: no colour used more often than the palette's size forces
 * (ceil(shown / palette size) times).
 */
export function distinctEnough(shown: string[], colorOf: (key: string) => string, paletteSize: number): boolean {
  const keys = [...new Set(shown)];
  const most = Math.ceil(keys.length / paletteSize);
  const uses = new Map<string, number>();
  for (const k of keys) {
    const c = colorOf(k);
    const n = (uses.get(c) ?? 0) + 1;
    if (n > most) {
      return false;
    }
    uses.set(c, n);
  }
  return true;
}

/**
 * The colours for the keys on screen: those of `colorOf` (the topic's
 * assignment, so that a row matches its curve in the metric charts) while the
 * shown keys' colours are distinct enough (distinctEnough()), else the shown
 * keys assigned among themselves (assignColors(shown)).  Python's
 * static_render.shown_colors() is the same rule.
 */
export function distinctColors(
  shown: string[],
  colorOf: (key: string) => string,
  dark = false
): (key: string) => string {
  const palette = dark ? DARK_PALETTE : LIGHT_PALETTE;
  if (distinctEnough(shown, colorOf, palette.length)) {
    return colorOf;
  }
  const own = assignColors(shown, dark);
  return key => own.get(key) ?? colorOf(key);
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
