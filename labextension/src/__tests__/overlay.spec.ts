/**
 * The overlay chart's data: chosen metrics from one or several topics on one
 * chart, and how their y axes are shared.
 */
import type { IMetricsModel } from '../charts/data';
import {
  IOverlayPick,
  addPick,
  overlayLegend,
  overlayLines,
  overlayOption,
  parsePick,
  pickKey,
  pickKept,
  pickTopics,
  removePick,
  sourceKey
} from '../charts/overlay';

const rl: IMetricsModel = {
  topic: 'rl',
  scalars: {
    reward: {
      'member=0': [
        [0, 10],
        [1, 20],
        [2, 30]
      ],
      'member=1': [
        [0, 0],
        [1, 50],
        [2, null]
      ]
    },
    loss: {
      all: [
        [0, 0.5],
        [1, 0.25],
        [2, 0.125]
      ]
    }
  },
  vectors: {},
  dropped: 0,
  times: {
    'member=0': [
      [0, 100],
      [2, 104]
    ],
    'member=1': [
      [0, 101],
      [2, 105]
    ],
    all: [
      [0, 100],
      [2, 102]
    ]
  }
};

const sys: IMetricsModel = {
  topic: 'sys',
  scalars: {
    gpu_mem: {
      all: [
        [0, 1e9],
        [5, 3e9]
      ]
    }
  },
  vectors: {},
  dropped: 0,
  times: {
    all: [
      [0, 90],
      [5, 95]
    ]
  }
};

const pick = (topic: string, value: string, series: string | null = null): IOverlayPick => ({ topic, value, series });

describe('picking metrics for the overlay', () => {
  it('round-trips a pick through its key and rejects anything else', () => {
    const p = pick('rl', 'reward', 'member=0');
    expect(parsePick(pickKey(p))).toEqual({ ...p, cluster: null });
    expect(parsePick(pickKey(pick('rl', 'loss')))).toEqual({ ...pick('rl', 'loss'), cluster: null });
    expect(parsePick('')).toBeNull();
    expect(parsePick('["rl", 3, null]')).toBeNull();
    expect(parsePick('{"topic": "rl"}')).toBeNull();
  });

  it('adds without duplicates; a value with every series covers its single series', () => {
    let picks = addPick([], pick('rl', 'reward', 'member=0'));
    picks = addPick(picks, pick('rl', 'reward', 'member=0'));
    expect(picks).toHaveLength(1);
    picks = addPick(picks, pick('rl', 'reward'));
    expect(picks).toEqual([pick('rl', 'reward')]);
    expect(addPick(picks, pick('rl', 'reward', 'member=1'))).toBe(picks);
    picks = addPick(picks, pick('sys', 'gpu_mem'));
    expect(pickTopics(picks, 'rl')).toEqual(['sys']);
    expect(removePick(picks, pick('sys', 'gpu_mem'))).toEqual([pick('rl', 'reward')]);
  });
});

describe('an earlier run the server kept, on the same overlay', () => {
  const earlier: IMetricsModel = {
    ...rl,
    scalars: {
      reward: {
        'member=0': [
          [0, 5],
          [1, 6],
          [2, 7]
        ]
      }
    },
    times: {
      'member=0': [
        [0, 1000],
        [2, 1010]
      ]
    }
  };
  const kept = 'rl-run.stopped-120000';
  const sources = { rl, [sourceKey('rl', kept)]: earlier };

  it('keys, parses and lists picks of a kept cluster apart from the same value of this one', () => {
    const p = pick('rl', 'reward', null);
    const k = { ...p, cluster: kept };
    expect(parsePick(pickKey(k))).toEqual(k);
    expect(parsePick('["rl","reward",null]')).toEqual({ ...p, cluster: null });
    const picks = addPick(addPick([], p), k);
    expect(picks).toHaveLength(2);
    expect(pickTopics(picks, 'other')).toEqual(['rl']);
    expect(pickKept(picks)).toEqual([{ cluster: kept, topic: 'rl' }]);
  });

  it("shares the metric's axis, names the run, and starts its relative time at its own first report", () => {
    const o = overlayLines(
      sources,
      [pick('rl', 'reward', 'member=0'), { ...pick('rl', 'reward', 'member=0'), cluster: kept }],
      'relative'
    );
    expect(o.axes).toBe('shared');
    expect(o.lines.map(l => l.name)).toEqual(['reward · member 0', `${kept} · reward · member 0`]);
    // this run's origin is its first report (100 s), the kept run's its own (1000 s)
    expect(o.lines[0].points[0][0]).toBe(0);
    expect(o.lines[1].points).toEqual([
      [0, 5],
      [5, 6],
      [10, 7]
    ]);
  });
});

describe('the overlay lines and their y axes', () => {
  it('one metric (several runs): one shared axis with its real values', () => {
    const o = overlayLines({ rl }, [pick('rl', 'reward')]);
    expect(o.axes).toBe('shared');
    expect(o.axisNames).toEqual(['reward']);
    expect(o.lines.map(l => l.name)).toEqual(['reward · member 0', 'reward · member 1']);
    expect(o.lines[1].points).toEqual([
      [0, 0],
      [1, 50],
      [2, null]
    ]);
    expect(o.lines.every(l => l.axis === 0)).toBe(true);
  });

  it('two metrics of two units: one axis by default, two (the second on the right) on request', () => {
    const one = overlayLines({ rl }, [pick('rl', 'reward', 'member=0'), pick('rl', 'loss')]);
    expect([one.axes, one.units, one.axisNames]).toEqual(['shared', 2, ['reward, loss']]);
    expect(one.lines.every(l => l.axis === 0)).toBe(true);
    const o = overlayLines({ rl }, [pick('rl', 'reward', 'member=0'), pick('rl', 'loss')], 'step', 'dual');
    expect(o.axes).toBe('dual');
    expect(o.axisNames).toEqual(['reward', 'loss']);
    expect(o.lines.map(l => [l.name, l.axis])).toEqual([
      ['reward · member 0', 0],
      ['loss', 1]
    ]);
    expect(o.lines[1].points).toEqual(rl.scalars.loss.all);
  });

  it('three metrics from two topics, scaled to 0-1 on request: each over its own range, the real values kept', () => {
    const picks = [pick('rl', 'reward'), pick('rl', 'loss'), pick('sys', 'gpu_mem')];
    expect(overlayLines({ rl, sys }, picks).axes).toBe('shared');
    const o = overlayLines({ rl, sys }, picks, 'step', 'normalised');
    expect(o.axes).toBe('normalised');
    // names say the topic when the picks span topics
    expect(o.lines.map(l => l.name)).toEqual([
      'rl: reward · member 0',
      'rl: reward · member 1',
      'rl: loss',
      'sys: gpu_mem'
    ]);
    // reward's range is shared by its runs (0..50), so they stay comparable with each other
    expect(o.lines[0].points).toEqual([
      [0, 0.2],
      [1, 0.4],
      [2, 0.6]
    ]);
    expect(o.lines[1].points).toEqual([
      [0, 0],
      [1, 1],
      [2, null]
    ]);
    const loss = o.lines[2].points.map(p => p[1] as number);
    expect(loss[0]).toBe(1);
    expect(loss[1]).toBeCloseTo(1 / 3);
    expect(loss[2]).toBe(0);
    expect(o.lines[3].raw).toEqual(sys.scalars.gpu_mem.all);
  });

  it('the sharing can be forced; a flat metric scales to the middle', () => {
    const flat: IMetricsModel = {
      ...sys,
      scalars: {
        c: {
          all: [
            [0, 3],
            [1, 3]
          ]
        }
      }
    };
    const o = overlayLines({ rl, sys: flat }, [pick('rl', 'loss'), pick('sys', 'c')], 'step', 'normalised');
    expect(o.axes).toBe('normalised');
    expect(o.lines[1].points).toEqual([
      [0, 0.5],
      [1, 0.5]
    ]);
    expect(overlayLines({ rl }, [pick('rl', 'reward'), pick('rl', 'loss')], 'step', 'shared').axes).toBe('shared');
  });

  it('puts lines of several topics on one time origin, and draws nothing for what is not there yet', () => {
    const o = overlayLines({ rl, sys }, [pick('rl', 'loss'), pick('sys', 'gpu_mem'), pick('gone', 'x')], 'relative');
    // the earliest report of both topics (sys at 90) is time 0
    expect(o.lines.map(l => l.points[0][0])).toEqual([10, 0]);
    expect(o.lines).toHaveLength(2);
    const wall = overlayLines({ rl }, [pick('rl', 'loss')], 'wall');
    expect(wall.lines[0].points[0][0]).toBe(100_000);
    expect(overlayLines({}, [pick('rl', 'loss')]).lines).toEqual([]);
    // a line from another topic than the chart's own says its topic
    const away = overlayLines({ sys }, [pick('sys', 'gpu_mem')], 'step', 'auto', 'rl');
    expect([away.lines[0].name, away.axisNames[0]]).toEqual(['sys: gpu_mem', 'sys: gpu_mem']);
    expect(overlayLines({ sys }, [pick('sys', 'gpu_mem')], 'step', 'auto', 'sys').lines[0].name).toBe('gpu_mem');
  });

  it('a narrow chart wraps its legend onto rows instead of paging it', () => {
    const name = 'x'.repeat(20); // 30 + 120 px each
    expect(overlayLegend([name], 240)).toEqual({ rows: 0, paged: false });
    expect(overlayLegend([name, name], 240)).toEqual({ rows: 2, paged: false });
    expect(overlayLegend([name, name, name], 700)).toEqual({ rows: 1, paged: false });
    expect(overlayLegend(Array(5).fill(name), 240).rows).toBe(5);
    // too many to wrap: one paging row
    expect(overlayLegend(Array(9).fill(name), 240)).toEqual({ rows: 1, paged: true });
    const o = overlayLines({ rl }, [pick('rl', 'reward'), pick('rl', 'loss')]);
    const option = overlayOption(o, { compact: true, width: 240 }, () => '#000') as {
      legend: { type: string };
      grid: { bottom: number };
    };
    // "reward · member 0", "reward · member 1", "loss · member 0", "loss · member 1" at the sidebar's width
    const { rows } = overlayLegend(
      o.lines.map(l => l.name),
      240
    );
    expect(rows).toBeGreaterThan(1);
    expect(option.legend.type).toBe('plain');
    expect(option.grid.bottom).toBe(34 + rows * 18);
    const many = overlayOption({ ...o, lines: Array(9).fill(o.lines[0]) }, { width: 240 }, () => '#000') as {
      legend: { type: string };
    };
    expect(many.legend.type).toBe('scroll');
  });

  it('the chart option (two axes asked for) has one y axis per side, the right-axis lines dashed', () => {
    const o = overlayLines({ rl }, [pick('rl', 'reward', 'member=0'), pick('rl', 'loss')], 'step', 'dual');
    const option = overlayOption(o, { compact: false }, () => '#000') as {
      yAxis: { name: string; position: string }[];
      series: { yAxisIndex: number; lineStyle: { type: string } }[];
    };
    expect(option.yAxis.map(a => [a.name, a.position])).toEqual([
      ['reward', 'left'],
      ['loss', 'right']
    ]);
    expect(option.series.map(s => [s.yAxisIndex, s.lineStyle.type])).toEqual([
      [0, 'solid'],
      [1, 'dashed']
    ]);
  });
});
