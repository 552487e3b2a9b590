/**
 * The charts' data handling: number and series-name formatting, smoothing,
 * the shared colour scale and run differences of vector metrics, exports.
 */
import {
  IMetricsModel,
  IVectorSeries,
  X_AXIS_NAMES,
  diffVectors,
  ema,
  formatDuration,
  formatX,
  matchSeries,
  metricsCode,
  onAxis,
  pointsOnAxis,
  seriesLabel,
  sharedRange,
  timeAt,
  timeOrigin,
  toCSV,
  truncatedText,
  vectorAxisName,
  withoutSeries
} from '../charts/data';
import { formatNumber } from '../common/text';

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
    expect(vectorAxisName('histogram')).toBe('histogram[i]'); // never a bare "index"
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

  it('says when the curves lost their oldest points to the history cap', () => {
    expect(truncatedText(model)).toBeNull();
    expect(truncatedText({ ...model, truncated: 0 })).toBeNull();
    expect(truncatedText({ ...model, truncated: 100000 })).toBe(
      ` · curves truncated: the oldest ${(100000).toLocaleString()} points were evicted`
    );
  });

  it('writes the code that loads the whole topic', () => {
    expect(metricsCode('es')).toBe('import jupyter_cluster as jc\ndf = jc.metrics("es")');
  });
});

describe('x axis: step, wall time, relative time', () => {
  const T = 1_700_000_000;
  const model: IMetricsModel = {
    topic: 'es',
    scalars: {
      reward: {
        'member=0': [
          [0, 1],
          [1, 2],
          [2, null],
          [4, 3]
        ],
        'member=1': [
          [0, 5],
          [9, 6]
        ]
      }
    },
    vectors: {},
    dropped: 0,
    times: {
      'member=0': [
        [0, T + 10],
        [2, T + 14],
        [4, T + 30]
      ],
      'member=1': [[0, T]]
    }
  };

  it('finds the time of a step: exact, interpolated, none outside the reports', () => {
    const pairs = model.times!['member=0'];
    expect(timeAt(pairs, 0)).toBe(T + 10);
    expect(timeAt(pairs, 1)).toBe(T + 12);
    expect(timeAt(pairs, 4)).toBe(T + 30);
    expect(timeAt(pairs, 5)).toBeNull();
    expect(timeAt([], 0)).toBeNull();
  });

  it('puts the points on the chosen axis; relative time from the earliest report of any series', () => {
    expect(timeOrigin(model)).toBe(T);
    const pts = model.scalars.reward['member=0'];
    expect(pointsOnAxis(pts, model.times!['member=0'], 'step', T)).toBe(pts);
    expect(pointsOnAxis(pts, model.times!['member=0'], 'relative', T)).toEqual([
      [10, 1],
      [12, 2],
      [14, null],
      [30, 3]
    ]);
    expect(pointsOnAxis(pts, model.times!['member=0'], 'wall', T)[3]).toEqual([(T + 30) * 1000, 3]);
    // a series without times has no points on a time axis (step 9 of member 1 has no time either)
    expect(pointsOnAxis(pts, undefined, 'relative', T)).toEqual([]);
    expect(onAxis(model.scalars.reward, model, 'relative')['member=1']).toEqual([[0, 5]]);
  });

  it('draws a time axis in time order when the steps were reported out of order (parallel tasks)', () => {
    const pairs: [number, number][] = [
      [0, T],
      [1, T + 5],
      [2, T + 2]
    ];
    const pts: [number, number][] = [
      [0, 0],
      [1, 10],
      [2, 20]
    ];
    expect(pointsOnAxis(pts, pairs, 'relative', T)).toEqual([
      [0, 0],
      [2, 20],
      [5, 10]
    ]);
  });

  it('keeps the origin when the earliest series is hidden', () => {
    const shown = withoutSeries(model, ['member=1']);
    expect(Object.keys(shown.scalars.reward)).toEqual(['member=0']);
    expect(onAxis(shown.scalars.reward, model, 'relative')['member=0'][0]).toEqual([10, 1]);
    expect(emptyTimes()).toBeNull();
  });

  it('labels the x value for each choice', () => {
    expect(Object.keys(X_AXIS_NAMES)).toEqual(['step', 'wall', 'relative']);
    expect(formatX(121, 'step')).toBe('step 121');
    expect(formatX(65, 'relative')).toBe('+1:05');
    expect(formatX(new Date(2026, 0, 2, 3, 4, 5).getTime(), 'wall')).toBe('03:04:05');
    expect(formatDuration(4.56)).toBe('4.6 s');
    expect(formatDuration(3725)).toBe('1:02:05');
  });
});

function emptyTimes(): number | null {
  return timeOrigin({ topic: '', scalars: {}, vectors: {}, dropped: 0 });
}
