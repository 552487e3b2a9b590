/**
 * The panel's pure parts: worker diffs, numeric sorting, the worker summary,
 * the virtual list's window, stable card and job orders, the New dialog's
 * checks, and the active notebook's stopped cluster not swapped for another's.
 */
import { readFileSync } from 'fs';

import { contrastRatio } from '../charts/colors';
import { IPanelState, initialState, reduce, select, setActiveKernel } from '../model';
import type { IClusterModel, IClusterSummary, IJob, IWorker, ServerMessage } from '../messages';
import { checkNewCluster, newClusterFields, newClusterRequest } from '../panel/newCluster';
import { orderClusters, orderJobs, scopedJobs, scrollToShow } from '../panel/order';
import { batchText } from '../panel/workersView';
import { Loader } from '../panel/loader';
import { jobCell, jobContextText, sweepRun } from '../panel/jobs';
import { applyWorkersDiff, hostOf, nextSort, sortWorkers, summarize, tasksText, visibleRange } from '../panel/workers';

const GIB = 2 ** 30;

function worker(i: number, extra: Partial<IWorker> = {}): IWorker {
  return {
    name: String(i),
    address: `tcp://10.0.0.${i % 3}:${4000 + i}`,
    status: 'running',
    nthreads: 1,
    memory: GIB,
    memory_limit: 4 * GIB,
    cpu: 2,
    executing: 0,
    resources: {},
    ...extra
  };
}

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

function model(workers: IWorker[]): IClusterModel {
  return {
    ...cluster('c'),
    owns_cluster: true,
    workers,
    memory: workers.reduce((m, w) => m + w.memory, 0),
    n_workers: workers.length
  };
}

function job(id: string, kernel: string | null, extra: Partial<IJob> = {}): IJob {
  return {
    job: id,
    label: id,
    kernel: 1,
    cluster: 'c',
    total: 10,
    done: 0,
    failed: 0,
    state: 'running',
    started: 1,
    updated: 1,
    failures: [],
    kernel_id: kernel,
    ...extra
  };
}

describe('worker diffs', () => {
  it('replace changed rows in place, append new ones, drop removed ones, recompute totals', () => {
    const m = model([worker(0), worker(1), worker(2)]);
    const next = applyWorkersDiff(m, {
      changed: [worker(1, { executing: 1, memory: 2 * GIB }), worker(7)],
      removed: [worker(0).address]
    });
    expect(next.workers.map(w => w.name)).toEqual(['1', '2', '7']);
    expect(next.workers[0].executing).toBe(1);
    expect(next.n_workers).toBe(3);
    expect(next.memory).toBe(4 * GIB);
    expect(next.cores).toBe(3);
    expect(m.workers).toHaveLength(3); // the old model is not changed
  });

  it('return the same model for an empty diff, and take cluster fields from the summary', () => {
    const m = model([worker(0)]);
    expect(applyWorkersDiff(m, { changed: [], removed: [] })).toBe(m);
    expect(applyWorkersDiff(m, { changed: [], removed: [], summary: { status: 'unreachable' } }).status).toBe(
      'unreachable'
    );
  });

  it('apply through the reducer only to the selected cluster with a full list', () => {
    let s = reduce(initialState(), { type: 'clusters', clusters: [cluster('c'), cluster('d')] });
    const diff = { type: 'workers' as const, name: 'c', changed: [worker(5)], removed: [] };
    expect(reduce(s, diff)).toBe(s); // no full list yet
    s = reduce(s, { type: 'cluster', name: 'c', model: model([worker(0)]) });
    s = reduce(s, diff);
    expect(s.detail?.workers.map(w => w.name)).toEqual(['0', '5']);
    expect(reduce(s, { ...diff, name: 'd' })).toBe(s);
  });
});

describe('worker sorting', () => {
  const ws = [219, 22, 220, 3, 100].map(i => worker(i, { cpu: i % 7, memory: (i % 5) * GIB }));

  it('sorts names naturally, not as text', () => {
    expect(sortWorkers(ws, { column: 'name', descending: false }).map(w => w.name)).toEqual([
      '3',
      '22',
      '100',
      '219',
      '220'
    ]);
  });

  it('sorts numbers as numbers, ties by name, either way', () => {
    const byMemory = sortWorkers(ws, { column: 'memory', descending: true });
    expect(byMemory.map(w => w.memory / GIB)).toEqual([4, 3, 2, 0, 0]);
    expect(byMemory.map(w => w.name)).toEqual(['219', '3', '22', '100', '220']); // ties by name
    const byCpu = sortWorkers(ws, { column: 'cpu', descending: false }).map(w => w.cpu);
    expect(byCpu).toEqual([...byCpu].sort((a, b) => a - b));
  });

  it('flips on a second click; numbers start largest first', () => {
    expect(nextSort({ column: 'name', descending: false }, 'cpu')).toEqual({ column: 'cpu', descending: true });
    expect(nextSort({ column: 'cpu', descending: true }, 'cpu')).toEqual({ column: 'cpu', descending: false });
    expect(nextSort({ column: 'cpu', descending: true }, 'name')).toEqual({ column: 'name', descending: false });
  });
});

describe('worker summary', () => {
  it('counts threads, tasks, idle leases, statuses, hosts and the memory distribution', () => {
    const ws = [
      worker(0, { executing: 2, memory: 0.5 * GIB }),
      worker(1, { idle_leases: 1, leases: 1, memory: 3.9 * GIB, cpu: 50 }),
      worker(2, { status: 'paused', nthreads: 4 }),
      worker(3)
    ];
    const s = summarize(ws);
    expect(s.workers).toBe(4);
    expect(s.threads).toBe(7);
    expect(s.tasks).toBe(2);
    expect(s.idleLeases).toBe(1);
    expect(s.statuses).toEqual({ running: 3, paused: 1 });
    expect(s.memoryHistogram).toEqual([0, 1, 2, 0, 0, 0, 0, 0, 0, 1]);
    expect(s.cpu.max).toBe(50);
    expect(s.hosts.map(h => [h.host, h.workers])).toEqual([
      ['10.0.0.0', 2],
      ['10.0.0.1', 1],
      ['10.0.0.2', 1]
    ]);
  });

  it('reads hosts from addresses of any protocol, IPv6 too', () => {
    expect(hostOf('tls://node-7.cluster:4012')).toBe('node-7.cluster');
    expect(hostOf('tcp://[::1]:4012')).toBe('[::1]');
    expect(hostOf('tcp://127.0.0.1:4012')).toBe('127.0.0.1');
  });

  it('shows a worker whose only tasks are waiting leases as idle', () => {
    expect(tasksText(worker(0, { executing: 0, idle_leases: 2 }))).toBe('idle');
    expect(tasksText(worker(0, { executing: 3, idle_leases: 0 }))).toBe('3');
    expect(tasksText(worker(0))).toBe('0');
  });
});

describe('the virtual list', () => {
  it('draws a bounded window whatever the length', () => {
    for (const n of [10, 256, 10000]) {
      for (const scroll of [0, 1000, 22 * n]) {
        const { start, end } = visibleRange(scroll, 264, 22, n, 4);
        expect(end - start).toBeLessThanOrEqual(12 + 8);
        expect(start).toBeGreaterThanOrEqual(0);
        expect(end).toBeLessThanOrEqual(n);
      }
    }
    expect(visibleRange(0, 264, 22, 2)).toEqual({ start: 0, end: 2 });
    // scrolled to the end: the last rows are drawn
    expect(visibleRange(22 * 246, 264, 22, 256, 4).end).toBe(256);
  });
});

describe('stable orders', () => {
  it('orders cards by start time, the pinned one first, whatever the order pushed', () => {
    const cs = [cluster('b', { started: 2 }), cluster('a', { started: 1 }), cluster('c', { started: 3 })];
    expect(orderClusters(cs, null).map(c => c.name)).toEqual(['a', 'b', 'c']);
    expect(orderClusters([...cs].reverse(), null).map(c => c.name)).toEqual(['a', 'b', 'c']);
    expect(orderClusters(cs, 'c').map(c => c.name)).toEqual(['c', 'a', 'b']);
  });

  it("puts the active notebook's jobs first, keeping each part's order", () => {
    const jobs = [job('x1', 'k2'), job('m1', 'k1'), job('x2', null), job('m2', 'k1')];
    const active = (activeKernel: string | null, activeNotebook: string | null = null) => ({
      activeKernel,
      activeNotebook
    });
    expect(orderJobs(jobs, active('k1')).map(j => j.job)).toEqual(['m1', 'm2', 'x1', 'x2']);
    expect(orderJobs(jobs, active(null))).toBe(jobs);
    expect(orderJobs(jobs, active('k9'))).toBe(jobs);
    // by the notebook's path when jobs carry it: a restarted kernel (new id) still comes first
    const byPath = [job('o', 'k2', { notebook: 'b.ipynb' }), job('old', 'k1', { notebook: 'a.ipynb' })];
    expect(orderJobs(byPath, active('k1-restarted', 'a.ipynb')).map(j => j.job)).toEqual(['old', 'o']);
  });
});

describe('the New dialog', () => {
  it('offers the configured backends, the default first', () => {
    const fields = newClusterFields(['local', 'slurm', 'ssh'], 'slurm', 4);
    const backend = fields.find(f => f.name === 'backend');
    expect(backend?.choices?.map(c => c.value)).toEqual(['slurm', 'local', 'ssh']);
    expect(fields.map(f => f.name)).toEqual(['name', 'backend', 'workers', 'threads', 'memory']);
    expect(fields.find(f => f.name === 'workers')?.value).toBe('4');
  });

  it('checks every field before sending, and sends only what was given', () => {
    expect(checkNewCluster({ name: 'bad name', workers: '', threads: '', memory: '' })).toMatch(/not a valid/);
    expect(checkNewCluster({ name: '', workers: '0', threads: '', memory: '' })).toMatch(/workers must be/);
    expect(checkNewCluster({ name: '', workers: '2', threads: 'x', memory: '' })).toMatch(/threads must be/);
    expect(checkNewCluster({ name: '', workers: '2', threads: '2', memory: 'lots' })).toMatch(/not a size/);
    const ok = { name: 'a', workers: '2', threads: '3', memory: '4 GiB', backend: 'local' };
    expect(checkNewCluster(ok)).toBeNull();
    expect(newClusterRequest(ok)).toEqual({
      name: 'a',
      workers: 2,
      threads: 3,
      memory_limit: '4GiB',
      backend: 'local'
    });
    expect(newClusterRequest({ name: '', workers: '', threads: '', memory: '' })).toEqual({});
  });
});

describe("the active notebook's cluster stops", () => {
  it("shows its kept history, or nothing, never another notebook's cluster", () => {
    let s = reduce(initialState(), {
      type: 'clusters',
      clusters: [cluster('one', { started: 1 }), cluster('four', { started: 4, kernels: ['k4'] })]
    });
    s = setActiveKernel(s, 'k4');
    expect(s.selected).toBe('four');
    s = reduce(s, { type: 'clusters', clusters: [cluster('one', { started: 1 })] });
    expect(s.selected).toBe('four'); // until the jobs message says what was kept
    s = reduce(s, { type: 'jobs', running: [], recent: [], history: [] });
    expect(s.selected).toBeNull();
    // another notebook's cluster is still one click away
    expect(select(s, 'one').selected).toBe('one');
  });
});

describe('jobs per notebook', () => {
  it("keeps the active notebook's finished jobs in the list however many others finish later", () => {
    const mine = [job('m1', 'k1', { state: 'finished', updated: 5 })];
    const others = Array.from({ length: 8 }, (_, i) => job(`o${i}`, 'k2', { state: 'finished', updated: 10 + i }));
    const state = {
      ...initialState(),
      jobs: { running: [job('r', 'k2')], recent: [...others].reverse().concat(mine) },
      activeKernel: 'k1',
      selected: 'c'
    };
    const all = scopedJobs(state, 'all', 4);
    expect(all.rows.map(j => j.job)).toEqual(['r', 'm1', 'o7', 'o6', 'o5']);
    expect(all.more).toBe(5);
    expect(scopedJobs(state, 'notebook', 4).rows.map(j => j.job)).toEqual(['m1']);
    expect(scopedJobs({ ...state, activeKernel: 'k2' }, 'notebook', 4).rows[0].job).toBe('r');
    expect(scopedJobs({ ...state, selected: 'elsewhere' }, 'cluster', 4).rows).toEqual([]);
  });

  it("keeps a notebook's jobs in 'this notebook' after its kernel restarts (keyed by its path)", () => {
    const before = [
      job('a1', 'k1', { state: 'finished', updated: 5, notebook: 'dir/a.ipynb' }),
      job('b1', 'k2', { state: 'finished', updated: 6, notebook: 'b.ipynb' }),
      job('x1', 'k3', { state: 'finished', updated: 7 }) // a kernel the server did not start: no path
    ];
    let s = reduce(initialState(), { type: 'jobs', running: [], recent: before, history: [] });
    s = setActiveKernel(s, 'k1', 'dir/a.ipynb');
    expect(s.activeNotebook).toBe('dir/a.ipynb');
    expect(scopedJobs(s, 'notebook', 4).rows.map(j => j.job)).toEqual(['a1']);
    s = setActiveKernel(s, 'k1-new', 'dir/a.ipynb'); // restarted: a new kernel id, the same notebook
    expect(scopedJobs(s, 'notebook', 4).rows.map(j => j.job)).toEqual(['a1']);
    s = reduce(s, {
      type: 'jobs',
      running: [job('a2', 'k1-new', { notebook: 'dir/a.ipynb' })],
      recent: before,
      history: []
    });
    expect(scopedJobs(s, 'notebook', 4).rows.map(j => j.job)).toEqual(['a2', 'a1']);
    // a job without a path is the active notebook's only by its kernel id
    expect(scopedJobs(setActiveKernel(s, 'k3', null), 'notebook', 4).rows.map(j => j.job)).toEqual(['x1']);
    expect(scopedJobs(setActiveKernel(s, 'k9', 'b.ipynb'), 'notebook', 4).rows.map(j => j.job)).toEqual(['b1']);
  });
});

describe('the link to the cell', () => {
  it("names the job's notebook and its cell id, else its execution count, else nothing", () => {
    const cell = { execution_count: 7, cell_id: 'abc-1', first_line: 'x' };
    expect(jobCell(job('j', 'k', { notebook: 'n.ipynb', cell }))).toEqual({
      notebook: 'n.ipynb',
      cellId: 'abc-1',
      count: 7
    });
    expect(jobCell(job('j', 'k', { notebook: 'n.ipynb', cell: { ...cell, cell_id: null } }))).toEqual({
      notebook: 'n.ipynb',
      cellId: null,
      count: 7
    });
    expect(jobCell(job('j', 'k', { notebook: 'n.ipynb', cell: { execution_count: null, cell_id: null } }))).toBeNull();
    expect(jobCell(job('j', 'k', { cell }))).toBeNull(); // nbclient: no notebook path
    expect(jobCell(job('j', 'k'))).toBeNull();
  });

  it("offers a sweep's or a named run's table, not a plain map's", () => {
    expect(sweepRun(job('j', 'k', { run: 'r1', item_count: 30 }))).toBe('r1');
    expect(sweepRun(job('j', 'k', { run: 'r2', config: { lr: 0.1 } }))).toBe('r2');
    expect(sweepRun(job('j', 'k', { run: 'r3', config: {} }))).toBeNull();
    expect(sweepRun(job('j', 'k', { item_count: 30 }))).toBeNull(); // an older kernel: no run id
  });
});

describe('batch facts', () => {
  it("say how many jobs run and wait, with SLURM's reasons and the walltime left", () => {
    expect(batchText(undefined)).toBe('');
    expect(
      batchText({
        system: 'slurm',
        running: 2,
        pending: 1,
        pending_jobs: [{ job_id: '17', reason: 'Resources' }],
        walltime_left: '1:02:03'
      })
    ).toBe('slurm: 2 jobs running, 1 pending (job 17: Resources) · walltime left 1:02:03');
  });
});

describe('job context', () => {
  it("names the notebook, the cell, the job's number in its run and the duration", () => {
    const j = job('e', 'k1', {
      state: 'finished',
      started: 100,
      updated: 104.2,
      notebook: 'examples/03-es.ipynb',
      cell: { execution_count: 7 },
      context: { job: 3 }
    });
    expect(jobContextText(j)).toBe('03-es.ipynb · In [7] · job 3 · 4.2 s');
    expect(jobContextText({ ...j, context: { job: 1 } })).toBe('03-es.ipynb · In [7] · 4.2 s');
    expect(jobContextText(job('x', null, { started: 10, updated: 105, state: 'finished' }))).toBe('1 min 35 s');
  });
});

describe('the loader of a stopped cluster', () => {
  it('does not resend an empty topic list (each dispatch syncs again: it recursed without end)', () => {
    class NoTopics extends Loader {
      topicsOf(): [] {
        return []; // kept with no topics, or its read failed
      }
    }
    let state: IPanelState = {
      ...initialState(),
      selected: 'sb.stopped-1',
      history: [{ ...cluster('sb.stopped-1'), cluster: 'sb', stopped: 2 }]
    };
    let dispatched = 0;
    const loader: Loader = new NoTopics(
      (msg: ServerMessage) => {
        dispatched += 1;
        state = reduce(state, msg);
        loader.sync(state); // as the panel's setState does
      },
      () => undefined
    );
    loader.sync(state);
    expect(dispatched).toBe(0);
  });
});

describe('the status badges read in every theme', () => {
  it("sets a dark text on the running and unreachable badges' light backgrounds (dark theme's too)", () => {
    const css = readFileSync(`${__dirname}/../../style/base.css`, 'utf8');
    // JupyterLab dark's --jp-success-color3 and --jp-warn-color3 (and its white text, 0.87 alpha, which read 1.3:1)
    for (const [state, background] of [
      ['running', '#c8e6c9'],
      ['unreachable', '#ffe0b2']
    ]) {
      const rule = new RegExp(`\\.jc-status\\.jc-status-${state} \\{([^}]*)\\}`).exec(css);
      expect(rule).not.toBeNull();
      const color = /(?:^|\s)color:\s*(#[0-9a-f]{6})/i.exec(rule![1]);
      expect([state, color?.[1]]).toEqual([state, expect.stringMatching(/^#/)]);
      expect(contrastRatio(color![1], background)).toBeGreaterThanOrEqual(4.5);
    }
  });
});

describe('the selected card stays in view', () => {
  it('scrolls the least that shows the card, and not at all when it shows', () => {
    // a 240 px list scrolled to 0: a card at 400 (40 tall) comes to its bottom edge
    expect(scrollToShow(400, 40, 0, 240)).toBe(200);
    // scrolled past it: back to its top
    expect(scrollToShow(40, 40, 300, 240)).toBe(40);
    // in view: where it was
    expect(scrollToShow(100, 40, 80, 240)).toBe(80);
    // taller than the view: its top
    expect(scrollToShow(500, 300, 0, 240)).toBe(500);
  });
});
