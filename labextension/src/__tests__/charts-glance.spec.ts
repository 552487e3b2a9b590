/**
 * Charts a researcher reads at a glance: one colour per run everywhere, one
 * axis for metrics of one unit, log y that says what it dropped, top-k and
 * the nearest-series hover list, round heatmap ticks.
 */
import { readFileSync } from 'fs';
import { join } from 'path';

import {
  DARK_PALETTE,
  LIGHT_PALETTE,
  THEME_BACKGROUNDS,
  assignColors,
  colorLookup,
  contrastRatio,
  distinctColors,
  distinctEnough,
  hashKey
} from '../charts/colors';
import { naturalCompare } from '../common/text';
import type { IMetricsModel, Point } from '../charts/data';
import { niceRange, niceStep, roundTickIndices, heatmapOption } from '../charts/heatmaps';
import {
  lineChart,
  logDropped,
  logDroppedText,
  onScale,
  symexp,
  symlog,
  symlogConstant,
  symlogLabel,
  symlogTicks,
  tooltipRows,
  topKeys
} from '../charts/lines';
import { axesToggleState, toggledAxes } from '../charts/controls';
import { OVERLAY_DASHES, overlayLines, overlayOption, sameUnit, unitGroups } from '../charts/overlay';

const line = (...ys: (number | null)[]): Point[] => ys.map((y, i) => [i, y]);

describe('colour per run', () => {
  const keys = ['run=a', 'run=b', 'run=c', 'run=d', 'run=e', 'run=f'];

  it('is the same for a key whichever chart or order asks, and distinct up to the palette size', () => {
    const a = assignColors(keys);
    const b = assignColors([...keys].reverse());
    expect([...a.entries()].sort()).toEqual([...b.entries()].sort());
    const many = Array.from({ length: LIGHT_PALETTE.length }, (_, i) => `member=${i}`);
    expect(new Set(assignColors(many).values()).size).toBe(LIGHT_PALETTE.length);
    // beyond the palette colours repeat, every key still gets one
    const more = assignColors([...many, 'member=99']);
    expect(more.size).toBe(LIGHT_PALETTE.length + 1);
  });

  it('is assigned in natural order, not hashed: a lone key gets the first colour, on both themes the same slot', () => {
    expect(colorLookup(['walk=walk 0'])('walk=walk 0')).toBe(LIGHT_PALETTE[0]);
    expect(colorLookup(['walk=walk 0'], true)('walk=walk 0')).toBe(DARK_PALETTE[0]);
    const ordered = assignColors(['trial=10', 'trial=2', 'trial=1']);
    expect(['trial=1', 'trial=2', 'trial=10'].map(k => ordered.get(k))).toEqual(LIGHT_PALETTE.slice(0, 3));
    // a chart that draws only some of the runs looks them up in the topic's key set: same colours
    const all = colorLookup(keys);
    const light = assignColors(keys);
    expect(keys.map(all)).toEqual(keys.map(k => light.get(k)));
    expect(hashKey('abc')).toBe(0x1a47e90b); // FNV-1a (only a key outside the key set falls back to it)
  });

  it('has well-separated colours: any two differ by more than red, pink and mauve did', () => {
    // CIE76 (Euclidean CIELAB) distances; the old 12 (Tableau 10 and two more) had 17.9 light, 13.5 dark
    const lab = (hex: string): number[] => {
      const [r, g, b] = [1, 3, 5].map(i => {
        const c = parseInt(hex.slice(i, i + 2), 16) / 255;
        return c <= 0.04045 ? c / 12.92 : Math.pow((c + 0.055) / 1.055, 2.4);
      });
      const xyz = [
        (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047,
        0.2126 * r + 0.7152 * g + 0.0722 * b,
        (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883
      ].map(t => (t > 216 / 24389 ? Math.cbrt(t) : ((24389 / 27) * t + 16) / 116));
      return [116 * xyz[1] - 16, 500 * (xyz[0] - xyz[1]), 200 * (xyz[1] - xyz[2])];
    };
    const least = (palette: string[], n = palette.length): number => {
      let min = Infinity;
      for (let i = 0; i < n; i++) {
        for (let j = i + 1; j < n; j++) {
          const [a, b] = [lab(palette[i]), lab(palette[j])];
          min = Math.min(min, Math.hypot(a[0] - b[0], a[1] - b[1], a[2] - b[2]));
        }
      }
      return min;
    };
    expect(least(LIGHT_PALETTE)).toBeGreaterThan(30);
    expect(least(DARK_PALETTE)).toBeGreaterThan(25);
    // the first few (what a few runs get) are further apart still
    expect(least(LIGHT_PALETTE, 4)).toBeGreaterThan(least(LIGHT_PALETTE));
  });

  it('colours the keys on screen among themselves when the topic colours would repeat', () => {
    const fx = JSON.parse(readFileSync(join(__dirname, 'fixtures/colours.json'), 'utf8')) as {
      shown: { keys: string[]; shown: string[]; colors: { [key: string]: string } }[];
    };
    for (const c of fx.shown) {
      const colorOf = distinctColors(c.shown, colorLookup(c.keys), false);
      expect(Object.fromEntries(c.shown.map(k => [k, colorOf(k)]))).toEqual(c.colors);
      expect(new Set(c.shown.map(colorOf)).size).toBe(c.shown.length);
    }
    // trial=0, 12 and 24 share the first colour in the topic's order: shown alone, three colours
    const topic = colorLookup(Array.from({ length: 26 }, (_, i) => `trial=${i}`));
    expect(new Set(['trial=0', 'trial=12', 'trial=24'].map(topic)).size).toBe(1);
    // shown keys that are distinct already keep the topic's colours (the metric charts' ones)
    const kept = distinctColors(['trial=1', 'trial=2'], topic);
    expect(kept('trial=2')).toBe(topic('trial=2'));
    // 26 keys shown: no colour more than 3 times
    const every = Array.from({ length: 26 }, (_, i) => `trial=${i}`);
    expect(distinctEnough(every, topic, LIGHT_PALETTE.length)).toBe(true);
  });

  it('every colour reads on its theme background (contrast >= 3:1)', () => {
    expect(contrastRatio('#ffffff', '#000000')).toBeCloseTo(21, 5);
    for (const c of LIGHT_PALETTE) {
      for (const bg of THEME_BACKGROUNDS.light) {
        expect([c, bg, contrastRatio(c, bg) >= 3]).toEqual([c, bg, true]);
      }
    }
    for (const c of DARK_PALETTE) {
      for (const bg of THEME_BACKGROUNDS.dark) {
        expect([c, bg, contrastRatio(c, bg) >= 3]).toEqual([c, bg, true]);
      }
    }
    // Tableau's weak yellow (#edc948, 1.6:1 on white) is not among them; twelve different colours in each
    expect(LIGHT_PALETTE).not.toContain('#edc948');
    expect(new Set(LIGHT_PALETTE).size).toBe(12);
    expect(new Set(DARK_PALETTE).size).toBe(12);
  });

  it("is the static copies' palette too (a saved notebook's chart keeps the live chart's colours)", () => {
    const py = readFileSync(join(__dirname, '../../../jupyter_cluster/widgets/static_render.py'), 'utf8');
    const block = /^PALETTE = \[([^\]]*)\]/m.exec(py);
    expect(block).not.toBeNull();
    expect(block![1].match(/#[0-9a-f]{6}/gi)).toEqual(LIGHT_PALETTE);
  });

  it('assigns the same colours as the static copies (a fixture both check) in whatever order keys come', () => {
    const fx = JSON.parse(readFileSync(join(__dirname, 'fixtures/colours.json'), 'utf8')) as {
      assign: { keys: string[]; more: string[]; colors: { [key: string]: string } }[];
    };
    expect(fx.assign.length).toBeGreaterThan(2);
    for (const c of fx.assign) {
      expect(Object.fromEntries(assignColors(c.keys, false, c.more))).toEqual(c.colors);
      expect(Object.fromEntries(assignColors([...c.keys].reverse(), false, [...c.more].reverse()))).toEqual(c.colors);
    }
  });

  it('gives `keys` their own colours whatever `more` keys come after them', () => {
    const keys = ['trial=0', 'trial=1', 'trial=2', 'all'];
    const alone = assignColors(keys);
    const more = ['r1:lr=0.1', 'r2:', 'trial=1', ...Array.from({ length: 12 }, (_, i) => `x=${i}`)];
    const both = assignColors(keys, false, more);
    keys.forEach(k => expect(both.get(k)).toBe(alone.get(k)));
    // the first 12 keys in all get 12 different colours
    expect(
      new Set([...keys, 'r1:lr=0.1', 'r2:', 'x=0', 'x=1', 'x=2', 'x=3', 'x=4', 'x=5'].map(k => both.get(k))).size
    ).toBe(12);
    expect(colorLookup(keys, true, more)('x=0')).toBe(assignColors(keys, true, more).get('x=0'));
  });
});

describe('overlay axes: one axis for metrics of one unit', () => {
  const es: IMetricsModel = {
    topic: 'es',
    scalars: {
      policy_mean: { all: line(0, 120, 480) },
      population_mean: { all: line(20, 90, 160) },
      loss: { all: line(0.9, 0.3, 0.1) },
      grad_norm: { all: line(1e4, 3e4, 2e4) }
    },
    vectors: {},
    dropped: 0
  };
  const pick = (value: string) => ({ topic: 'es', value, series: null });

  it('judges the unit from overlapping ranges within a factor of ten', () => {
    expect(sameUnit([0, 500], [20, 160])).toBe(true);
    expect(sameUnit([0, 400], [0, 1])).toBe(false);
    expect(sameUnit([10, 20], [30, 40])).toBe(false);
    expect(unitGroups([[0, 500], [20, 160], [0, 1], null])).toEqual([0, 0, 1, 0]);
  });

  it('two returns share one axis (defect 8); two units stay on one axis until two are asked for', () => {
    const returns = overlayLines({ es }, [pick('policy_mean'), pick('population_mean')]);
    expect([returns.axes, returns.units]).toEqual(['shared', 1]);
    expect(returns.axisNames).toEqual(['policy_mean, population_mean']);
    // reward and loss: one axis by default, the chart offers two (units > 1)
    const mixed2 = overlayLines({ es }, [pick('policy_mean'), pick('loss')]);
    expect([mixed2.axes, mixed2.units]).toEqual(['shared', 2]);
    expect(mixed2.lines.map(l => l.axis)).toEqual([0, 0]);
    expect(overlayLines({ es }, [pick('policy_mean'), pick('loss')], 'step', 'dual').axes).toBe('dual');
    // three metrics of two units: one axis; two on request, split by unit (the first unit left)
    const mixed = overlayLines({ es }, [pick('policy_mean'), pick('population_mean'), pick('loss')]);
    expect([mixed.axes, mixed.units]).toEqual(['shared', 2]);
    const two = overlayLines({ es }, [pick('policy_mean'), pick('population_mean'), pick('loss')], 'step', 'dual');
    expect(two.axisNames).toEqual(['policy_mean, population_mean', 'loss']);
    expect(two.lines.map(l => l.axis)).toEqual([0, 0, 1]);
    const three = overlayLines({ es }, [pick('policy_mean'), pick('loss'), pick('grad_norm')]);
    expect([three.axes, three.units]).toEqual(['shared', 3]);
    // one unit forced onto two axes: the first metric left, the rest right
    const forced = overlayLines({ es }, [pick('policy_mean'), pick('population_mean')], 'step', 'dual');
    expect(forced.lines.map(l => l.axis)).toEqual([0, 1]);
  });

  it('the two-axes toggle: shown only for two units or more, pressed while two axes are drawn', () => {
    expect(axesToggleState(1, 'shared')).toEqual({ shown: false, pressed: false, label: 'two axes' });
    expect(axesToggleState(2, 'shared')).toEqual({ shown: true, pressed: false, label: 'two axes' });
    expect(axesToggleState(2, 'dual')).toEqual({ shown: true, pressed: true, label: 'two axes ✓' });
    // forced onto two axes with one unit (the toolbar's menu): still shown, so it can be undone there
    expect(axesToggleState(1, 'dual').shown).toBe(true);
    // a click asks for two axes, a second one for the default (one axis); from 0-1 it asks for two
    expect([toggledAxes('auto'), toggledAxes('dual'), toggledAxes('normalised')]).toEqual(['dual', 'auto', 'dual']);
    const mixed = overlayLines({ es }, [pick('policy_mean'), pick('loss')]);
    expect(axesToggleState(mixed.units, mixed.axes).shown).toBe(true);
    const again = overlayLines({ es }, [pick('policy_mean'), pick('loss')], 'step', toggledAxes(mixed.axes));
    expect([again.axes, again.axisNames]).toEqual(['dual', ['policy_mean', 'loss']]);
  });

  it("draws a line in its run's colour and its metric's dash", () => {
    const o = overlayLines({ es }, [pick('policy_mean'), pick('loss')]);
    const option = overlayOption(o, {}, l => (l.series === 'all' ? '#123456' : '#000')) as {
      series: { lineStyle: { color: string; type: string } }[];
    };
    expect(option.series.map(s => [s.lineStyle.color, s.lineStyle.type])).toEqual([
      ['#123456', OVERLAY_DASHES[0]],
      ['#123456', OVERLAY_DASHES[1]]
    ]);
  });
});

describe('log y and symlog', () => {
  const walks = { 'walk=walk 0': line(0, -1, -3, -2), 'walk=walk 1': line(1, 2, 0, 4) };

  it('counts what a log axis cannot draw, per series, and says so', () => {
    expect(logDropped(walks)).toEqual({ 'walk=walk 0': 4, 'walk=walk 1': 1 });
    expect(logDroppedText(logDropped(walks), { 'walk=walk 0': 4, 'walk=walk 1': 4 })).toBe(
      'log y: 5 points ≤ 0 not drawn (walk 0: all 4; walk 1: 1) — try symlog'
    );
    expect(onScale(walks['walk=walk 1'], 'log').map(p => p[1])).toEqual([1, 2, null, 4]);
    const chart = lineChart('position', walks, { yScale: 'log', compact: false });
    expect(chart.notice).toContain('5 points ≤ 0 not drawn');
    expect((chart.option.yAxis as { type: string }).type).toBe('log');
  });

  it('symlog draws zero and negative values and inverts for the labels', () => {
    expect(symlogConstant(walks)).toBe(1);
    expect(symlogConstant({ a: line(0.003, -0.2) })).toBe(0.001);
    for (const y of [-300, -1, 0, 0.5, 42]) {
      expect(symexp(symlog(y, 1), 1)).toBeCloseTo(y, 9);
    }
    const chart = lineChart('position', walks, { yScale: 'symlog', compact: false });
    expect(chart.notice).toBe('');
    const drawn = (chart.option.series as { id: string; data: Point[] }[]).find(s => s.id === 'walk=walk 0');
    expect(drawn?.data.every(([, y]) => y !== null)).toBe(true);
  });

  it('symlog ticks are round real values (0.01 / 0.1 / 1 / 10), never "0.99 / 100"', () => {
    // c = 0.01: evenly spaced transformed ticks (1, 2, 3) read 0.09, 0.99, 9.99
    const c = 0.01;
    const ticks = symlogTicks(symlog(-0.02, c), symlog(40, c), c, 8);
    expect(ticks.map(t => symlogLabel(t, c))).toEqual(['-0.1', '-0.01', '0', '0.01', '0.1', '1', '10', '100']);
    // fewer wanted: every second (third, …) decade, still enclosing the data (-0.02 to 40), all round
    const few = symlogTicks(symlog(-0.02, c), symlog(40, c), c, 5).map(t => Number(symlogLabel(t, c)));
    expect(few.length).toBeLessThanOrEqual(5);
    expect(few[0]).toBeLessThanOrEqual(-0.02);
    expect(few[few.length - 1]).toBeGreaterThanOrEqual(40);
    expect(few).toContain(0);
    const chart = lineChart('pnl', { a: line(0.03, -0.02, 40, 7) }, { yScale: 'symlog', compact: false });
    const labels = (chart.option.yAxis as { symlogTicks: string[] }).symlogTicks;
    expect(labels.length).toBeGreaterThanOrEqual(3);
    for (const label of labels) {
      expect(label).toMatch(/^-?(0|1|10+|0\.0*1)$/);
    }
    expect(labels).toContain('0');
    // many decades: thinned to at most 7, 0 kept
    const wide = symlogTicks(symlog(-1e6, 1), symlog(1e6, 1), 1);
    expect(wide.length).toBeLessThanOrEqual(8);
    expect(wide).toContain(0);
  });
});

describe('many series', () => {
  const bySeries: { [k: string]: Point[] } = {};
  for (let i = 0; i < 200; i++) {
    bySeries[`member=${i}`] = line(0, i % 7 === 0 ? null : i);
  }

  it('keeps the top or bottom k by last value, series without a value last', () => {
    expect(topKeys(bySeries, { k: 3, order: 'top' })).toEqual(['member=197', 'member=198', 'member=199']);
    // the last finite value counts: members 0, 7, 14, ... end in a gap after 0
    expect(topKeys(bySeries, { k: 3, order: 'bottom' })).toEqual(['member=0', 'member=7', 'member=14']);
    const gaps = { a: line(null, null), b: line(5), c: line(1, null) };
    expect(topKeys(gaps, { k: 2, order: 'top' })).toEqual(['b', 'c']);
    expect(topKeys(gaps, { k: 2, order: 'bottom' })).toEqual(['b', 'c']);
    expect(topKeys(bySeries, null)).toHaveLength(200);
    const chart = lineChart('reward', bySeries, { topK: { k: 10, order: 'top' }, compact: false, width: 800 });
    expect(chart.keys).toHaveLength(10);
    expect(chart.hiddenByTopK).toBe(190);
    expect(chart.notice).toBe('top 10 of 200 by last value');
  });

  it('has no legend when it would not fit; the tooltip lists the series nearest the pointer', () => {
    const chart = lineChart('reward', bySeries, { compact: true, width: 250 });
    expect(chart.legend).toBe(false);
    const few = lineChart('reward', { a: line(1), b: line(2) }, { compact: true, width: 250 });
    expect(few.legend).toBe(true);
    // more than manySeries (12): no legend, however short the names
    const thirteen = Object.fromEntries(Array.from({ length: 13 }, (_, i) => [`m=${i}`, line(i)]));
    expect(lineChart('r', thirteen, { compact: false, width: 2000 }).legend).toBe(false);
    expect(lineChart('r', thirteen, { compact: false, width: 2000 }, () => undefined, 20).legend).toBe(true);
    const rows = [10, 50, 52, 90].map(v => ({ key: `k${v}`, name: `k${v}`, marker: '', value: v, raw: v }));
    const [near, rest] = tooltipRows(rows, 2, 51);
    expect(near.map(r => r.value)).toEqual([50, 52]);
    expect(rest).toBe(2);
    expect(tooltipRows(rows, 2, null)[0].map(r => r.value)).toEqual([90, 52]);
  });

  it("shows smoothed and raw values in the tooltip, and a many-series chart's nearest ones", () => {
    const chart = lineChart('loss', { a: line(10, 0, 10), b: line(1, 1, 1) }, { smoothing: 0.5, compact: false });
    const tooltip = (chart.option.tooltip as { formatter: (p: unknown) => string }).formatter;
    const html = tooltip([
      { seriesId: 'a', seriesName: 'a', axisValue: 1, value: [1, 0], dataIndex: 1 },
      { seriesId: 'raw:a', seriesName: 'a', axisValue: 1, value: [1, 0], dataIndex: 1 },
      { seriesId: 'b', seriesName: 'b', axisValue: 1, value: [1, 1], dataIndex: 1 }
    ]);
    expect(html).toContain('a: <b>3.333</b> <span style="opacity:0.7">(raw 0)</span>');
    expect(html).toContain('b: <b>1</b>');
    let pointer: number | null = 150;
    const many = lineChart(
      'reward',
      bySeries,
      { compact: false },
      () => undefined,
      12,
      () => pointer
    );
    const params = Object.keys(bySeries).map(k => ({
      seriesId: k,
      seriesName: k,
      axisValue: 1,
      value: bySeries[k][1],
      dataIndex: 1
    }));
    const near = (many.option.tooltip as { formatter: (p: unknown) => string }).formatter(params);
    expect(near.split('<br/>')[1]).toContain('member=150');
    expect(near).toContain('more further from the pointer');
    pointer = null;
    expect((many.option.tooltip as { formatter: (p: unknown) => string }).formatter(params)).toContain('member=199');
  });
});

describe('heatmaps: round ticks, one colour bar per scale', () => {
  it('picks round steps and ranges', () => {
    expect([niceStep(199, 5), niceStep(1, 5), niceStep(7000, 4)]).toEqual([50, 0.2, 2000]);
    expect(niceRange(0.013, 0.87)).toEqual([0, 1]);
    const steps = Array.from({ length: 200 }, (_, i) => i);
    expect([...roundTickIndices(steps)]).toEqual([0, 50, 100, 150]);
    // thinned steps: the first step at or after each multiple
    expect([...roundTickIndices([0, 3, 6, 9, 12, 15, 18, 21, 24, 27, 31], 3)]).toEqual([0, 7]); // steps 0 and 21 for a round step of 20
  });

  it('puts one bar per scale right of the grid, not under the last heatmap', () => {
    const v = {
      steps: [0, 1],
      rows: [
        [0.1, 0.9],
        [0.2, 0.8]
      ]
    };
    const option = heatmapOption('tokens_per_expert', { 'run=a': v, 'run=b': v, 'run=c': v }, 900, [
      'run=a',
      'run=b'
    ]) as {
      visualMap: { orient: string; right: number; min: number; max: number; seriesIndex: number[] }[];
    };
    expect(option.visualMap.map(m => [m.orient, m.right, m.seriesIndex])).toEqual([
      ['vertical', 8, [0, 1, 2]],
      ['vertical', 8, [3]]
    ]);
    expect([option.visualMap[0].min, option.visualMap[0].max]).toEqual([0, 1]);
  });

  it('titles each colour bar and names the vector axis after the value, never "index"', () => {
    const v = { steps: [0, 1], rows: [[0.1, 0.9]] };
    const option = heatmapOption('histogram', { 'run=a': v, 'run=b': v }, 900, ['run=a', 'run=b']) as {
      visualMap: { text: string[] }[];
      yAxis: { name: string }[];
    };
    expect(option.visualMap.map(m => m.text[0])).toEqual(['histogram', 'difference']);
    expect(option.yAxis.map(a => a.name)).toEqual(['histogram[i]', 'histogram[i]', 'histogram[i]']);
    const long = heatmapOption('tokens_per_expert', { 'run=a': v }, 900) as {
      visualMap: { text: string[] }[];
      yAxis: { name: string }[];
    };
    expect(long.visualMap[0].text[0]).toBe('tokens_per…');
    expect(long.yAxis[0].name).toBe('expert');
  });
});

describe('natural order of keys with decimals', () => {
  // lr=0.01 sorted before lr=0.003 (digit runs "01" < "003"): legends and colour slots by string
  const fx = JSON.parse(readFileSync(join(__dirname, 'fixtures/colours.json'), 'utf8')) as {
    natural: { cases: { keys: string[]; sorted: string[] }[] };
  };

  it('orders numbers by value, decimals and exponents included (the cases static_render.py checks too)', () => {
    expect(fx.natural.cases.length).toBeGreaterThan(3);
    for (const c of fx.natural.cases) {
      expect([...c.keys].sort(naturalCompare)).toEqual(c.sorted);
      expect([...c.keys].reverse().sort(naturalCompare)).toEqual(c.sorted);
    }
    expect(naturalCompare('lr=0.1', 'lr=0.10')).toBe(0);
  });

  it('gives colour slots and legend entries in that order', () => {
    const colors = assignColors(['lr=0.01', 'lr=0.003', 'lr=0.001']);
    expect(['lr=0.001', 'lr=0.003', 'lr=0.01'].map(k => colors.get(k))).toEqual(LIGHT_PALETTE.slice(0, 3));
    const chart = lineChart('loss', { 'lr=0.01': line(1), 'lr=0.003': line(2), 'lr=1e-4': line(3) });
    expect(chart.keys).toEqual(['lr=1e-4', 'lr=0.003', 'lr=0.01']);
  });
});
