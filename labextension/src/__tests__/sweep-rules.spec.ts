/**
 * The sweep table's rules, without a browser: the filter, the axes' scales,
 * which way a metric is better, and groups with their aggregates.
 */
import { axisChoices, axisKind } from '../sweep/axes';
import { bestFirstDescending, bestRowIds, bestValue, defaultMetric, lowerIsBetter } from '../sweep/direction';
import { booleanWord, filterExample, filterHelp, parseFilter, sameValue } from '../sweep/filter';
import { aggregate, groupBy, meanText } from '../sweep/groups';
import { columnNotation } from '../sweep/notation';
import { axisSwitches, parallelOption, switchedKinds } from '../sweep/parallel';
import { filterProblems, filterRows, groupKeys, groupRows } from '../sweep/model';
import type { ISweepRow } from '../sweep/rows';

/** The sweep: lr × aux × seed (30 rows), loss falling with lr, acc rising. */
function sweepRows(): ISweepRow[] {
  const rows: ISweepRow[] = [];
  for (const lr of [1e-4, 3e-4, 1e-3, 3e-3, 1e-2]) {
    for (const aux of [true, false]) {
      for (const seed of [0, 1, 2]) {
        const loss = 1 / (1 + 100 * lr) + (aux ? 0 : 0.1) + seed * 0.01;
        rows.push({
          id: `r|lr=${lr}, aux=${aux}, seed=${seed}`,
          name: `lr=${lr}, aux=${aux}, seed=${seed}`,
          config: { lr, aux, seed },
          final: { acc: 1 - loss, loss },
          best: { acc: 1 - loss, loss }
        });
      }
    }
  }
  return rows;
}

describe('the filter', () => {
  const rows = sweepRows();

  it('accepts on/off/yes/no/true/false for booleans, and numbers as numbers', () => {
    expect(filterRows(rows, 'aux=on')).toHaveLength(15);
    expect(filterRows(rows, 'aux=no')).toHaveLength(15);
    expect(filterRows(rows, 'aux=TRUE lr=1e-3')).toHaveLength(3);
    expect(filterRows(rows, 'lr>0.001 aux=on')).toHaveLength(6); // the old placeholder matched 0 rows
    expect(filterRows(rows, 'lr>=0.001 seed!=0')).toHaveLength(12);
    expect(booleanWord('Yes')).toBe(true);
    expect(booleanWord('off')).toBe(false);
    expect(booleanWord('maybe')).toBeNull();
    expect(sameValue(0.001, '1e-3')).toBe(true);
    expect(sameValue('on', 'true')).toBe(true);
  });

  it('names an unknown key instead of showing an empty table', () => {
    expect(filterProblems(rows, 'lrr>0.01')).toEqual(["no column 'lrr'; filter on: lr, aux, seed, acc, loss, state."]);
    expect(filterRows(rows, 'lrr>0.01')).toHaveLength(30); // the unknown term is left out, not "0 rows"
    expect(filterProblems(rows, 'lr>big')[0]).toContain('needs a number');
    expect(parseFilter('seed=1 text', ['seed']).terms).toHaveLength(2);
  });

  it('lists its keys and operators, and its example matches rows', () => {
    const example = filterExample(rows);
    expect(example).toBe('aux=on');
    expect(filterRows(rows, example).length).toBeGreaterThan(0);
    const help = filterHelp(['lr', 'aux'], example);
    expect(help).toContain('Keys: lr, aux');
    expect(help).toContain('= != > >= < <=');
    expect(help).toContain('on/off');
  });
});

describe("an axis's scale", () => {
  it('is log for positive values over two decades, categories for few values, linear otherwise', () => {
    expect(axisKind([1e-4, 3e-4, 1e-3, 1e-2])).toBe('log');
    expect(axisKind([0, 1, 2])).toBe('category'); // a seed: no 0.5 ticks
    expect(axisKind([true, false])).toBe('category');
    expect(axisKind([0.1, 0.2, 0.35, 0.4, 0.5, 0.6, 0.7])).toBe('linear');
    expect(axisKind([-1.5, 100.25, 3.5, 7.25, 9.5, 11.5, 12.5])).toBe('linear');
    expect(axisKind([-1, 100])).toBe('category'); // two integers: two categories
    expect(axisChoices([1e-4, 1e-2])).toEqual(['log', 'linear', 'category']);
    expect(axisChoices([0, 1])).toEqual(['linear', 'category']);
  });

  it('reaches the parallel coordinates, and ticked rows stand out there', () => {
    const rows = sweepRows();
    const option = parallelOption(rows, 'loss', false, () => '#123456', new Set([rows[0].id]));
    const axes = option.parallelAxis as { name: string; type: string; data?: string[] }[];
    expect(axes.map(a => `${a.name}:${a.type}`)).toEqual(['lr:log', 'aux:category', 'seed:category', 'loss:value']);
    expect(axes[2].data).toEqual(['0', '1', '2']);
    const data = (option.series as { data: { lineStyle: { width: number; opacity: number } }[] }[])[0].data;
    expect(data[0].lineStyle.width).toBe(3);
    expect(data[1].lineStyle.opacity).toBeLessThan(0.5);
  });
});

describe("a metric's direction", () => {
  it('is lower-is-better for loss-like names, as the kernel decides best', () => {
    expect(lowerIsBetter('loss')).toBe(true);
    expect(lowerIsBetter('val_loss')).toBe(true);
    expect(lowerIsBetter('error_rate')).toBe(true);
    expect(lowerIsBetter('acc')).toBe(false);
    expect(bestValue('loss', [0.3, 0.1, null])).toBe(0.1);
    expect(bestValue('acc', [0.3, 0.1])).toBe(0.3);
    expect(defaultMetric(['acc', 'loss'])).toBe('loss'); // not the alphabetically first
    expect(bestFirstDescending('loss')).toBe(false); // the first click on loss: best (lowest) first
    expect(bestFirstDescending('acc')).toBe(true);
  });
});

describe('groups', () => {
  it('by lr and aux: 10 groups of n = 3 with mean ± sd and best of the final loss', () => {
    const groups = groupBy(sweepRows(), ['lr', 'aux'], ['loss', 'acc']);
    expect(groups).toHaveLength(10);
    expect(groups.every(g => g.stats.loss.n === 3)).toBe(true);
    expect(groups[0].label).toBe('lr=0.0001, aux=off'); // groups.ts's own notation (the table passes its own)
    const g = groups.find(x => x.label === 'lr=0.001, aux=on')!;
    expect(g.stats.loss.mean).toBeCloseTo(1 / 1.1 + 0.01);
    expect(g.stats.loss.sd).toBeCloseTo(0.01);
    expect(g.stats.loss.best).toBeCloseTo(1 / 1.1); // lowest: a loss
    expect(g.stats.acc.best).toBeCloseTo(1 - 1 / 1.1); // highest: an accuracy
    expect(meanText(g.stats.loss, v => v.toFixed(3))).toBe('0.919 ± 0.010');
    expect(aggregate('loss', [null])).toEqual({ mean: null, sd: null, n: 0, best: null });
    expect(groupBy(sweepRows(), [], ['loss'])).toEqual([]);
  });
});

describe('the table grouped by two keys', () => {
  it('orders groups by value (numbers as numbers) and labels them in the table notation', () => {
    const rows = sweepRows();
    const groups = groupRows(rows, 'lr,aux', ['loss']);
    expect(groups).toHaveLength(10);
    expect(groups.slice(0, 3).map(g => g.label)).toEqual([
      'lr=1e-4, aux=false',
      'lr=1e-4, aux=true',
      'lr=3e-4, aux=false'
    ]);
    expect(groups.every(g => g.rows.length === 3 && g.stats.loss.n === 3)).toBe(true);
    // the legend of the grouped curves: lr=0.001 before lr=0.003 before lr=0.01 (not by string)
    const byLr = groupRows(rows, 'lr').map(g => g.label);
    // (one notation in the column: all with exponents, not 1e-4 beside 0.001)
    expect(byLr).toEqual(['lr=1e-4', 'lr=3e-4', 'lr=1e-3', 'lr=3e-3', 'lr=1e-2']);
    expect(groupKeys(' lr, aux ')).toEqual(['lr', 'aux']);
  });
});

describe('one notation per column', () => {
  it('writes a column with exponents throughout where one value needs it', () => {
    const lr = columnNotation([1e-4, 3e-4, 1e-3, 1e-2]);
    expect([1e-4, 1e-3, 1e-2].map(lr)).toEqual(['1e-4', '1e-3', '1e-2']);
    const plain = columnNotation([0.1, 0.25, 3]);
    expect([0.1, 0.25, 3].map(plain)).toEqual(['0.1', '0.25', '3']);
    expect(columnNotation([0, 1, 2])(2)).toBe('2');
  });
});

describe('the best run per metric and the axis switch', () => {
  const rows = [0, 1, 2, 3].map(i => ({
    id: `r:${i}`,
    name: `trial=${i}`,
    config: { lr: [1e-4, 1e-3, 1e-2, 1e-1][i], seed: i % 2, opt: i < 2 ? 'adam' : 'sgd', shift: i - 1 },
    final: { loss: [0.5, 0.2, 0.9, 0.2][i], acc: [0.7, 0.9, 0.4, 0.95][i] },
    best: {}
  }));

  it('marks the lowest loss and the highest accuracy, the first row on a tie', () => {
    const best = bestRowIds(rows, ['loss', 'acc', 'missing']);
    expect(best.get('loss')).toBe('r:1'); // 0.2 twice: the first in table order
    expect(best.get('acc')).toBe('r:3');
    expect(best.has('missing')).toBe(false);
  });

  it('offers each axis the scales its values allow, starting on the automatic one', () => {
    const axes = axisSwitches(rows as never, 'loss', {});
    const by = Object.fromEntries(axes.map(a => [a.key, a]));
    expect(by.lr).toMatchObject({ kind: 'log', auto: 'log', choices: ['log', 'linear', 'category'] });
    expect(by.seed).toMatchObject({ kind: 'category', choices: ['linear', 'category'] }); // a 0: no log
    expect(by.opt).toMatchObject({ kind: 'category', choices: ['category'] });
    expect(by.shift.choices).not.toContain('log');
    expect(by.loss.choices).not.toContain('category'); // a metric is a value
    expect(switchedKinds(axes)).toEqual({});
  });

  it('draws the scale the user switched to, and ignores one the values do not allow', () => {
    const axes = axisSwitches(rows as never, 'loss', { lr: 'linear', opt: 'log', seed: 'linear' });
    expect(switchedKinds(axes)).toEqual({ lr: 'linear', seed: 'linear' });
    const option = parallelOption(rows as never, 'loss', false, null, null, switchedKinds(axes));
    const kinds = (option.parallelAxis as { name: string; axisKind: string }[]).map(a => `${a.name}:${a.axisKind}`);
    expect([...kinds].sort()).toEqual(['loss:linear', 'lr:linear', 'opt:category', 'seed:linear', 'shift:category']);
    const auto = parallelOption(rows as never, 'loss');
    expect((auto.parallelAxis as { axisKind: string }[])[0].axisKind).toBe('log');
  });
});
