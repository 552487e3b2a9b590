/**
 * The sweep table's data: sorting (numbers as numbers), filtering, grouping
 * with mean ± sd bands, and the options of the curves and parallel views.
 */
import { readFileSync } from 'fs';
import { join } from 'path';

import { THEME_BACKGROUNDS, assignColors, contrastRatio } from '../charts/colors';
import type { Point } from '../charts/data';
import {
  ISweep,
  columns,
  compareValues,
  curvesOption,
  filterProblems,
  filterRows,
  groupRows,
  meanBand,
  rowColorKey,
  rowSeries,
  rowsComplete,
  seriesOfRow,
  sortRows,
  sweepColors,
  sweepFromTable
} from '../sweep/model';
import type { ISweepRow } from '../sweep/rows';
import type { ITableRow } from '../sweep/model';
import { parallelColours, parallelOption } from '../sweep/parallel';

const row = (i: number, lr: number, aux: boolean, loss: number): ISweepRow => ({
  id: `r:${i}`,
  name: `lr=${lr}, aux=${aux}`,
  state: i === 3 ? 'error' : 'finished',
  config: { lr, aux, opt: i % 2 ? 'adam' : 'sgd' },
  final: { loss },
  best: { loss: loss - 0.1 }
});

const rows = [row(0, 0.1, true, 0.5), row(1, 0.01, false, 0.2), row(2, 0.001, true, 1.5), row(3, 0.02, false, 10)];
const curve = (...ys: number[]): Point[] => ys.map((y, x) => [x, y]);
const sweep: ISweep = {
  rows,
  curves: { loss: { 'r:0': curve(1, 0.5), 'r:1': curve(1, 0.2), 'r:2': curve(2, 1.5), 'r:3': curve(3, 10) } }
};

describe('sweep table', () => {
  it('has the name, state, each config key and each metric final and best as columns', () => {
    expect(columns(sweep).map(c => c.id)).toEqual([
      'name',
      'state',
      'config:lr',
      'config:aux',
      'config:opt',
      'final:loss',
      'best:loss'
    ]);
  });

  it('sorts numbers as numbers and text naturally, empty cells last either way', () => {
    const lr = columns(sweep).find(c => c.id === 'config:lr')!;
    expect(sortRows(rows, lr).map(r => r.config.lr)).toEqual([0.001, 0.01, 0.02, 0.1]);
    expect(sortRows(rows, lr, true).map(r => r.config.lr)).toEqual([0.1, 0.02, 0.01, 0.001]);
    expect([compareValues(2, 10), compareValues('run 2', 'run 10'), compareValues(null, 1)].map(Math.sign)).toEqual([
      -1, -1, 1
    ]);
    const withEmpty = [...rows, { ...row(4, 0.5, true, 0), final: {} }];
    const loss = columns(sweep).find(c => c.id === 'final:loss')!;
    expect(sortRows(withEmpty, loss, true).map(r => r.id)).toEqual(['r:3', 'r:2', 'r:0', 'r:1', 'r:4']);
    expect(sortRows(withEmpty, loss).map(r => r.id)).toEqual(['r:1', 'r:0', 'r:2', 'r:3', 'r:4']);
  });

  it('filters by key=value, comparisons and text; all terms must hold', () => {
    expect(filterRows(rows, 'aux=true').map(r => r.id)).toEqual(['r:0', 'r:2']);
    expect(filterRows(rows, 'lr>=0.01 loss<1').map(r => r.id)).toEqual(['r:0', 'r:1']);
    expect(filterRows(rows, 'opt!=adam').map(r => r.id)).toEqual(['r:0', 'r:2']);
    expect(filterRows(rows, 'state=error').map(r => r.id)).toEqual(['r:3']);
    expect(filterRows(rows, 'adam').map(r => r.id)).toEqual(['r:1', 'r:3']);
    // an unknown key is named (filterProblems), not a silently empty table
    expect(filterRows(rows, 'momentum=0.9')).toHaveLength(rows.length);
    expect(filterProblems(rows, 'momentum=0.9')[0]).toContain("no column 'momentum'");
    expect(filterRows(rows, '  ')).toBe(rows);
  });

  it('groups by a config value and draws each group mean ± sd', () => {
    expect(groupRows(rows, 'aux').map(g => [g.value, g.rows.length])).toEqual([
      ['false', 2],
      ['true', 2]
    ]);
    const band = meanBand([curve(1, 2, 3), curve(3, 4)]);
    expect(band.map(b => [b.x, b.mean, b.lo, b.hi, b.n])).toEqual([
      [0, 2, 1, 3, 2],
      [1, 3, 2, 4, 2],
      [2, 3, 3, 3, 1]
    ]);
    const grouped = curvesOption(sweep, rows, 'loss', () => '#000', 'aux');
    expect(grouped.lines).toEqual(['aux=false (n=2)', 'aux=true (n=2)']);
    const series = grouped.option.series as { id: string; stack?: string; data: Point[] }[];
    // per group: the band's floor, its spread stacked on it, the mean
    expect(series.map(s => s.id)).toEqual([
      'band:false:lo',
      'band:false:spread',
      'mean:false',
      'band:true:lo',
      'band:true:spread',
      'mean:true'
    ]);
    expect(series[2].data).toEqual([
      [0, 2],
      [1, 5.1]
    ]);
  });

  it('wraps the legend onto rows that fit the width, else leaves it to the tooltip', () => {
    const two = curvesOption(sweep, [rows[1], rows[2]], 'loss', () => '#000', null, 480);
    expect(two.legend).toBe(true);
    expect((two.option.grid as { bottom: number }).bottom).toBe(52);
    // at the sidebar's width the two names take two rows, and the plot leaves them room
    const narrow = curvesOption(sweep, [rows[1], rows[2]], 'loss', () => '#000', null, 230);
    expect([narrow.legend, (narrow.option.grid as { bottom: number }).bottom]).toEqual([true, 34 + 36]);
    // many long names at that width: no legend, the tooltip names the lines (and counts the rest)
    const many: ISweep = { rows: [], curves: { loss: {} } };
    for (let i = 0; i < 14; i++) {
      many.rows.push({ id: `r${i}`, name: `lr=0.00${i}, aux=true, opt=adam`, config: {}, final: {}, best: {} });
      many.curves.loss[`r${i}`] = [[0, i]];
    }
    const crowded = curvesOption(many, many.rows.slice(0, 6), 'loss', () => '#000', null, 230);
    expect(crowded.legend).toBe(false);
    expect((crowded.option.grid as { bottom: number }).bottom).toBe(30);
    const all = curvesOption(many, many.rows, 'loss', () => '#000', null, 2000);
    expect(all.legend).toBe(false);
    const tip = (all.option.tooltip as { formatter: (p: unknown) => string }).formatter(
      many.rows.map((r, i) => ({ seriesName: r.name, value: [0, i], axisValue: 0 }))
    );
    expect(tip.split('<br/>')).toHaveLength(1 + 12 + 1);
    expect(tip).toContain('… 2 more');
  });

  it('overlays the chosen rows, each in its colour', () => {
    const chosen = curvesOption(sweep, [rows[1], rows[2]], 'loss', id => (id === 'r:1' ? '#111' : '#222'));
    expect(chosen.lines).toEqual(['lr=0.01, aux=false', 'lr=0.001, aux=true']);
    expect((chosen.option.series as { itemStyle: { color: string } }[]).map(s => s.itemStyle.color)).toEqual([
      '#111',
      '#222'
    ]);
  });

  it('maps config to the metric in parallel coordinates: numbers on value axes, the rest as categories', () => {
    const option = parallelOption(rows, 'loss') as {
      parallelAxis: { name: string; type: string; data?: string[] }[];
      series: { data: { value: unknown[] }[] }[];
      visualMap: { dimension: number; min: number; max: number };
    };
    expect(option.parallelAxis.map(a => [a.name, a.type])).toEqual([
      ['lr', 'log'], // 0.001 to 0.1: two decades
      ['aux', 'category'],
      ['opt', 'category'],
      ['loss', 'value']
    ]);
    expect(option.parallelAxis[1].data).toEqual(['false', 'true']);
    expect(option.series[0].data[0].value).toEqual([0.1, 'true', 'sgd', 0.5]);
    expect([option.visualMap.dimension, option.visualMap.min, option.visualMap.max]).toEqual([3, 0.2, 10]);
  });

  it('draws each parallel line in its row colour when asked, with no value scale', () => {
    const option = parallelOption(rows, 'loss', false, r => (r.id === 'r:1' ? '#111' : '#222')) as {
      series: { data: { lineStyle?: { color: string } }[] }[];
      visualMap?: unknown;
    };
    expect(option.visualMap).toBeUndefined();
    expect(option.series[0].data.map(d => d.lineStyle?.color)).toEqual(['#222', '#111', '#222', '#222']);
  });

  it("colours the parallel lines on a scale whose every stop reads on the theme's background", () => {
    for (const dark of [false, true]) {
      const option = parallelOption(rows, 'loss', dark) as { visualMap: { inRange: { color: string[] } } };
      expect(option.visualMap.inRange.color).toEqual(parallelColours(dark));
      for (const c of parallelColours(dark)) {
        for (const bg of THEME_BACKGROUNDS[dark ? 'dark' : 'light']) {
          expect([c, bg, contrastRatio(c, bg) >= 3]).toEqual([c, bg, true]);
        }
      }
    }
  });
});

describe('sweep from the runs table', () => {
  it("colours a row as its series in the metric charts: the rule and the Python widget's agree", () => {
    const fx = JSON.parse(readFileSync(join(__dirname, 'fixtures/colours.json'), 'utf8')).rows as {
      rows: ITableRow[];
      topics: { [topic: string]: string[] };
      series: (string | null)[];
      colorKeys: string[];
      ids: string[];
      colors: string[];
    };
    const models = Object.entries(fx.topics).map(([topic, keys]) => ({
      topic,
      scalars: { loss: Object.fromEntries(keys.map(k => [k, curve(1)])) }
    }));
    expect(rowSeries(fx.rows, models)).toEqual({ series: fx.series, colorKeys: fx.colorKeys });
    const s = sweepFromTable(fx.rows, models);
    expect(s.rows.map(r => r.id)).toEqual(fx.ids);
    const colorOf = sweepColors(s);
    expect(s.rows.map(r => colorOf(rowColorKey(r)))).toEqual(fx.colors);
  });

  it("gives a row its series' colour of the topic's charts, whatever other rows there are", () => {
    const keys = ['trial=0', 'trial=1', 'trial=2', 'trial=3'];
    const topic = { topic: 'sweep', scalars: { loss: Object.fromEntries(keys.map(k => [k, curve(1)])) } };
    const table: ITableRow[] = [
      ...[3, 1, 0, 2].map(t => ({ run: 'r1', key: `lr=0.1, trial=${t}`, item: t, config: { lr: 0.1, trial: t } })),
      { run: 'r0', key: null, item: null, name: 'baseline', config: {} }
    ];
    const s = sweepFromTable(table, [topic]);
    const chart = assignColors(keys); // what the topic's metric charts draw
    const colorOf = sweepColors(s);
    expect(s.rows.slice(0, 4).map(r => colorOf(rowColorKey(r)))).toEqual(
      [3, 1, 0, 2].map(t => chart.get(`trial=${t}`))
    );
    // the row with no series gets a colour no series has (fewer than 12 in all)
    expect([...chart.values()]).not.toContain(colorOf(rowColorKey(s.rows[4])));
    // grouped: each group's colour
    expect(rowColorKey(s.rows[0], 'lr')).toBe('lr=0.1');
  });

  it('gives the rows a filter keeps distinct colours, even where the topic order repeats them', () => {
    const keys = Array.from({ length: 30 }, (_, i) => `trial=${i}`);
    const topic = { topic: 'sweep', scalars: { loss: Object.fromEntries(keys.map(k => [k, curve(1)])) } };
    const table: ITableRow[] = keys.map((_, t) => ({ run: 'r1', key: `trial=${t}`, item: t, config: { trial: t } }));
    const s = sweepFromTable(table, [topic]);
    const all = sweepColors(s);
    const kept = s.rows.filter(r => [0, 12, 24].includes(r.config.trial as number));
    expect(new Set(kept.map(r => all(rowColorKey(r)))).size).toBe(1); // 12 colours: the topic order repeats them
    const shown = sweepColors(s, false, null, kept);
    expect(new Set(kept.map(r => shown(rowColorKey(r)))).size).toBe(3);
    // all 30 shown: the metric charts' colours, none more than 3 times
    const counts = new Map<string, number>();
    s.rows.forEach(r => counts.set(all(rowColorKey(r)), (counts.get(all(rowColorKey(r))) ?? 0) + 1));
    expect(Math.max(...counts.values())).toBe(3);
  });

  it("finds a row's curve by its item key or its identity fields, as the Python widget does", () => {
    const table = [
      { run: 'r1', key: 'aux=True, lr=0.1, trial=0', config: { trial: 0, lr: 0.1, aux: true }, final: { loss: 1 } },
      { run: 'r1', key: 'aux=False, lr=0.1, trial=1', config: { trial: 1, lr: 0.1, aux: false }, final: { loss: 2 } },
      { run: 'r2', key: null, item: null, name: 'baseline', config: {}, final: { loss: 3 } }
    ];
    expect(seriesOfRow(table[0], ['trial=0', 'trial=1', 'all'])).toBe('trial=0');
    expect(seriesOfRow(table[1], ['aux=False, lr=0.1, trial=1', 'trial=1'])).toBe('aux=False, lr=0.1, trial=1');
    expect(seriesOfRow(table[0], ['aux=False'])).toBeNull();
    expect(seriesOfRow(table[0], ['aux=True'])).toBe('aux=True'); // Python's str(True)
    expect(seriesOfRow(table[2], ['all'])).toBeNull();
    const s = sweepFromTable(table, [{ scalars: { loss: { 'trial=0': curve(3, 1), 'trial=1': curve(4, 2) } } }], 'es');
    expect(s.rows.map(r => [r.id, r.name])).toEqual([
      ['r1:aux=True, lr=0.1, trial=0', 'aux=True, lr=0.1, trial=0'],
      ['r1:aux=False, lr=0.1, trial=1', 'aux=False, lr=0.1, trial=1'],
      ['r2:', 'baseline']
    ]);
    // an item's own curve (GET runs/RUN/curves) comes first; the series fill in the rest
    const own = sweepFromTable(table, [{ scalars: { loss: { 'trial=0': curve(3, 1), 'trial=1': curve(4, 2) } } }], '', {
      r1: { loss: { 'aux=True, lr=0.1, trial=0': curve(9, 9) } },
      r2: { loss: { '': curve(7) } }
    });
    expect(own.curves.loss).toEqual({
      'r1:aux=True, lr=0.1, trial=0': curve(9, 9),
      'r1:aux=False, lr=0.1, trial=1': curve(4, 2),
      'r2:': curve(7)
    });
    expect(s.curves.loss).toEqual({
      'r1:aux=True, lr=0.1, trial=0': curve(3, 1),
      'r1:aux=False, lr=0.1, trial=1': curve(4, 2)
    });
  });
});

describe('rowsComplete', () => {
  const tableRow = (key: string | null, final?: { [m: string]: number }): ITableRow => ({ run: 'r1', key, final });
  const pts = [[0, 1] as Point];

  it('holds when every item row has its finals and a curve for each', () => {
    const rows = [tableRow('a', { loss: 1 }), tableRow('b', { loss: 2 }), tableRow(null)];
    expect(rowsComplete(rows, { loss: { a: pts, b: pts } })).toBe(true);
  });

  it('fails while a row has no finals yet, or a final without its curve', () => {
    expect(rowsComplete([tableRow('a', { loss: 1 }), tableRow('b')], { loss: { a: pts } })).toBe(false);
    expect(rowsComplete([tableRow('a', { loss: 1, acc: 2 })], { loss: { a: pts } })).toBe(false);
    expect(rowsComplete([tableRow('a', { loss: 1 })], { loss: { a: [] } })).toBe(false);
  });
});
