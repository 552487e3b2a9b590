/**
 * The panel's state and the pure functions that handle the server's messages
 * (messages.ts) in it: a reducer with no DOM and no JupyterLab, unit-tested
 * with Jest.
 */
import type { IMetricsModel } from './charts/charts';
import { withoutSeries } from './charts/data';
import { naturalCompare } from './common/text';
import { applyWorkersDiff } from './panel/workers';
import type {
  IClusterSummary,
  IWorker,
  IClusterModel,
  IJob,
  IHistoryCluster,
  IJobs,
  ITopicSummary,
  ServerMessage
} from './messages';

/** Everything the panel shows. */
export interface IPanelState {
  clusters: IClusterSummary[];
  jobs: IJobs;
  selected: string | null;
  detail: IClusterModel | null;
  topics: ITopicSummary[];
  topic: string | null;
  metrics: IMetricsModel | null;
  /** series keys the user switched off, per topic */
  hidden: { [topic: string]: string[] };
  error: string | null;
  /** stopped clusters kept for their history */
  history: IHistoryCluster[];
  /** hold the selection; otherwise it follows the cluster where work starts */
  pinned: boolean;
  /** finished jobs updated before this time (seconds) are hidden ("Clear finished") */
  clearedBefore: number;
  /** the job whose failed items are shown (clicked), or null */
  failuresOpen: string | null;
  /** the active notebook's kernel id (the panel follows it to its cluster unless pinned), or null */
  activeKernel: string | null;
  /** the active notebook's path as the server names it (jobs carry it: it outlives a kernel restart), or null */
  activeNotebook: string | null;
  /** the cluster last found for the active kernel: a new one is followed, the same one not again */
  kernelCluster: string | null;
  /** other topics of the selected cluster that the overlay chart draws from (watched too) */
  overlayTopics: string[];
  /** their latest models */
  overlayMetrics: { [topic: string]: IMetricsModel };
  /** the active notebook's cluster, shown when it stopped: its kept history is shown next, or nothing */
  stoppedOwn: string | null;
  /** the id each cluster name was last listed with: a stopped one's kept history is found by it */
  clusterIds: { [name: string]: string };
}

export function initialState(): IPanelState {
  return {
    clusters: [],
    jobs: { running: [], recent: [] },
    selected: null,
    detail: null,
    topics: [],
    topic: null,
    metrics: null,
    hidden: {},
    error: null,
    history: [],
    pinned: false,
    clearedBefore: 0,
    failuresOpen: null,
    activeKernel: null,
    activeNotebook: null,
    kernelCluster: null,
    overlayTopics: [],
    overlayMetrics: {},
    stoppedOwn: null,
    clusterIds: {}
  };
}

/**
 * The live cluster of a kernel: the newest one the server lists it with
 * (started there, or attached by address or by name: `%cluster connect`),
 * else the live cluster of its newest map (a kernel that reached a cluster
 * in a way the registry does not record, e.g. a Client of its own), or null.
 */
export function clusterOfKernel(clusters: IClusterSummary[], kernel: string | null, jobs: IJob[] = []): string | null {
  if (!kernel) {
    return null;
  }
  const mine = clusters.filter(c => (c.kernels ?? []).includes(kernel)).sort((a, b) => b.started - a.started);
  if (mine.length) {
    return mine[0].name;
  }
  // a job that started before the live cluster of its name ran on an earlier one (a reused name)
  const started = new Map(clusters.map(c => [c.name, c.started]));
  const mapped = jobs
    .filter(j => j.kernel_id === kernel && started.has(j.cluster) && j.started >= (started.get(j.cluster) ?? 0) - 1)
    .sort((a, b) => b.started - a.started);
  return mapped[0]?.cluster ?? null;
}

/**
 * Follow the active kernel to its cluster: when the kernel's cluster is not
 * the one found last time (another notebook became active, or its notebook
 * started or attached to a cluster), select it unless pinned.  A notebook
 * with no cluster keeps the current view; a user's click stays until then.
 */
function followKernel(state: IPanelState): IPanelState {
  const target = clusterOfKernel(state.clusters, state.activeKernel, [...state.jobs.running, ...state.jobs.recent]);
  if (target === state.kernelCluster) {
    return state;
  }
  const next = { ...state, kernelCluster: target };
  if (target === null || state.pinned || target === state.selected) {
    return next;
  }
  return cleared(next, target);
}

/**
 * The active notebook changed (or its kernel did): `kernel` is its kernel
 * id, `notebook` its path (null: none).
 */
export function setActiveKernel(
  state: IPanelState,
  kernel: string | null,
  notebook: string | null = null
): IPanelState {
  if (kernel === state.activeKernel) {
    return notebook === state.activeNotebook ? state : { ...state, activeNotebook: notebook };
  }
  return followKernel({ ...state, activeKernel: kernel, activeNotebook: notebook, kernelCluster: null });
}

/**
 * Whether a job is the active notebook's: by its notebook path when both
 * are known (a restarted kernel's new id still finds the notebook's jobs),
 * else by its kernel id (a kernel the server did not start names no notebook).
 */
export function isActiveJob(job: IJob, state: Pick<IPanelState, 'activeKernel' | 'activeNotebook'>): boolean {
  if (state.activeNotebook && typeof job.notebook === 'string' && job.notebook) {
    return job.notebook === state.activeNotebook;
  }
  return state.activeKernel !== null && job.kernel_id === state.activeKernel;
}

/** Whether `name` is a stopped cluster kept for its history (its data comes over REST, once). */
export function isStopped(state: Pick<IPanelState, 'history' | 'clusters'>, name: string | null): boolean {
  return name !== null && !state.clusters.some(c => c.name === name) && state.history.some(h => h.name === name);
}

function cleared(state: IPanelState, selected: string | null): IPanelState {
  return {
    ...state,
    selected,
    detail: null,
    topics: [],
    topic: null,
    metrics: null,
    overlayTopics: [],
    overlayMetrics: {}
  };
}

/** The new cluster list, with a selection that is still valid. */
function keepSelection(state: IPanelState, clusters: IClusterSummary[]): IPanelState {
  const names = clusters.map(c => c.name);
  const next = { ...state, clusters, clusterIds: rememberIds(state.clusterIds, clusters) };
  const sel = state.selected;
  if (sel !== null && (names.includes(sel) || state.history.some(h => h.name === sel))) {
    return next;
  }
  if (sel !== null && (state.topics.length > 0 || sel === state.kernelCluster)) {
    // the selected cluster stopped: keep its curves; the jobs message that
    // follows names the history the server kept for it (the active notebook's
    // own cluster is not swapped for another notebook's meanwhile)
    return { ...next, detail: null, stoppedOwn: sel === state.kernelCluster ? sel : state.stoppedOwn };
  }
  return names[0] === sel ? next : cleared(next, names[0] ?? null);
}

/**
 * Apply one server message.  Returns a new state; keeps the selection valid
 * (a vanished cluster or topic falls back to the first one there is).
 */
export function reduce(state: IPanelState, msg: ServerMessage): IPanelState {
  switch (msg.type) {
    case 'clusters': {
      return followKernel(keepSelection(state, msg.clusters));
    }
    case 'jobs':
      // the active notebook's maps may name its cluster (one it connected to by name)
      return followKernel(
        followJobs(
          { ...state, jobs: { running: msg.running, recent: msg.recent }, history: msg.history ?? [] },
          state.jobs.running
        )
      );
    case 'cluster':
      return msg.name === state.selected ? { ...state, detail: msg.model } : state;
    case 'workers': {
      // only what changed since the full list ('cluster'); a diff for another cluster is stale
      if (msg.name !== state.selected || !state.detail || state.detail.name !== msg.name) {
        return state;
      }
      const detail = applyWorkersDiff(state.detail, msg);
      return detail === state.detail ? state : { ...state, detail };
    }
    case 'topics': {
      if (msg.cluster !== state.selected) {
        return state;
      }
      const names = msg.topics.map(t => t.topic);
      const topic = state.topic !== null && names.includes(state.topic) ? state.topic : (names[0] ?? null);
      return {
        ...state,
        topics: msg.topics,
        topic,
        metrics: topic === state.topic ? state.metrics : null
      };
    }
    case 'metrics':
      if (msg.cluster !== state.selected) {
        return state;
      }
      if (msg.topic === state.topic) {
        return { ...state, metrics: msg.data };
      }
      if (state.overlayTopics.includes(msg.topic)) {
        return { ...state, overlayMetrics: { ...state.overlayMetrics, [msg.topic]: msg.data } };
      }
      return state;
    case 'error':
      return { ...state, error: msg.message };
    default:
      return state;
  }
}

/**
 * After a jobs message: move a selection whose cluster stopped onto the
 * history the server kept for it (curves stay), and, unless pinned or the
 * active notebook has a cluster of its own, follow the cluster where a new
 * job started (after Run All the panel shows the notebook's cluster, not
 * another one's empty metrics).
 */
export function followJobs(state: IPanelState, before: IJob[]): IPanelState {
  const live = state.clusters.map(c => c.name);
  let next = state;
  const sel = state.selected;
  if (sel !== null && !live.includes(sel) && !state.history.some(h => h.name === sel)) {
    const kept = keptOf(state.history, sel, state.clusterIds[sel]);
    // nothing kept of the active notebook's own cluster: show nothing rather than another notebook's
    const fallback = sel === state.stoppedOwn ? null : (live[0] ?? null);
    next = kept ? { ...state, selected: kept.name, detail: null } : cleared(state, fallback);
    next = { ...next, stoppedOwn: null };
  }
  if (next.pinned || next.kernelCluster !== null) {
    // pinned, or the active notebook has a cluster: that one is shown, not where other notebooks work
    return next;
  }
  const seen = new Set(before.map(j => j.job));
  const started = next.jobs.running
    .filter(j => !seen.has(j.job) && live.includes(j.cluster))
    .sort((a, b) => b.started - a.started)[0];
  if (started && started.cluster !== next.selected) {
    return cleared(next, started.cluster);
  }
  return next;
}

/** The ids of the clusters listed, added to those seen before (a stopped one's id is still needed). */
export function rememberIds(
  known: { [name: string]: string },
  clusters: IClusterSummary[]
): { [name: string]: string } {
  const changed = clusters.some(c => c.id && known[c.name] !== c.id);
  if (!changed) {
    return known;
  }
  const out = { ...known };
  clusters.forEach(c => {
    if (c.id) {
      out[c.name] = c.id;
    }
  });
  return out;
}

/**
 * The kept history of the stopped cluster `name`: the one of its id where the
 * server gave ids (another notebook's earlier cluster of that name is not it),
 * else the newest of that name.
 */
export function keptOf(history: IHistoryCluster[], name: string, id: string | undefined): IHistoryCluster | undefined {
  const named = history.filter(h => h.cluster === name);
  if (id !== undefined && named.some(h => h.id)) {
    return named.find(h => h.id === id);
  }
  return named[0];
}

/** Select a cluster (clears what belonged to the previous one). */
export function select(state: IPanelState, name: string | null): IPanelState {
  if (name === state.selected) {
    return state;
  }
  return cleared(state, name);
}

/** Pin the selection (or let it follow new work again). */
export function setPinned(state: IPanelState, pinned: boolean): IPanelState {
  if (pinned === state.pinned) {
    return state;
  }
  // let go: follow the active notebook's cluster again at once
  return pinned ? { ...state, pinned } : followKernel({ ...state, pinned, kernelCluster: null });
}

/** Hide the finished jobs there are now ("Clear finished"). */
export function clearFinished(state: IPanelState): IPanelState {
  const newest = state.jobs.recent.reduce((m, j) => Math.max(m, j.updated), state.clearedBefore);
  return { ...state, clearedBefore: newest };
}

/**
 * The job rows to draw: every running job, then at most `limit` finished
 * ones not cleared; `more` counts the finished ones left out.
 */
export function visibleJobs(state: IPanelState, limit = 5): { rows: IJob[]; more: number } {
  const finished = state.jobs.recent.filter(j => j.updated > state.clearedBefore);
  return { rows: [...state.jobs.running, ...finished.slice(0, limit)], more: Math.max(0, finished.length - limit) };
}

/** Select a metrics topic of the selected cluster. */
export function selectTopic(state: IPanelState, topic: string | null): IPanelState {
  if (topic === state.topic) {
    return state;
  }
  return { ...state, topic, metrics: null };
}

/** The other topics the overlay chart draws from (their models are kept while they are drawn). */
export function setOverlayTopics(state: IPanelState, topics: string[]): IPanelState {
  const wanted = topics.filter(t => t !== state.topic);
  if (JSON.stringify(wanted) === JSON.stringify(state.overlayTopics)) {
    return state;
  }
  const kept = Object.fromEntries(Object.entries(state.overlayMetrics).filter(([t]) => wanted.includes(t)));
  return { ...state, overlayTopics: wanted, overlayMetrics: kept };
}

/** The watch message for the server: which cluster's workers and which topics to push (the overlay's too). */
export function watchMessage(state: IPanelState): {
  type: 'watch';
  cluster: string | null;
  topics: string[];
} {
  const topics = state.topic ? [state.topic, ...state.overlayTopics.filter(t => t !== state.topic)] : [];
  return { type: 'watch', cluster: state.selected, topics: topics.slice(0, 20) };
}

/** Every series key in a metrics model, in natural order. */
export function seriesKeys(model: IMetricsModel): string[] {
  const keys = new Set<string>();
  for (const bySeries of Object.values(model.scalars)) {
    Object.keys(bySeries).forEach(k => keys.add(k));
  }
  for (const bySeries of Object.values(model.vectors)) {
    Object.keys(bySeries).forEach(k => keys.add(k));
  }
  return [...keys].sort(naturalCompare);
}

/** The model without the hidden series (values left with no series are dropped). */
export const filterSeries = withoutSeries;

/** Toggle one series of a topic on or off. */
export function toggleSeries(state: IPanelState, topic: string, key: string): IPanelState {
  const current = new Set(state.hidden[topic] ?? []);
  if (current.has(key)) {
    current.delete(key);
  } else {
    current.add(key);
  }
  return { ...state, hidden: { ...state.hidden, [topic]: [...current].sort() } };
}

const UNITS = ['B', 'kiB', 'MiB', 'GiB', 'TiB', 'PiB'];

/** 1536 -> "1.5 kiB"; 0 or unknown -> "-". */
export function formatBytes(n: number | null | undefined): string {
  if (!n || !Number.isFinite(n) || n <= 0) {
    return '-';
  }
  let i = 0;
  let v = n;
  while (v >= 1024 && i < UNITS.length - 1) {
    v /= 1024;
    i++;
  }
  return `${v >= 100 || i === 0 ? Math.round(v) : v.toFixed(1)} ${UNITS[i]}`;
}

/** Memory use of a worker as a fraction of its limit, clamped to [0, 1]. */
export function memoryFraction(w: Pick<IWorker, 'memory' | 'memory_limit'>): number {
  if (!w.memory_limit || w.memory_limit <= 0) {
    return 0;
  }
  return Math.min(1, Math.max(0, w.memory / w.memory_limit));
}

/** "panel", "kernel 4242", "kernel 4242 (attached)". */
export function ownerText(c: Pick<IClusterSummary, 'owner_kind' | 'owner_pid' | 'attached'>): string {
  const base = c.owner_kind === 'panel' ? 'panel' : `${c.owner_kind} ${c.owner_pid}`;
  return c.attached ? `${base} (attached)` : base;
}

/** Jobs grouped by where they run ("cluster · kernel N"), groups in order of first appearance. */
export function groupJobs(jobs: IJob[]): Map<string, IJob[]> {
  const groups = new Map<string, IJob[]>();
  for (const job of jobs) {
    const where = `${job.cluster}${job.kernel ? ` · kernel ${job.kernel}` : ''}`;
    groups.set(where, [...(groups.get(where) ?? []), job]);
  }
  return groups;
}

/** Show the failed items of a job with failures, or hide them when shown (a click on the job). */
export function toggleFailures(state: IPanelState, job: IJob): IPanelState {
  if (state.failuresOpen === job.job) {
    return { ...state, failuresOpen: null };
  }
  return job.failed > 0 ? { ...state, failuresOpen: job.job } : state;
}

/**
 * What the panel lists for a clicked job with failures: one entry per failed
 * item the job message carries (item index, error, worker, traceback tail),
 * and a note when more items failed than the message carries.
 */
export function failureDetails(job: IJob): {
  rows: { head: string; error: string; worker: string; traceback: string }[];
  more: string;
} {
  const failures = job.failures ?? [];
  const rows = failures.map(f => ({
    // the item by its value (what the researcher wrote), not only its index
    head: f.item ? `item ${f.index}: ${f.item}` : `item ${f.index}`,
    error: f.error || 'unknown error',
    worker: f.worker ? `on ${f.worker}` : 'worker not recorded',
    traceback: f.traceback
  }));
  const rest = job.failed - failures.length;
  return { rows, more: rest > 0 ? `${rest} more failed (the job's errors and tracebacks hold all)` : '' };
}

/**
 * Progress of a job: fraction done and fraction failed (the bar's red part,
 * so a finished collect-mode job with failures fills its bar), null when the
 * total is unknown, and a label.
 */
export function jobProgress(job: IJob): { fraction: number | null; failedFraction: number; text: string } {
  const failed = job.failed > 0 ? `, ${job.failed} failed` : '';
  if (job.total === null || job.total === undefined || job.total <= 0) {
    const processed = job.done + job.failed;
    return {
      fraction: job.state === 'running' ? null : processed > 0 ? job.done / processed : 1,
      failedFraction: job.state === 'running' || processed === 0 ? 0 : job.failed / processed,
      text: `${job.done} done${failed}`
    };
  }
  const fraction = Math.min(1, job.done / job.total);
  const failedFraction = Math.min(1 - fraction, job.failed / job.total);
  // items processed, failed ones included: the notebook's progress line counts the same (4/12, 1 failed)
  return { fraction, failedFraction, text: `${job.done + job.failed} / ${job.total}${failed}` };
}

/**
 * A worker count typed by the user, or an error sentence.
 *
 * Mirrors the server's check (a whole number from 0 to 10000).
 */
export function parseWorkers(
  text: string,
  what = 'workers',
  minimum = 0,
  maximum = 10000
): { value: number } | { error: string } {
  const t = text.trim();
  if (!/^\d+$/.test(t)) {
    return { error: `${what} must be a whole number from ${minimum} to ${maximum}.` };
  }
  const value = Number(t);
  if (value < minimum || value > maximum) {
    return { error: `${what} must be a whole number from ${minimum} to ${maximum}.` };
  }
  return { value };
}

/** Cluster names the server accepts (same rule as the registry). */
export function validName(name: string): boolean {
  return /^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$/.test(name);
}

/** The notebook code that attaches a kernel to a cluster. */
export function connectCode(name: string): string {
  return `%load_ext jupyter_cluster\n%cluster connect ${name}`;
}
