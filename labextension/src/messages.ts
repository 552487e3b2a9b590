/**
 * The messages the server extension sends the panel: the shapes of its REST
 * answers and websocket pushes (no functions here).
 *
 * The interfaces mirror jupyter_cluster/server and jupyter_cluster/wire:
 * IClusterSummary is Connection.summary(), IClusterModel is
 * ClusterHandle.model() plus the summary, IJob is one message of the
 * `jupyter-cluster:jobs` topic.  tests/wire/test_models.py writes the Python
 * builders' output to a fixture that contract.spec.ts type-checks against them.
 */
import type { IMetricsModel } from './charts/data';

export type Owner = 'kernel' | 'panel' | 'process' | string;

/** One row of the cluster list (GET clusters). */
export interface IClusterSummary {
  name: string;
  backend: string;
  address: string;
  dashboard_link: string | null;
  owner_kind: Owner;
  owner_pid: number;
  attached: boolean;
  started: number;
  status: 'connecting' | 'running' | 'unreachable' | string;
  error: string | null;
  n_workers: number;
  cores: number;
  memory_limit: number;
  jobs_running: number;
  topics: string[];
  /** ids of the Jupyter kernels that started it or attached to it (owner's first) */
  kernels: string[];
  /** the cluster's identity (a name is reused by later clusters; this never is) */
  id?: string;
}

/** One worker of a cluster (ClusterHandle.model()["workers"]). */
export interface IWorker {
  name: string;
  address: string;
  status: string;
  nthreads: number;
  memory: number;
  memory_limit: number;
  cpu: number;
  /** tasks running (lease tasks waiting for a map not counted) */
  executing: number;
  resources: { [key: string]: number };
  /** the engine's lease tasks it holds (older servers send none) */
  leases?: number;
  /** those of them waiting for a map: the worker is idle */
  idle_leases?: number;
  /** fields a batch backend adds (a SLURM worker's job id, node, …) */
  [extra: string]: unknown;
}

/** One cluster's details and workers (GET clusters/NAME). */
export interface IClusterModel extends IClusterSummary {
  owns_cluster: boolean;
  workers: IWorker[];
  memory: number;
}

/** A failed item of a job (models.py JobFailure): shown when the job is clicked. */
export interface IJobFailure {
  index: number;
  /** "TypeName: message", one line */
  error: string;
  /** the remote traceback's last lines, or "" */
  traceback: string;
  worker: string | null;
  /** the failed item's value as text (its repr, clipped), or null where the job did not record it */
  item?: string | null;
}

/** Progress of one map job, from any kernel. */
export interface IJob {
  job: string;
  label: string;
  kernel: number | null;
  cluster: string;
  total: number | null;
  done: number;
  failed: number;
  state: 'running' | 'finished' | 'failed' | 'cancelled' | 'lost' | string;
  started: number;
  updated: number;
  /** the first failed items (at most 5), by index */
  failures: IJobFailure[];
  /** the Jupyter kernel running it (the browser's kernel id), or null outside a kernel */
  kernel_id: string | null;
  /** its run's fields (newer kernels): run id, notebook path, cell, config, context */
  run?: string;
  notebook?: string | null;
  cell?: { execution_count?: number | null; cell_id?: string | null; first_line?: string } | null;
  config?: { [key: string]: unknown };
  context?: { [key: string]: unknown };
  /** a `%%parallel` sweep's number of items (sent when it ends; `GET runs/RUN` has them) */
  item_count?: number;
}

/** A stopped cluster whose jobs and metrics the server kept (name: "NAME.stopped-HHMMSS"). */
export interface IHistoryCluster extends IClusterSummary {
  /** the cluster's own name */
  cluster: string;
  /** when it stopped (seconds since the epoch) */
  stopped: number | null;
  /** the notebooks whose jobs it holds, the one that ran the most first */
  notebooks?: string[];
}

export interface IJobs {
  running: IJob[];
  recent: IJob[];
  /** stopped clusters kept for their history, newest first */
  history?: IHistoryCluster[];
}

/** What one metrics topic holds (GET clusters/NAME/metrics). */
export interface ITopicSummary {
  topic: string;
  version: number;
  received: number;
  dropped: number;
  /** points its curves lost to the history cap (optional: older servers send none) */
  truncated?: number;
  scalars: string[];
  vectors: string[];
  series: number;
}

/** A run as `GET runs` lists it (the fields the sweep table uses). */
export interface IRunRecord {
  run: string;
  name?: string | null;
  notebook?: string | null;
  state?: string | null;
  started?: number | null;
  cluster?: string | null;
  history?: string | null;
  metrics?: string[];
}

/** The body of a `workers` message: rows that changed, addresses that left, cluster fields that changed. */
export interface IWorkersDiff {
  changed: IWorker[];
  removed: string[];
  summary?: Partial<IClusterModel>;
}

/** Messages pushed on the events websocket. */
export type ServerMessage =
  | { type: 'clusters'; clusters: IClusterSummary[] }
  | ({ type: 'jobs' } & IJobs)
  | { type: 'cluster'; name: string; model: IClusterModel }
  | ({ type: 'workers'; name: string } & IWorkersDiff)
  | { type: 'topics'; cluster: string; topics: ITopicSummary[] }
  | { type: 'metrics'; cluster: string; topic: string; data: IMetricsModel & { version?: number } }
  | { type: 'run'; event: 'added' | 'finished'; run: IRunRecord }
  | { type: 'error'; message: string };
