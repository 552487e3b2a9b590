/**
 * Text rules shared by the charts, the sidebar panel and the sweep table: the
 * natural order of keys, numbers as labels, HTML escaping (pure functions).
 */

/** Text for a tooltip's HTML. */
export function escapeHTML(s: string): string {
  return s.replace(/[&<>"]/g, c => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;' })[c] ?? c);
}

/**
 * Numbers in a key: an optional sign (after no letter, digit, `_` or `.`),
 * digits, an optional decimal part and exponent ("lr=0.003", "lr=1e-4", "x=-2").
 */
const NUMBER_IN_KEY = /(?<![A-Za-z0-9_.])-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|\d+(?:\.\d+)?(?:[eE][-+]?\d+)?/g;

type KeyPart = [0, number, ''] | [1, 0, string];

/** A key's parts: numbers by value, the text between them in lower case. */
function keyParts(s: string): KeyPart[] {
  const out: KeyPart[] = [];
  let last = 0;
  for (const m of s.matchAll(NUMBER_IN_KEY)) {
    const at = m.index ?? 0;
    if (at > last) {
      out.push([1, 0, s.slice(last, at).toLowerCase()]);
    }
    out.push([0, Number(m[0]), '']);
    last = at + m[0].length;
  }
  if (last < s.length) {
    out.push([1, 0, s.slice(last).toLowerCase()]);
  }
  return out;
}

/**
 * Natural order of series keys, configs and names: numbers by value, decimals
 * and exponents included ("lr=0.001" < "lr=0.003" < "lr=0.01" < "lr=1e-1";
 * "trial=2" < "trial=10"), text case-insensitively; 0 for keys that differ
 * only in notation ("lr=0.1", "lr=0.10").  The same rule as
 * jupyter_cluster/widgets/static_render.py's natural_key().
 */
export function naturalCompare(a: string, b: string): number {
  const x = keyParts(a);
  const y = keyParts(b);
  for (let i = 0; i < Math.min(x.length, y.length); i++) {
    const [p, q] = [x[i], y[i]];
    if (p[0] !== q[0]) {
      return p[0] - q[0];
    }
    if (p[1] !== q[1]) {
      return p[1] < q[1] ? -1 : 1;
    }
    if (p[2] !== q[2]) {
      return p[2] < q[2] ? -1 : 1;
    }
  }
  return x.length - y.length;
}

/**
 * A number for a tooltip or label: integers as integers, others with four
 * significant digits (3.6996850967407227 -> "3.7", 121 -> "121", 0.000012345 -> "1.234e-5").
 */
export function formatNumber(v: number | null | undefined): string {
  if (v === null || v === undefined || !Number.isFinite(v)) {
    return '-';
  }
  if (Number.isInteger(v) && Math.abs(v) < 1e6) {
    return String(v);
  }
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e6)) {
    return v
      .toExponential(3)
      .replace(/\.?0+e/, 'e')
      .replace('e+', 'e');
  }
  return String(Number(v.toPrecision(4)));
}
