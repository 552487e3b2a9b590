/**
 * The sidebar panel: every cluster on the machine, the selected cluster's
 * workers, map jobs, and live metrics charts.
 *
 * Updates arrive on the events websocket (EventsClient); state handling is
 * model.ts's pure reducer; each section is a view that updates its DOM in
 * place (clusters.ts, workersView.ts, jobs.ts, metricsView.ts); REST reads
 * for stopped clusters and earlier runs go through the Loader, never from a
 * render; dialogs are in dialogs.ts.
 */
import { Dialog, showDialog, showErrorMessage } from '@jupyterlab/apputils';
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { postAPI, requestAPI } from '../api';
import { el } from '../common/dom';
import {
  IPanelState,
  clearFinished,
  initialState,
  isStopped,
  parseWorkers,
  reduce,
  select,
  selectTopic,
  setActiveKernel,
  setOverlayTopics,
  setPinned,
  toggleFailures,
  toggleSeries,
  watchMessage
} from '../model';
import type { IClusterSummary, IJob, ServerMessage } from '../messages';
import { ClusterList, HistoryList, IClusterActions, button } from './clusters';
import { ask } from './dialogs';
import { FormValues, INewCluster, checkNewCluster, newClusterFields, newClusterRequest } from './newCluster';
import { EventsClient, IEventsFeed } from './events';
import { clusterIcon } from './icon';
import { DetachedView } from './detached';
import { JobsView } from './jobs';
import { Loader } from './loader';
import { JobsScope, scopedJobs } from './order';
import { Catalog, MetricsView } from './metricsView';
import { WorkersView } from './workersView';

export interface IPanelSettings {
  /** milliseconds between pushed updates */
  refreshRate: number;
  /** workers of a cluster started with "New" (null: the configured default) */
  defaultWorkers: number | null;
}

export const DEFAULT_SETTINGS: IPanelSettings = { refreshRate: 250, defaultWorkers: null };

/** Finished jobs listed before "N more finished". */
const JOBS_SHOWN = 4;
const JOBS_ALL = 20;

/**
 * The left-sidebar widget.
 */
export class ClusterPanel extends Widget {
  private state: IPanelState = initialState();
  private settings: IPanelSettings = { ...DEFAULT_SETTINGS };
  private readonly events: EventsClient;
  private readonly loader: Loader;
  private started = false;
  /** what each view was last given (views are updated only when theirs changed) */
  private last: { [part: string]: unknown[] } = {};
  private keptCatalog: Catalog = [];
  private keptWanted: { cluster: string; topic: string }[] = [];

  private readonly errorNode = el('div', 'jc-error');
  private readonly scopeSelect = el('select', 'jp-mod-styled jc-jobs-scope');
  /** the scope the user picked; null: "this notebook" while a notebook is active, else all */
  private jobsScopePicked: JobsScope | null = null;
  private readonly clusterList: ClusterList;
  private readonly historyList: HistoryList;
  private readonly workersView = new WorkersView();
  private readonly detachedView = new DetachedView();
  private readonly jobsView: JobsView;
  private readonly metricsView: MetricsView;
  private readonly pinButton = button('Follow', 'jc-pin', '', () =>
    this.setState(setPinned(this.state, !this.state.pinned))
  );

  /** Set by the plugin: opens a topic's charts in the main area. */
  onOpenTopic: ((cluster: string, topic: string) => void) | null = null;
  /** Set by the plugin: opens a job's notebook and selects the cell that started it. */
  onOpenCell: ((job: IJob) => void) | null = null;
  /** Set by the plugin: opens a run's sweep table in the main area. */
  onOpenSweep: ((run: string) => void) | null = null;
  /** Set by the plugin: inserts `%cluster connect NAME` into the active notebook. */
  onConnect: ((name: string) => void) | null = null;

  constructor() {
    super();
    this.id = 'jupyter-cluster-panel';
    this.addClass('jc-panel');
    this.title.icon = clusterIcon;
    this.title.caption = 'Dask clusters';

    this.events = new EventsClient({
      onMessage: msg => this.dispatch(msg),
      onStatus: error => this.setError(error)
    });
    this.loader = new Loader(
      msg => this.dispatch(msg),
      () => this.setState(this.state, true)
    );
    const actions: IClusterActions = {
      select: name => this.setState(select(this.state, name)),
      scale: name => void this.scaleCluster(name),
      adapt: name => void this.adaptCluster(name),
      stop: name => void this.stopCluster(name),
      connect: name => this.onConnect?.(name),
      forget: key => void this.forget(key),
      get canConnect() {
        return true;
      }
    };
    this.clusterList = new ClusterList(actions);
    this.historyList = new HistoryList(actions);
    this.jobsView = new JobsView(
      job => this.setState(toggleFailures(this.state, job)),
      () => this.setState(this.state, true),
      job => this.onOpenCell?.(job),
      run => this.onOpenSweep?.(run)
    );
    this.metricsView = new MetricsView({
      openTopic: (cluster, topic) => this.onOpenTopic?.(cluster, topic),
      selectTopic: topic => this.setState(selectTopic(this.state, topic)),
      toggleSeries: (topic, key) => this.setState(toggleSeries(this.state, topic, key)),
      overlayTopics: topics => this.setState(setOverlayTopics(this.state, topics)),
      overlayKept: kept => {
        this.keptWanted = kept;
        this.feedKept();
      }
    });

    const header = el('div', 'jc-header');
    header.append(
      el('h2', 'jc-title', 'Clusters'),
      button(
        'New',
        'jc-new',
        'Start a new cluster owned by the server (survives kernel restarts)',
        () => void this.newCluster()
      ),
      this.pinButton
    );
    const clusters = el('div', 'jc-cluster-scroll');
    clusters.append(this.clusterList.node, this.historyList.node);
    const jobsTools = el('div', 'jc-jobs-tools');
    this.scopeSelect.title = "Whose jobs to list (the active notebook's come first in every case)";
    for (const [value, label] of [
      ['all', 'All notebooks'],
      ['notebook', 'This notebook'],
      ['cluster', 'This cluster']
    ]) {
      const o = el('option', '', label);
      o.value = value;
      this.scopeSelect.append(o);
    }
    this.scopeSelect.addEventListener('change', () => {
      this.jobsScopePicked = this.scopeSelect.value as JobsScope;
      this.setState(this.state, true);
    });
    jobsTools.append(
      this.scopeSelect,
      button('Clear finished', 'jc-clear-jobs', 'Hide the finished jobs listed now', () =>
        this.setState(clearFinished(this.state))
      )
    );
    const jobs = el('div', 'jc-jobs-body');
    jobs.append(jobsTools, this.jobsView.node);
    this.node.append(
      header,
      this.errorNode,
      clusters,
      this.section('Workers', this.workersView.node),
      this.section('Jobs', jobs),
      this.section('Detached', this.detachedView.node),
      this.section('Metrics', this.metricsView.node)
    );
    this.render();
  }

  /** The cluster the user picked (or the first one). */
  get selected(): string | null {
    return this.state.selected;
  }

  /** Live clusters as last pushed. */
  get clusters(): IClusterSummary[] {
    return this.state.clusters;
  }

  /**
   * The active notebook's kernel id (null: no notebook or no kernel): unless
   * pinned, the panel shows that kernel's cluster when it has one.
   */
  setActiveKernel(kernel: string | null, notebook: string | null = null): void {
    this.setState(setActiveKernel(this.state, kernel, notebook));
  }

  /** The jobs list's scope: the user's pick, else the active notebook's jobs while one is active. */
  get jobsScope(): JobsScope {
    return this.jobsScopePicked ?? (this.state.activeNotebook || this.state.activeKernel ? 'notebook' : 'all');
  }

  /** The active notebook's kernel id as last set. */
  get activeKernel(): string | null {
    return this.state.activeKernel;
  }

  /**
   * The panel's events connection, for the main-area views to listen on
   * (a sweep tab's socket would add the server's full pushes per tab); a
   * listener connects it even before the panel is first shown.
   */
  get feed(): IEventsFeed {
    return this.events;
  }

  /** Re-style the charts for a dark or light theme. */
  setDark(dark: boolean): void {
    this.metricsView.setDark(dark);
  }

  /** Apply new settings (refresh rate is sent to the server at once). */
  configure(settings: Partial<IPanelSettings>): void {
    this.settings = { ...this.settings, ...settings };
    this.events.setInterval(this.settings.refreshRate);
  }

  /** Connect the feed (idempotent); called when the panel is first shown. */
  start(): void {
    if (!this.started) {
      this.started = true;
      this.events.setInterval(this.settings.refreshRate);
      this.events.connect();
      this.detachedView.start();
    }
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this.events.dispose();
    this.detachedView.dispose();
    this.metricsView.dispose();
    super.dispose();
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this.start();
    this.metricsView.resize();
  }

  protected onResize(msg: Widget.ResizeMessage): void {
    super.onResize(msg);
    this.metricsView.resize();
  }

  protected onAfterAttach(msg: Message): void {
    super.onAfterAttach(msg);
    if (this.isVisible) {
      this.start();
    }
  }

  // -- state -------------------------------------------------------------------
  private dispatch(msg: ServerMessage): void {
    if (msg.type === 'error') {
      console.warn('jupyter-cluster:', msg.message);
    }
    if (msg.type === 'workers' && msg.name === this.state.selected && !this.state.detail) {
      this.events.rewatch(); // a diff without the list it applies to: ask for the list again
      return;
    }
    this.setState(reduce(this.state, msg));
  }

  /** The one way state changes: fetch what it lacks (Loader), draw what changed, tell the server what to push. */
  private setState(state: IPanelState, force = false): void {
    if (state === this.state && !force) {
      return;
    }
    this.state = state;
    this.loader.sync(state);
    if (this.state !== state) {
      return; // the loader had what was missing and dispatched it: that state was drawn
    }
    this.keptCatalog = this.catalogOfKept();
    this.render();
    this.events.watch(...watchArgs(state));
    this.feedKept();
  }

  private setError(message: string | null): void {
    this.state = { ...this.state, error: message };
    this.errorNode.textContent = message ?? '';
    this.errorNode.style.display = message ? '' : 'none';
  }

  /** Earlier runs' topics the overlay can draw (the server's kept clusters, other than the one shown). */
  private catalogOfKept(): Catalog {
    const out: Catalog = [];
    for (const h of this.state.history) {
      if (h.name === this.state.selected || h.topics.length === 0) {
        continue;
      }
      for (const t of this.loader.topicsOf(h.name) ?? []) {
        out.push({ topic: t.topic, scalars: t.scalars, cluster: h.name });
      }
    }
    return out;
  }

  /** Give the overlay the earlier runs' models it asked for (read once each). */
  private feedKept(): void {
    for (const { cluster, topic } of this.keptWanted) {
      const model = this.loader.model(cluster, topic);
      if (model) {
        this.metricsView.setKept(model, cluster);
      }
    }
  }

  // -- drawing -------------------------------------------------------------------
  private section(title: string, body: HTMLElement): HTMLElement {
    const s = el('section', `jc-section jc-section-${title.toLowerCase()}`);
    const h = el('h3', 'jc-section-title', title);
    h.tabIndex = 0;
    h.setAttribute('role', 'button');
    h.setAttribute('aria-expanded', 'true');
    h.title = `Show or hide ${title.toLowerCase()}`;
    const toggle = (): void => {
      const collapsed = s.classList.toggle('jc-collapsed');
      h.setAttribute('aria-expanded', String(!collapsed));
      if (!collapsed) {
        this.metricsView.resize();
      }
    };
    h.addEventListener('click', toggle);
    h.addEventListener('keydown', event => {
      if (event.key === 'Enter' || event.key === ' ') {
        event.preventDefault();
        toggle();
      }
    });
    s.append(h, body);
    return s;
  }

  /** Whether a part's inputs differ (by identity) from when it was last drawn. */
  private changed(part: string, inputs: unknown[]): boolean {
    const last = this.last[part];
    if (last && last.length === inputs.length && last.every((v, i) => v === inputs[i])) {
      return false;
    }
    this.last[part] = inputs;
    return true;
  }

  private render(): void {
    const s = this.state;
    this.errorNode.textContent = s.error ?? '';
    this.errorNode.style.display = s.error ? '' : 'none';
    this.pinButton.textContent = s.pinned ? 'Pinned' : 'Follow';
    this.pinButton.classList.toggle('jc-pinned', s.pinned);
    this.pinButton.title = s.pinned
      ? "The selection is held; click to follow the active notebook's cluster (or where new work starts)"
      : "Following the active notebook's cluster (or where new work starts); click to hold the selection";
    const pinned = s.pinned ? s.selected : null;
    if (this.changed('clusters', [s.clusters, s.selected, pinned, s.kernelCluster])) {
      this.clusterList.update(s.clusters, s.selected, pinned, s.kernelCluster);
    }
    if (this.changed('history', [s.history, s.selected])) {
      this.historyList.update(s.history, s.selected);
    }
    const stopped = isStopped(s, s.selected);
    if (this.changed('workers', [s.detail, s.selected, stopped])) {
      if (s.detail) {
        this.workersView.update(s.detail);
      } else {
        this.workersView.showMessage(
          stopped
            ? 'Stopped: its jobs and metrics are kept below.'
            : s.selected
              ? 'Waiting for the scheduler…'
              : 'No cluster selected.'
        );
      }
    }
    const showAll = this.jobsView.showAll;
    const scope = this.jobsScope;
    const scoped = scope === 'cluster' ? s.selected : null;
    const active = [s.activeKernel, s.activeNotebook];
    if (this.changed('jobs', [s.jobs, s.clearedBefore, s.failuresOpen, ...active, showAll, scope, scoped])) {
      if (this.scopeSelect.value !== scope) {
        this.scopeSelect.value = scope;
      }
      const { rows, more } = scopedJobs(s, scope, showAll ? JOBS_ALL : JOBS_SHOWN);
      this.jobsView.update(rows, more, s.failuresOpen, s);
    }
    this.metricsView.update(s, [...s.topics.map(t => ({ topic: t.topic, scalars: t.scalars })), ...this.keptCatalog]);
  }

  // -- actions -------------------------------------------------------------------
  /** Ask for a name, backend, workers, threads and memory, then start a cluster from the server. */
  async newCluster(): Promise<void> {
    let backends: string[] = [];
    let defaultBackend: string | null = null;
    try {
      const config = await requestAPI<{ backend: string; backends: string[] }>('config');
      backends = config.backends ?? [];
      defaultBackend = config.backend ?? null;
    } catch (error) {
      console.warn('jupyter-cluster:', (error as Error).message);
    }
    const values = await ask(
      'Start a cluster',
      'Start',
      newClusterFields(backends, defaultBackend, this.settings.defaultWorkers),
      checkNewCluster
    );
    if (!values) {
      return;
    }
    await this.startCluster(newClusterRequest(values as FormValues));
  }

  /** Start a cluster through the server (a "starting" card shows meanwhile); returns its name. */
  async startCluster(request: INewCluster): Promise<string | null> {
    this.setError(null);
    this.node.classList.add('jc-starting');
    const parts = [
      request.backend,
      request.workers !== undefined ? `${request.workers} workers` : '',
      request.threads !== undefined ? `${request.threads} threads each` : '',
      request.memory_limit ? `${request.memory_limit} each` : ''
    ].filter(Boolean);
    const done = this.clusterList.showStarting(
      request.name ?? 'new cluster',
      parts.join(' · ') || 'configured defaults'
    );
    try {
      const reply = await postAPI<{ cluster: IClusterSummary }>('clusters', request);
      this.setState(select(this.state, reply.cluster.name));
      return reply.cluster.name;
    } catch (error) {
      await showErrorMessage('Could not start the cluster', String((error as Error).message));
      return null;
    } finally {
      done();
      this.node.classList.remove('jc-starting');
    }
  }

  /** Ask for a worker count and scale ``name``. */
  async scaleCluster(name: string, workers?: number): Promise<void> {
    if (workers === undefined) {
      const current = this.state.clusters.find(c => c.name === name)?.n_workers ?? 1;
      await ask(
        `Scale ${name}`,
        'Scale',
        [{ name: 'workers', label: 'Workers', value: String(current) }],
        v => {
          const parsed = parseWorkers(v.workers);
          return 'error' in parsed ? parsed.error : null;
        },
        v =>
          postAPI(`clusters/${encodeURIComponent(name)}/scale`, {
            workers: (parseWorkers(v.workers) as { value: number }).value
          })
      );
      return;
    }
    await this.act(`Could not scale ${name}`, () => postAPI(`clusters/${encodeURIComponent(name)}/scale`, { workers }));
  }

  /** Ask for bounds and let ``name`` adapt between them. */
  async adaptCluster(name: string): Promise<void> {
    await ask(
      `Adapt ${name}`,
      'Adapt',
      [
        { name: 'minimum', label: 'Minimum', value: '0' },
        {
          name: 'maximum',
          label: 'Maximum',
          value: String(Math.max(4, this.state.clusters.find(c => c.name === name)?.n_workers ?? 1))
        }
      ],
      v => {
        for (const parsed of [parseWorkers(v.minimum, 'minimum'), parseWorkers(v.maximum, 'maximum')]) {
          if ('error' in parsed) {
            return parsed.error;
          }
        }
        return Number(v.maximum) < Number(v.minimum) ? 'maximum must be at least minimum.' : null;
      },
      v =>
        postAPI(`clusters/${encodeURIComponent(name)}/adapt`, {
          minimum: (parseWorkers(v.minimum, 'minimum') as { value: number }).value,
          maximum: (parseWorkers(v.maximum, 'maximum') as { value: number }).value
        })
    );
  }

  /** Confirm and stop ``name``. */
  async stopCluster(name: string, confirm = true): Promise<void> {
    // the cluster shown when Stop was clicked, never a later cluster that took its name (the server checks the id)
    const id = this.state.clusters.find(c => c.name === name)?.id;
    if (confirm) {
      const owner = this.state.clusters.find(c => c.name === name);
      const note =
        owner && owner.owner_kind === 'kernel'
          ? ` It belongs to kernel ${owner.owner_pid}; its work there stops too.`
          : '';
      const result = await showDialog({
        title: `Stop ${name}?`,
        body: `Its workers shut down.${note}`,
        buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Stop' })]
      });
      if (!result.button.accept) {
        return;
      }
    }
    const query = id ? `?id=${encodeURIComponent(id)}` : '';
    await this.act(`Could not stop ${name}`, () =>
      requestAPI(`clusters/${encodeURIComponent(name)}${query}`, { method: 'DELETE' })
    );
  }

  private async forget(key: string): Promise<void> {
    await this.act('Could not delete the history', () =>
      requestAPI(`clusters/${encodeURIComponent(key)}`, { method: 'DELETE' })
    );
    this.loader.forget(key);
  }

  private async act(title: string, fn: () => Promise<unknown>): Promise<void> {
    try {
      await fn();
    } catch (error) {
      await showErrorMessage(title, String((error as Error).message));
    }
  }
}

function watchArgs(state: IPanelState): [string | null, string[]] {
  const w = watchMessage(state);
  return [w.cluster, w.topics];
}
