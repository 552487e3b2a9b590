/**
 * The charts' data handling: number and series-name formatting, smoothing,
 * the shared colour scale and run differences of vector metrics, exports.
 */
import {
  IVectorSeries,
  diffVectors,
  ema,
  formatNumber,
  matchSeries,
  metricsCode,
  seriesLabel,
  sharedRange,
  toCSV,
  vectorAxisName
} from '../charts/data';

describe('formatting', () => {
  it('rounds tooltip numbers and keeps integer steps integers', () => {
    expect(formatNumber(3.6996850967407227)).toBe('3.7');
    expect(formatNumber(121)).toBe('121');
    expect(formatNumber(0.123456)).toBe('0.1235');
    expect(formatNumber(1234.5678)).toBe('1235');
    expect(formatNumber(0.000012346)).toBe('1.235e-5');
    expect(formatNumber(-2.5e7)).toBe('-2.5e7');
    expect(formatNumber(null)).toBe('-');
    expect(formatNumber(NaN)).toBe('-');
  });

  it('names series without repeating the field', () => {
    expect(seriesLabel('walk=walk 0')).toBe('walk 0');
    expect(seriesLabel('member=3')).toBe('member 3');
    expect(seriesLabel('run=lr=0.1')).toBe('lr=0.1');
    expect(seriesLabel('run=balanced')).toBe('balanced');
    expect(seriesLabel('member=3, run=a')).toBe('member 3, a');
    expect(seriesLabel('all')).toBe('all');
  });

  it('names the vector axis by the reported key', () => {
    expect(vectorAxisName('tokens_per_expert')).toBe('expert');
    expect(vectorAxisName('load_per_gpu')).toBe('gpu');
    expect(vectorAxisName('histogram')).toBe('index');
  });
});

describe('smoothing', () => {
  it('is a debiased EMA that starts at the first value and keeps gaps', () => {
    const pts: [number, number | null][] = [
      [0, 10],
      [1, 10],
      [2, null],
      [3, 20]
    ];
    const out = ema(pts, 0.9);
    expect(out[0]).toEqual([0, 10]); // no pull towards zero at the start
    expect(out[1][1]).toBeCloseTo(10);
    expect(out[2]).toEqual([2, null]);
    // the third value moves the average only part of the way to 20
    expect(out[3][1]!).toBeGreaterThan(10);
    expect(out[3][1]!).toBeLessThan(15);
    expect(ema(pts, 0)).toBe(pts);
  });
});

describe('vector metrics', () => {
  const collapsed: IVectorSeries = {
    steps: [0, 1],
    rows: [
      [240, 0, 0],
      [230, 5, 5]
    ]
  };
  const balanced: IVectorSeries = {
    steps: [1, 2],
    rows: [
      [80, 85, 75],
      [82, 80, 78]
    ]
  };

  it('puts every run on one colour scale', () => {
    expect(sharedRange({ 'run=collapsed': collapsed, 'run=balanced': balanced })).toEqual([0, 240]);
    expect(sharedRange({})).toEqual([0, 1]);
    expect(sharedRange({ a: { steps: [0], rows: [[3, 3]] } })).toEqual([3, 4]);
  });

  it('differences two runs at the steps both have', () => {
    const d = diffVectors(collapsed, balanced);
    expect(d.steps).toEqual([1]);
    expect(d.rows).toEqual([[150, -80, -70]]);
    const ragged = diffVectors({ steps: [0], rows: [[1, null, 3]] }, { steps: [0], rows: [[1, 2]] });
    expect(ragged.rows).toEqual([[0, null, null]]);
  });
});

describe('exports and filter', () => {
  const model = {
    topic: 'es',
    scalars: {
      reward: {
        'walk=walk 0': [[0, 1.5]] as [number, number | null][],
        'walk=walk 1': [[0, null]] as [number, number | null][]
      }
    },
    vectors: { load: { all: { steps: [3], rows: [[1, 2]] } } },
    dropped: 0
  };

  it('writes CSV with one line per point or cell', () => {
    expect(toCSV(model).trim().split('\n')).toEqual([
      'value,series,step,index,y',
      'reward,walk=walk 0,0,,1.5',
      'reward,walk=walk 1,0,,',
      'load,all,3,0,1',
      'load,all,3,1,2'
    ]);
  });

  it('filters series by key or label', () => {
    expect(Object.keys(matchSeries(model, 'WALK 1').scalars.reward)).toEqual(['walk=walk 1']);
    expect(matchSeries(model, 'walk 1').vectors).toEqual({});
    expect(matchSeries(model, '')).toBe(model);
  });

  it('writes the code that loads the whole topic', () => {
    expect(metricsCode('es')).toBe('import jupyter_cluster as jc\ndf = jc.metrics("es")');
  });
});
