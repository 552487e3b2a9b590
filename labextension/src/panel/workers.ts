/**
 * The worker section's data, without DOM: applying the server's diffs,
 * numeric sorting, the summary (threads, CPU and memory distribution, hosts)
 * and the window of rows a virtualised list draws.  Unit-tested with Jest.
 */
import type { IClusterModel, IWorker, IWorkersDiff } from '../messages';

/**
 * The cluster model with a diff applied: changed rows replace theirs in
 * place (new ones are appended), removed ones go; totals are recomputed.
 * Returns the same object when the diff changes nothing.
 */
export function applyWorkersDiff(model: IClusterModel, diff: IWorkersDiff): IClusterModel {
  if (!diff.changed.length && !diff.removed.length && !diff.summary) {
    return model;
  }
  const gone = new Set(diff.removed);
  const changed = new Map(diff.changed.map(w => [w.address, w]));
  const workers: IWorker[] = [];
  for (const w of model.workers) {
    if (gone.has(w.address)) {
      continue;
    }
    const c = changed.get(w.address);
    workers.push(c ?? w);
    changed.delete(w.address);
  }
  workers.push(...changed.values());
  return { ...model, ...(diff.summary ?? {}), ...totals(workers), workers };
}

/** Totals of a worker list, as the server's model has them. */
export function totals(workers: IWorker[]): Pick<IClusterModel, 'n_workers' | 'cores' | 'memory_limit' | 'memory'> {
  let cores = 0;
  let limit = 0;
  let memory = 0;
  for (const w of workers) {
    cores += w.nthreads || 0;
    limit += w.memory_limit || 0;
    memory += w.memory || 0;
  }
  return { n_workers: workers.length, cores, memory_limit: limit, memory };
}

export type WorkerColumn = 'name' | 'host' | 'status' | 'threads' | 'cpu' | 'memory' | 'tasks';

export interface IWorkerSort {
  column: WorkerColumn;
  descending: boolean;
}

const collator = new Intl.Collator(undefined, { numeric: true, sensitivity: 'base' });

/** The host part of a worker address ("tcp://10.0.0.5:4012" -> "10.0.0.5"). */
export function hostOf(address: string): string {
  const rest = address.replace(/^[a-z0-9+]+:\/\//i, '');
  if (rest.startsWith('[')) {
    return rest.slice(0, rest.indexOf(']') + 1);
  }
  const colon = rest.lastIndexOf(':');
  return colon > 0 ? rest.slice(0, colon) : rest;
}

function sortValue(w: IWorker, column: WorkerColumn): number | string {
  switch (column) {
    case 'threads':
      return w.nthreads;
    case 'cpu':
      return w.cpu;
    case 'memory':
      return w.memory;
    case 'tasks':
      return w.executing;
    case 'status':
      return w.status;
    case 'host':
      return hostOf(w.address);
    default:
      return w.name;
  }
}

/**
 * Workers sorted by a column: numbers as numbers, names naturally ("2" <
 * "10" < "219" < "220"), ties by name, so the order is stable between pushes.
 */
export function sortWorkers(workers: IWorker[], sort: IWorkerSort): IWorker[] {
  const sign = sort.descending ? -1 : 1;
  return [...workers].sort((a, b) => {
    const x = sortValue(a, sort.column);
    const y = sortValue(b, sort.column);
    let c = typeof x === 'number' && typeof y === 'number' ? x - y : collator.compare(String(x), String(y));
    if (c === 0 && sort.column !== 'name') {
      c = collator.compare(a.name, b.name);
      return c !== 0 ? c : collator.compare(a.address, b.address);
    }
    return c !== 0 ? sign * c : collator.compare(a.address, b.address);
  });
}

/** A click on a column header: the same column flips its direction, another starts (numbers: largest first). */
export function nextSort(current: IWorkerSort, column: WorkerColumn): IWorkerSort {
  if (current.column === column) {
    return { column, descending: !current.descending };
  }
  return { column, descending: !['name', 'host', 'status'].includes(column) };
}

export interface IHostSummary {
  host: string;
  workers: number;
  threads: number;
  memory: number;
  memory_limit: number;
  cpu: number;
}

export interface IWorkersSummary {
  workers: number;
  threads: number;
  memory: number;
  memory_limit: number;
  /** tasks running (idle leases not counted) */
  tasks: number;
  /** lease tasks waiting for a map */
  idleLeases: number;
  /** workers per status, e.g. {running: 250, paused: 6} */
  statuses: { [status: string]: number };
  /** CPU % of the workers: min, median, 90th percentile, max */
  cpu: { min: number; median: number; p90: number; max: number };
  /** workers per tenth of memory use (of their limit): [0-10 %, …, 90-100 %] */
  memoryHistogram: number[];
  /** hosts, most workers first */
  hosts: IHostSummary[];
}

function quantile(sorted: number[], q: number): number {
  if (!sorted.length) {
    return 0;
  }
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.round(q * (sorted.length - 1))))];
}

/** What the worker section shows before its list. */
export function summarize(workers: IWorker[]): IWorkersSummary {
  const cpus = workers.map(w => w.cpu || 0).sort((a, b) => a - b);
  const histogram = new Array<number>(10).fill(0);
  const statuses: { [status: string]: number } = {};
  const hosts = new Map<string, IHostSummary>();
  let tasks = 0;
  let idle = 0;
  for (const w of workers) {
    statuses[w.status] = (statuses[w.status] ?? 0) + 1;
    tasks += w.executing || 0;
    idle += w.idle_leases ?? 0;
    if (w.memory_limit > 0) {
      histogram[Math.min(9, Math.floor((10 * (w.memory || 0)) / w.memory_limit))]++;
    }
    const host = hostOf(w.address);
    const h = hosts.get(host) ?? { host, workers: 0, threads: 0, memory: 0, memory_limit: 0, cpu: 0 };
    h.workers++;
    h.threads += w.nthreads || 0;
    h.memory += w.memory || 0;
    h.memory_limit += w.memory_limit || 0;
    h.cpu += w.cpu || 0;
    hosts.set(host, h);
  }
  const t = totals(workers);
  return {
    workers: workers.length,
    threads: t.cores,
    memory: t.memory,
    memory_limit: t.memory_limit,
    tasks,
    idleLeases: idle,
    statuses,
    cpu: { min: cpus[0] ?? 0, median: quantile(cpus, 0.5), p90: quantile(cpus, 0.9), max: cpus[cpus.length - 1] ?? 0 },
    memoryHistogram: histogram,
    hosts: [...hosts.values()].sort((a, b) => b.workers - a.workers || collator.compare(a.host, b.host))
  };
}

/**
 * The rows a virtualised list draws: those in the viewport plus `overscan`
 * on each side, never more than `visible + 2 * overscan` whatever the length.
 */
export function visibleRange(
  scrollTop: number,
  viewportHeight: number,
  rowHeight: number,
  count: number,
  overscan = 4
): { start: number; end: number } {
  const first = Math.floor(Math.max(0, scrollTop) / rowHeight);
  const shown = Math.ceil(Math.max(viewportHeight, rowHeight) / rowHeight);
  const start = Math.max(0, Math.min(first - overscan, count - shown - overscan));
  const end = Math.min(count, first + shown + overscan);
  return { start: Math.max(0, start), end: Math.max(start, end) };
}

/** The tasks cell: a number, or "idle" for a worker whose only tasks are leases waiting for a map. */
export function tasksText(w: IWorker): string {
  if (!w.executing && (w.idle_leases ?? 0) > 0) {
    return 'idle';
  }
  return String(w.executing ?? 0);
}
