/**
 * A cluster is its id, not its name: a reused name never makes another
 * notebook's cluster "this notebook's", nor opens its kept history.
 */
import { clusterOfKernel, initialState, keptOf, reduce, rememberIds, setActiveKernel } from '../model';
import type { IClusterSummary, IHistoryCluster, IJob } from '../messages';
import { keptText } from '../panel/clusters';

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

function kept(key: string, extra: Partial<IHistoryCluster> = {}): IHistoryCluster {
  return { ...cluster(key), cluster: 'local-1', status: 'stopped', stopped: 200, ...extra };
}

function job(extra: Partial<IJob>): IJob {
  return {
    job: 'j1',
    label: 'f',
    kernel: 7,
    cluster: 'local-1',
    total: 1,
    done: 1,
    failed: 0,
    state: 'finished',
    started: 10,
    updated: 11,
    failures: [],
    kernel_id: null,
    ...extra
  };
}

describe('a reused cluster name', () => {
  // notebook A (kernel kA) ran on the first local-1, which stopped; notebook B (kB) started a new local-1
  const second = cluster('local-1', { kernels: ['kB'], started: 100, id: 'id-2' });
  const aJob = job({ job: 'a', kernel_id: 'kA', started: 10 });

  it("is not the earlier notebook's cluster through that notebook's old jobs", () => {
    expect(clusterOfKernel([second], 'kA', [aJob])).toBeNull();
    expect(clusterOfKernel([second], 'kB', [aJob])).toBe('local-1');
    // a job on the live cluster (after it started) still finds it for a kernel the registry does not list
    expect(clusterOfKernel([second], 'kC', [job({ kernel_id: 'kC', started: 150 })])).toBe('local-1');
  });

  it("does not select the other notebook's cluster when the first notebook is activated", () => {
    let s = reduce(initialState(), { type: 'clusters', clusters: [second] });
    s = reduce(s, { type: 'jobs', running: [], recent: [aJob], history: [] });
    s = setActiveKernel(s, 'kA', 'a.ipynb');
    expect(s.kernelCluster).toBeNull();
  });

  it('opens the kept history of the cluster that was shown, by its id', () => {
    const history = [
      kept('local-1.stopped-2', { id: 'id-2', notebooks: ['b.ipynb'] }),
      kept('local-1.stopped-1', { id: 'id-1', notebooks: ['a.ipynb'] })
    ];
    expect(keptOf(history, 'local-1', 'id-1')?.name).toBe('local-1.stopped-1');
    expect(keptOf(history, 'local-1', 'id-9')).toBeUndefined();
    expect(keptOf(history, 'local-1', undefined)?.name).toBe('local-1.stopped-2'); // no id known: the newest
    // the panel showed notebook A's local-1; it stops, and the second one's history is listed first
    let s = setActiveKernel(initialState(), 'kA', 'a.ipynb');
    s = reduce(s, { type: 'clusters', clusters: [cluster('local-1', { id: 'id-1', kernels: ['kA'] })] });
    expect(s.selected).toBe('local-1');
    s = reduce(s, { type: 'clusters', clusters: [] });
    s = reduce(s, { type: 'jobs', running: [], recent: [], history });
    expect(s.selected).toBe('local-1.stopped-1');
  });

  it('keeps the ids of clusters no longer listed', () => {
    const a = rememberIds({}, [cluster('x', { id: '1' })]);
    expect(rememberIds(a, [cluster('x', { id: '1' })])).toBe(a);
    expect(rememberIds(a, [cluster('y', { id: '2' })])).toEqual({ x: '1', y: '2' });
    expect(rememberIds(a, [cluster('x', { id: '3' })])).toEqual({ x: '3' });
  });
});

describe('a kept card', () => {
  it('says more than the name: notebooks, backend, times, what was kept', () => {
    const text = keptText(kept('k', { notebooks: ['work/sweep.ipynb', 'b.ipynb'], started: 100, topics: ['loss'] }));
    expect(text).toMatch(/^sweep\.ipynb \+1 · local · .+–.+ · metrics: loss$/);
    expect(keptText(kept('k', { started: 0 }))).toBe('local · jobs only');
  });
});
