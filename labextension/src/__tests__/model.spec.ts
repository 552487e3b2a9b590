/**
 * The panel's data handling: applying pushed messages, selection, series
 * filtering, formatting and input checks.
 */
import type { IMetricsModel } from '../charts/charts';
import {
  IPanelState,
  clearFinished,
  connectCode,
  failureDetails,
  filterSeries,
  formatBytes,
  groupJobs,
  initialState,
  jobProgress,
  memoryFraction,
  ownerText,
  parseWorkers,
  reduce,
  select,
  selectTopic,
  seriesKeys,
  clusterOfKernel,
  setActiveKernel,
  setOverlayTopics,
  setPinned,
  toggleFailures,
  toggleSeries,
  validName,
  visibleJobs,
  watchMessage
} from '../model';
import type { IClusterModel, IClusterSummary, IHistoryCluster, IJob } from '../messages';

function cluster(name: string, extra: Partial<IClusterSummary> = {}): IClusterSummary {
  return {
    name,
    backend: 'local',
    address: 'tcp://127.0.0.1:1',
    dashboard_link: null,
    owner_kind: 'kernel',
    owner_pid: 42,
    attached: false,
    started: 0,
    status: 'running',
    error: null,
    n_workers: 2,
    cores: 2,
    memory_limit: 0,
    jobs_running: 0,
    topics: [],
    kernels: [],
    ...extra
  };
}

function job(extra: Partial<IJob> = {}): IJob {
  return {
    job: 'j1',
    label: 'cell 3',
    kernel: 7,
    cluster: 'a',
    total: 10,
    done: 4,
    failed: 0,
    state: 'running',
    started: 1,
    updated: 2,
    failures: [],
    kernel_id: null,
    ...extra
  };
}

const metrics: IMetricsModel = {
  topic: 'rl',
  scalars: {
    reward: { 'member=1': [[0, 1]], 'member=2': [[0, 2]], 'member=10': [[0, 3]] },
    loss: { all: [[0, 0.5]] }
  },
  vectors: { load: { 'member=1': { steps: [0], rows: [[1, 2, 3]] } } },
  dropped: 0
};

describe('reduce', () => {
  it('selects the first cluster and keeps a valid selection', () => {
    let s = reduce(initialState(), { type: 'clusters', clusters: [cluster('a'), cluster('b')] });
    expect(s.selected).toBe('a');
    s = select(s, 'b');
    s = reduce(s, { type: 'clusters', clusters: [cluster('a'), cluster('b', { n_workers: 3 })] });
    expect(s.selected).toBe('b');
    expect(s.clusters[1].n_workers).toBe(3);
  });

  it('falls back when the selected cluster disappears, clearing its details', () => {
    let s = reduce(initialState(), { type: 'clusters', clusters: [cluster('a'), cluster('b')] });
    s = select(s, 'b');
    s = reduce(s, {
      type: 'cluster',
      name: 'b',
      model: { ...cluster('b'), owns_cluster: true, workers: [], memory: 0 } as IClusterModel
    });
    expect(s.detail?.name).toBe('b');
    s = reduce(s, { type: 'clusters', clusters: [cluster('a')] });
    expect(s.selected).toBe('a');
    expect(s.detail).toBeNull();
    s = reduce(s, { type: 'clusters', clusters: [] });
    expect(s.selected).toBeNull();
  });

  it('ignores details, topics and metrics of clusters not selected', () => {
    let s = reduce(initialState(), { type: 'clusters', clusters: [cluster('a'), cluster('b')] });
    const model = { ...cluster('b'), owns_cluster: true, workers: [], memory: 0 } as IClusterModel;
    expect(reduce(s, { type: 'cluster', name: 'b', model })).toBe(s);
    const topics = [{ topic: 'rl', version: 1, received: 1, dropped: 0, scalars: [], vectors: [], series: 1 }];
    expect(reduce(s, { type: 'topics', cluster: 'b', topics })).toBe(s);
    s = reduce(s, { type: 'topics', cluster: 'a', topics });
    expect(s.topic).toBe('rl');
    expect(reduce(s, { type: 'metrics', cluster: 'a', topic: 'other', data: metrics })).toBe(s);
    s = reduce(s, { type: 'metrics', cluster: 'a', topic: 'rl', data: metrics });
    expect(s.metrics).toBe(metrics);
  });

  it('keeps the chosen topic while it exists and drops stale points on change', () => {
    let s = reduce(initialState(), { type: 'clusters', clusters: [cluster('a')] });
    const t = (topic: string) => ({
      topic,
      version: 1,
      received: 1,
      dropped: 0,
      scalars: [],
      vectors: [],
      series: 1
    });
    s = reduce(s, { type: 'topics', cluster: 'a', topics: [t('x'), t('y')] });
    s = selectTopic(s, 'y');
    s = reduce(s, { type: 'metrics', cluster: 'a', topic: 'y', data: metrics });
    s = reduce(s, { type: 'topics', cluster: 'a', topics: [t('x'), t('y'), t('z')] });
    expect(s.topic).toBe('y');
    expect(s.metrics).toBe(metrics);
    s = reduce(s, { type: 'topics', cluster: 'a', topics: [t('x')] });
    expect(s.topic).toBe('x');
    expect(s.metrics).toBeNull();
    expect(watchMessage(s)).toEqual({ type: 'watch', cluster: 'a', topics: ['x'] });
  });

  it('stores jobs and errors', () => {
    let s = reduce(initialState(), {
      type: 'jobs',
      running: [job()],
      recent: [job({ job: 'j0', state: 'finished' })]
    });
    expect(s.jobs.running).toHaveLength(1);
    expect(s.jobs.recent[0].state).toBe('finished');
    s = reduce(s, { type: 'error', message: 'bad message' });
    expect(s.error).toBe('bad message');
  });
});

describe('series selection', () => {
  it('lists series keys in natural order', () => {
    expect(seriesKeys(metrics)).toEqual(['all', 'member=1', 'member=2', 'member=10']);
  });

  it('filters hidden series and drops values left empty', () => {
    const f = filterSeries(metrics, ['member=1', 'member=2']);
    expect(Object.keys(f.scalars.reward)).toEqual(['member=10']);
    expect(f.scalars.loss).toBeDefined();
    expect(f.vectors.load).toBeUndefined();
    expect(filterSeries(metrics, [])).toBe(metrics);
    expect(Object.keys(filterSeries(metrics, ['all']).scalars)).toEqual(['reward']);
  });

  it('toggles a series per topic', () => {
    let s = toggleSeries(initialState(), 'rl', 'member=2');
    expect(s.hidden.rl).toEqual(['member=2']);
    s = toggleSeries(s, 'rl', 'member=1');
    expect(s.hidden.rl).toEqual(['member=1', 'member=2']);
    s = toggleSeries(s, 'rl', 'member=2');
    expect(s.hidden.rl).toEqual(['member=1']);
    expect(s.hidden.other).toBeUndefined();
  });
});

describe('formatting', () => {
  it('formats bytes', () => {
    expect(formatBytes(0)).toBe('-');
    expect(formatBytes(512)).toBe('512 B');
    expect(formatBytes(1536)).toBe('1.5 kiB');
    expect(formatBytes(4 * 1024 ** 3)).toBe('4.0 GiB');
    expect(formatBytes(200 * 1024 ** 2)).toBe('200 MiB');
  });

  it('computes memory fractions within [0, 1]', () => {
    expect(memoryFraction({ memory: 50, memory_limit: 200 })).toBe(0.25);
    expect(memoryFraction({ memory: 500, memory_limit: 200 })).toBe(1);
    expect(memoryFraction({ memory: 5, memory_limit: 0 })).toBe(0);
  });

  it('names owners', () => {
    expect(ownerText({ owner_kind: 'panel', owner_pid: 3, attached: false })).toBe('panel');
    expect(ownerText({ owner_kind: 'kernel', owner_pid: 3, attached: true })).toBe('kernel 3 (attached)');
  });

  it('describes job progress, with failures and unknown totals', () => {
    expect(jobProgress(job())).toEqual({ fraction: 0.4, failedFraction: 0, text: '4 / 10' });
    // processed, failed included, as the notebook's line: a raised map's 3 done and 1 failed read 4 / 12
    expect(jobProgress(job({ failed: 2 })).text).toBe('6 / 10, 2 failed');
    expect(jobProgress(job({ done: 3, failed: 1, total: 12, state: 'failed' })).text).toBe('4 / 12, 1 failed');
    expect(jobProgress(job({ total: null }))).toEqual({ fraction: null, failedFraction: 0, text: '4 done' });
    expect(jobProgress(job({ total: null, state: 'finished' })).fraction).toBe(1);
    expect(jobProgress(job({ done: 12 })).fraction).toBe(1);
  });
});

describe('input checks', () => {
  it('accepts whole worker counts in range only', () => {
    expect(parseWorkers(' 4 ')).toEqual({ value: 4 });
    expect(parseWorkers('0')).toEqual({ value: 0 });
    for (const bad of ['', '-1', '2.5', 'four', '10001']) {
      expect(parseWorkers(bad)).toHaveProperty('error');
    }
    expect(parseWorkers('x', 'maximum')).toEqual({
      error: 'maximum must be a whole number from 0 to 10000.'
    });
  });

  it('checks cluster names like the server', () => {
    expect(validName('panel-1')).toBe(true);
    expect(validName('a.b_c')).toBe(true);
    for (const bad of ['', '-a', 'a b', 'x'.repeat(64), 'a/b']) {
      expect(validName(bad)).toBe(false);
    }
  });

  it('writes the connect code', () => {
    expect(connectCode('sweep')).toBe('%load_ext jupyter_cluster\n%cluster connect sweep');
  });
});

function kept(name: string, key: string): IHistoryCluster {
  return { ...cluster(key), status: 'stopped', cluster: name, stopped: 100, topics: ['rl'] };
}

function withMetrics(name: string): IPanelState {
  let s = reduce(initialState(), { type: 'clusters', clusters: [cluster('a'), cluster(name)] });
  s = select(s, name);
  const topics = [{ topic: 'rl', version: 1, received: 1, dropped: 0, scalars: ['reward'], vectors: [], series: 3 }];
  s = reduce(s, { type: 'topics', cluster: name, topics });
  return reduce(s, { type: 'metrics', cluster: name, topic: 'rl', data: metrics });
}

describe('stopping a cluster keeps what the panel showed', () => {
  it('keeps the curves when the selected cluster stops, then moves onto its kept history', () => {
    let s = withMetrics('b');
    // %cluster stop: b leaves the live list ...
    s = reduce(s, { type: 'clusters', clusters: [cluster('a')] });
    expect(s.selected).toBe('b');
    expect(s.metrics).toBe(metrics);
    // ... and the jobs message names the history the server kept for it
    s = reduce(s, {
      type: 'jobs',
      running: [],
      recent: [job({ cluster: 'b', state: 'finished' })],
      history: [kept('b', 'b.stopped-120000')]
    });
    expect(s.selected).toBe('b.stopped-120000');
    expect(s.metrics).toBe(metrics);
    expect(s.topic).toBe('rl');
    expect(s.jobs.recent).toHaveLength(1);
    // a later clusters message does not take the selection away
    s = reduce(s, { type: 'clusters', clusters: [cluster('a')] });
    expect(s.selected).toBe('b.stopped-120000');
    expect(s.metrics).toBe(metrics);
  });

  it('falls back when a stopped cluster had nothing kept', () => {
    let s = withMetrics('b');
    s = reduce(s, { type: 'clusters', clusters: [cluster('a')] });
    s = reduce(s, { type: 'jobs', running: [], recent: [], history: [] });
    expect(s.selected).toBe('a');
    expect(s.metrics).toBeNull();
  });
});

describe('the selection follows new work unless pinned', () => {
  it('moves to the cluster where a job starts (Run All in a notebook on another cluster)', () => {
    let s = reduce(initialState(), { type: 'clusters', clusters: [cluster('a'), cluster('b')] });
    expect(s.selected).toBe('a');
    s = reduce(s, { type: 'jobs', running: [job({ job: 'j1', cluster: 'b' })], recent: [] });
    expect(s.selected).toBe('b');
    // the user picks a; the same running job does not pull the selection back
    s = select(s, 'a');
    s = reduce(s, { type: 'jobs', running: [job({ job: 'j1', cluster: 'b', done: 5 })], recent: [] });
    expect(s.selected).toBe('a');
  });

  it('holds the selection when pinned', () => {
    let s = reduce(initialState(), { type: 'clusters', clusters: [cluster('a'), cluster('b')] });
    s = setPinned(s, true);
    s = reduce(s, { type: 'jobs', running: [job({ job: 'j2', cluster: 'b' })], recent: [] });
    expect(s.selected).toBe('a');
  });
});

describe('the panel follows the active notebook to its cluster', () => {
  const clusters = [
    cluster('a', { kernels: ['k1'], started: 1 }),
    cluster('b', { kernels: ['k2'], started: 2 }),
    cluster('c', { kernels: [], started: 3 })
  ];

  it('finds the newest cluster a kernel started or attached to', () => {
    expect(clusterOfKernel(clusters, 'k2')).toBe('b');
    expect(clusterOfKernel([...clusters, cluster('d', { kernels: ['x', 'k2'], started: 9 })], 'k2')).toBe('d');
    expect(clusterOfKernel(clusters, 'k3')).toBeNull();
    expect(clusterOfKernel(clusters, null)).toBeNull();
    // a server without kernel ids in its summaries
    expect(clusterOfKernel([{ ...cluster('z'), kernels: undefined as unknown as string[] }], 'k1')).toBeNull();
  });

  it('switches with the active notebook; a notebook without a cluster keeps the view', () => {
    let s = reduce(initialState(), { type: 'clusters', clusters });
    expect(s.selected).toBe('a');
    s = setActiveKernel(s, 'k2');
    expect(s.selected).toBe('b');
    s = setActiveKernel(s, 'k1');
    expect(s.selected).toBe('a');
    s = setActiveKernel(s, 'k-none');
    expect(s.selected).toBe('a');
    s = setActiveKernel(s, null);
    expect(s.selected).toBe('a');
  });

  it('follows a cluster the active notebook starts later, and lets a click stand until then', () => {
    let s = reduce(initialState(), { type: 'clusters', clusters: clusters.slice(0, 2) });
    s = setActiveKernel(s, 'k9');
    expect(s.selected).toBe('a');
    s = select(s, 'b');
    s = reduce(s, { type: 'clusters', clusters: clusters.slice(0, 2) });
    expect(s.selected).toBe('b');
    s = reduce(s, { type: 'clusters', clusters: [...clusters, cluster('n', { kernels: ['k9'], started: 5 })] });
    expect(s.selected).toBe('n');
    // the user looks elsewhere: the next list (same cluster for k9) does not pull back
    s = select(s, 'a');
    s = reduce(s, { type: 'clusters', clusters: [...clusters, cluster('n', { kernels: ['k9'], started: 5 })] });
    expect(s.selected).toBe('a');
  });

  it("finds a notebook's cluster by its maps when it only connected to it by name", () => {
    const jobs = [
      job({ job: 'old', cluster: 'a', kernel_id: 'kc', started: 1 }),
      job({ job: 'new', cluster: 'c', kernel_id: 'kc', started: 5 }),
      job({ job: 'gone', cluster: 'stopped', kernel_id: 'kc', started: 9 })
    ];
    expect(clusterOfKernel(clusters, 'kc', jobs)).toBe('c');
    // its own record wins over its maps
    expect(clusterOfKernel(clusters, 'k1', jobs)).toBe('a');
    let s = reduce(initialState(), { type: 'clusters', clusters });
    s = setActiveKernel(s, 'kc');
    expect(s.selected).toBe('a');
    // the notebook's first map starts on c: the panel goes there (and stays with the notebook after)
    s = reduce(s, { type: 'jobs', running: [jobs[1]], recent: [] });
    expect(s.selected).toBe('c');
    s = setActiveKernel(s, 'k2');
    expect(s.selected).toBe('b');
    s = setActiveKernel(s, 'kc');
    expect(s.selected).toBe('c');
  });

  it('holds one cluster when pinned and follows again when let go', () => {
    let s = reduce(initialState(), { type: 'clusters', clusters });
    s = setPinned(select(s, 'c'), true);
    s = setActiveKernel(s, 'k2');
    expect(s.selected).toBe('c');
    s = setPinned(s, false);
    expect(s.selected).toBe('b');
  });

  it("does not jump to another notebook's new job while the active one has a cluster", () => {
    let s = reduce(initialState(), { type: 'clusters', clusters });
    s = setActiveKernel(s, 'k1');
    s = reduce(s, { type: 'jobs', running: [job({ job: 'j9', cluster: 'b' })], recent: [] });
    expect(s.selected).toBe('a');
    // without a cluster of its own, the panel follows new work as before
    s = setActiveKernel(s, 'k-none');
    s = reduce(s, { type: 'jobs', running: [job({ job: 'j10', cluster: 'c' })], recent: [] });
    expect(s.selected).toBe('c');
  });
});

describe("the overlay's other topics are watched and kept", () => {
  it('asks for them with the topic shown, keeps their models, forgets them with the cluster', () => {
    let s = reduce(initialState(), { type: 'clusters', clusters: [cluster('a'), cluster('b')] });
    s = reduce(s, { type: 'topics', cluster: 'a', topics: [] });
    s = selectTopic(s, 'rl');
    s = setOverlayTopics(s, ['sys', 'rl']);
    expect(watchMessage(s)).toEqual({ type: 'watch', cluster: 'a', topics: ['rl', 'sys'] });
    const sys = { ...metrics, topic: 'sys' };
    s = reduce(s, { type: 'metrics', cluster: 'a', topic: 'sys', data: sys });
    expect(s.overlayMetrics.sys).toBe(sys);
    expect(s.metrics).toBeNull();
    // a topic nobody draws is not kept
    s = reduce(s, { type: 'metrics', cluster: 'a', topic: 'other', data: { ...metrics, topic: 'other' } });
    expect(Object.keys(s.overlayMetrics)).toEqual(['sys']);
    expect(setOverlayTopics(s, ['sys'])).toBe(s);
    expect(setOverlayTopics(s, []).overlayMetrics).toEqual({});
    s = select(s, 'b');
    expect(s.overlayTopics).toEqual([]);
    expect(watchMessage(s).topics).toEqual([]);
  });
});

describe('jobs list', () => {
  const finished = (i: number): IJob => job({ job: `f${i}`, state: 'finished', done: 10, updated: 10 + i });

  it('is bounded and can be cleared', () => {
    let s = reduce(initialState(), { type: 'clusters', clusters: [cluster('a')] });
    const recent = Array.from({ length: 10 }, (_, i) => finished(9 - i));
    s = reduce(s, { type: 'jobs', running: [job({ job: 'r' })], recent });
    const { rows, more } = visibleJobs(s, 4);
    expect(rows.map(j => j.job)).toEqual(['r', 'f9', 'f8', 'f7', 'f6']);
    expect(more).toBe(6);
    s = clearFinished(s);
    expect(visibleJobs(s, 4)).toEqual({ rows: [s.jobs.running[0]], more: 0 });
    // a job that finishes later is listed again
    s = reduce(s, { type: 'jobs', running: [], recent: [finished(20), ...recent] });
    expect(visibleJobs(s, 4).rows.map(j => j.job)).toEqual(['f20']);
  });

  it('fills the bar of a finished job with failures (collect mode): done plus failed', () => {
    const p = jobProgress(job({ state: 'finished', total: 80, done: 72, failed: 8 }));
    expect(p.fraction).toBeCloseTo(0.9);
    expect(p.failedFraction).toBeCloseTo(0.1);
    expect(p.fraction! + p.failedFraction).toBeCloseTo(1);
    const unknown = jobProgress(job({ state: 'finished', total: null, done: 3, failed: 1 }));
    expect(unknown.fraction! + unknown.failedFraction).toBeCloseTo(1);
  });
});

describe('failed jobs are clickable', () => {
  const failures = [
    { index: 3, error: 'KeyError: 3', traceback: 'KeyError: 3', worker: 'tcp://10.0.0.2:4001' },
    { index: 9, error: '', traceback: '', worker: null }
  ];

  it('a click shows the failed items of a job with failures, a second click hides them', () => {
    const bad = job({ job: 'bad', state: 'finished', done: 6, failed: 4, failures });
    let s = reduce(initialState(), { type: 'clusters', clusters: [cluster('a')] });
    s = reduce(s, { type: 'jobs', running: [], recent: [bad, job({ job: 'ok', state: 'finished' })] });
    expect(toggleFailures(s, job({ job: 'ok', state: 'finished' })).failuresOpen).toBeNull();
    s = toggleFailures(s, bad);
    expect(s.failuresOpen).toBe('bad');
    // a later update of the jobs keeps it open
    s = reduce(s, { type: 'jobs', running: [], recent: [{ ...bad, updated: 5 }] });
    expect(s.failuresOpen).toBe('bad');
    expect(toggleFailures(s, bad).failuresOpen).toBeNull();
  });

  it('lists item, error and worker, and says how many more failed', () => {
    const { rows, more } = failureDetails(job({ failed: 4, failures }));
    expect(rows).toEqual([
      { head: 'item 3', error: 'KeyError: 3', worker: 'on tcp://10.0.0.2:4001', traceback: 'KeyError: 3' },
      { head: 'item 9', error: 'unknown error', worker: 'worker not recorded', traceback: '' }
    ]);
    expect(more).toMatch(/^2 more failed/);
    const named = failureDetails(job({ failed: 1, failures: [{ ...failures[0], item: "'cfg-3'" }] }));
    expect(named.rows[0].head).toBe("item 3: 'cfg-3'");
    expect(failureDetails(job({ failed: 2, failures })).more).toBe('');
  });
});

describe('jobs grouped by cluster and kernel', () => {
  it('keeps the order of first appearance', () => {
    const groups = groupJobs([
      job({ job: '1', cluster: 'a', kernel: 7 }),
      job({ job: '2', cluster: 'b', kernel: 8 }),
      job({ job: '3', cluster: 'a', kernel: 7 }),
      job({ job: '4', cluster: 'a', kernel: null })
    ]);
    expect([...groups.keys()]).toEqual(['a · kernel 7', 'b · kernel 8', 'a']);
    expect(groups.get('a · kernel 7')!.map(j => j.job)).toEqual(['1', '3']);
  });
});
