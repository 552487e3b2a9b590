/**
 * The "Detached" section's text: kept clusters' countdown and attachments, detached jobs' progress
 * and origin, grouping under their cluster.
 */
import {
  IDetachedJob,
  IKeptCluster,
  cancellable,
  detachedJobText,
  detachedWhere,
  groupDetached,
  keptText
} from '../panel/detached';

function kept(over: Partial<IKeptCluster> = {}): IKeptCluster {
  return {
    name: 'k',
    backend: 'local',
    idle_timeout: 1800,
    idle_since: null,
    stops_in: null,
    attached: [],
    jobs_running: 0,
    ...over
  };
}

function job(over: Partial<IDetachedJob> = {}): IDetachedJob {
  return {
    name: 'sweep',
    cluster: 'k',
    notebook: null,
    cell: null,
    state: 'running',
    done: 3,
    failed: 0,
    total: 40,
    started: 1,
    duration: null,
    reason: null,
    fetch_code: "import jupyter_cluster as jc\nresults = jc.job('sweep').result()",
    ...over
  };
}

describe('keptText', () => {
  it('shows who is attached and what runs, and no countdown then', () => {
    const k = kept({ attached: [{ pid: 1, kernel_id: null, since: 0 }], jobs_running: 2 });
    expect(keptText(k)).toBe('kept · 1 kernel attached · 2 jobs running');
  });
  it('shows the idle countdown', () => {
    expect(keptText(kept({ stops_in: 725, idle_since: 5 }))).toBe('kept · idle, stops in 12 min 05 s');
  });
  it('says when it never stops by itself', () => {
    expect(keptText(kept({ idle_timeout: 0 }))).toBe('kept · never stops by itself');
  });
});

describe('detached jobs', () => {
  it('write progress, failures and duration', () => {
    expect(detachedJobText(job())).toBe('running 3/40');
    expect(detachedJobText(job({ state: 'finished', done: 38, failed: 2, duration: 95 }))).toBe(
      'finished 38/40 (2 failed) · 1 min 35 s'
    );
  });
  it('say where they came from', () => {
    expect(detachedWhere(job({ notebook: 'a.ipynb', cell: 'In[3]: %%parallel x in g' }))).toBe(
      'a.ipynb · In[3]: %%parallel x in g'
    );
    expect(detachedWhere(job())).toBe('');
  });
  it('are grouped under their cluster, kept clusters first, a stopped one still listed', () => {
    const groups = groupDetached({
      kept: [kept({ name: 'k2' })],
      jobs: [job({ name: 'a', cluster: 'gone' }), job({ name: 'b', cluster: 'k2' })]
    });
    expect(groups.map(g => [g.cluster, g.kept !== null, g.jobs.map(j => j.name)])).toEqual([
      ['k2', true, ['b']],
      ['gone', false, ['a']]
    ]);
  });
  it('can be cancelled only while they run', () => {
    expect(cancellable(job())).toBe(true);
    expect(cancellable(job({ state: 'submitted' }))).toBe(true);
    expect(cancellable(job({ state: 'lost' }))).toBe(false);
    expect(cancellable(job({ state: 'finished' }))).toBe(false);
  });
});
