/**
 * The sidebar panel: every cluster on the machine, the selected cluster's
 * workers, map jobs from every kernel, and live metrics charts.
 *
 * Updates arrive on the events websocket (the server pushes what changed at
 * the refresh rate); actions go through REST.  State handling lives in
 * model.ts; this file only draws it and wires the buttons.
 */
import { Dialog, showDialog, showErrorMessage } from '@jupyterlab/apputils';
import { LabIcon } from '@jupyterlab/ui-components';
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { eventsURL, postAPI, requestAPI } from './api';
import { IMetricsModel, MetricsCharts } from './charts/charts';
import { seriesLabel } from './charts/data';
import { el } from './charts/dom';
import {
  IClusterSummary,
  IHistoryCluster,
  IJob,
  IPanelState,
  ITopicSummary,
  ServerMessage,
  clearFinished,
  failureDetails,
  formatBytes,
  groupJobs,
  initialState,
  isStopped,
  jobProgress,
  memoryFraction,
  ownerText,
  parseWorkers,
  reduce,
  select,
  selectTopic,
  seriesKeys,
  setActiveKernel,
  setOverlayTopics,
  setPinned,
  toggleFailures,
  toggleSeries,
  visibleJobs,
  validName,
  watchMessage
} from './model';

const CLUSTER_SVG = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <circle cx="12" cy="4.5" r="2.5"/><circle cx="4.5" cy="18" r="2.5"/><circle cx="19.5" cy="18" r="2.5"/>
    <circle cx="12" cy="13" r="2"/>
    <path d="M11.3 6.8h1.4v4.4h-1.4zM6.1 16.6l4.5-2.6.7 1.2-4.5 2.6zM17.9 16.6l-4.5-2.6-.7 1.2 4.5 2.6z"/>
  </g>
</svg>`;

/** The panel's icon in the left sidebar. */
export const clusterIcon = new LabIcon({ name: 'jupyter-cluster:cluster', svgstr: CLUSTER_SVG });

export interface IPanelSettings {
  /** milliseconds between pushed updates */
  refreshRate: number;
  /** workers of a cluster started with "New" (null: the configured default) */
  defaultWorkers: number | null;
}

export const DEFAULT_SETTINGS: IPanelSettings = { refreshRate: 250, defaultWorkers: null };

function button(label: string, className: string, title: string, onClick: () => void): HTMLButtonElement {
  const b = el('button', `jp-Button jc-button ${className}`, label);
  b.title = title;
  b.addEventListener('click', event => {
    event.stopPropagation();
    onClick();
  });
  return b;
}

type FormValues = { [name: string]: string };

/**
 * A dialog body with labelled inputs; getValue() returns their current values.
 * `check` returns an error sentence for values that cannot be sent; it is
 * shown in the dialog as the user types, as is `error` (a refusal from before).
 */
class FormBody extends Widget implements Dialog.IBodyWidget<FormValues> {
  private readonly inputs = new Map<string, HTMLInputElement>();
  private readonly errorNode = el('div', 'jc-form-error');

  constructor(
    fields: { name: string; label: string; value: string; placeholder?: string }[],
    error = '',
    private readonly check: (values: FormValues) => string | null = () => null
  ) {
    super();
    this.addClass('jc-form');
    for (const f of fields) {
      const label = el('label', 'jc-form-row');
      label.append(el('span', '', f.label));
      const input = el('input', `jp-mod-styled jc-input-${f.name}`);
      input.name = f.name;
      input.value = f.value;
      input.placeholder = f.placeholder ?? '';
      input.addEventListener('input', () => this.showError(this.check(this.getValue()) ?? ''));
      label.append(input);
      this.node.append(label);
      this.inputs.set(f.name, input);
    }
    this.node.append(this.errorNode);
    this.showError(error);
  }

  private showError(message: string): void {
    this.errorNode.textContent = message;
    this.errorNode.style.display = message ? '' : 'none';
  }

  getValue(): { [name: string]: string } {
    const out: { [name: string]: string } = {};
    this.inputs.forEach((input, name) => (out[name] = input.value));
    return out;
  }
}

/**
 * The left-sidebar widget.
 */
export class ClusterPanel extends Widget {
  private state: IPanelState = initialState();
  private settings: IPanelSettings = { ...DEFAULT_SETTINGS };
  private socket: WebSocket | null = null;
  private backoff = 500;
  private reconnectTimer = 0;
  private started = false;
  private charts: MetricsCharts | null = null;
  private drawn: { [part: string]: string } = {};
  private chartInput: { metrics: unknown; off: unknown; sources: Map<string, IMetricsModel> } = {
    metrics: null,
    off: null,
    sources: new Map()
  };
  private dark: boolean | null = null;
  private showAllJobs = false;
  /** what was fetched over REST for a stopped cluster ("cluster\0topic") */
  private fetched = '';
  /** the overlay's other topics fetched over REST for a stopped cluster ("cluster\0topic") */
  private readonly fetchedOverlay = new Set<string>();
  /** earlier runs the server kept: their topics (read once each: they no longer change), for the overlay */
  private readonly keptTopics = new Map<string, ITopicSummary[] | null>();
  /** their models the overlay draws, read once each ("cluster\0topic") */
  private readonly keptModels = new Map<string, IMetricsModel | null>();

  private readonly errorNode = el('div', 'jc-error');
  private readonly listNode = el('div', 'jc-clusters');
  private readonly workersNode = el('div', 'jc-workers-section');
  private readonly jobsNode = el('div', 'jc-jobs');
  private readonly topicSelect = el('select', 'jp-mod-styled jc-topic');
  private readonly seriesNode = el('div', 'jc-series');
  private readonly chartsHost = el('div', 'jc-charts');
  private readonly metricsEmpty = el('div', 'jc-empty', 'No metrics yet: call jupyter_cluster.report(...) in a task.');
  private readonly pinButton = button('Follow', 'jc-pin', '', () => {
    const before = this.state.selected;
    this.setState(setPinned(this.state, !this.state.pinned));
    if (this.state.selected !== before) {
      this.sendWatch();
    }
  });
  private readonly historyNode = el('div', 'jc-history');
  private readonly openButton = button('Open', 'jc-open-topic', 'Open this topic in the main area', () => {
    const { selected, topic } = this.state;
    if (selected && topic) {
      this.onOpenTopic?.(selected, topic);
    }
  });

  constructor() {
    super();
    this.id = 'jupyter-cluster-panel';
    this.addClass('jc-panel');
    this.title.icon = clusterIcon;
    this.title.caption = 'Dask clusters';

    const header = el('div', 'jc-header');
    header.append(el('h2', 'jc-title', 'Clusters'));
    header.append(
      button(
        'New',
        'jc-new',
        'Start a new cluster owned by the server (survives kernel restarts)',
        () => void this.newCluster()
      )
    );
    header.append(this.pinButton);
    this.node.append(header, this.errorNode, this.listNode, this.historyNode);

    this.node.append(this.section('Workers', this.workersNode));
    const jobsTools = el('div', 'jc-jobs-tools');
    jobsTools.append(
      button('Clear finished', 'jc-clear-jobs', 'Hide the finished jobs listed now', () =>
        this.setState(clearFinished(this.state))
      )
    );
    const jobs = el('div');
    jobs.append(jobsTools, this.jobsNode);
    this.node.append(this.section('Jobs', jobs));
    const metrics = el('div', 'jc-metrics-section');
    this.topicSelect.title = 'Metrics topic';
    this.topicSelect.addEventListener('change', () => {
      this.setState(selectTopic(this.state, this.topicSelect.value || null));
      this.sendWatch();
    });
    const topicRow = el('div', 'jc-topic-row');
    topicRow.append(this.topicSelect, this.openButton);
    metrics.append(topicRow, this.seriesNode, this.metricsEmpty, this.chartsHost);
    this.node.append(this.section('Metrics', metrics));
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
  setActiveKernel(kernel: string | null): void {
    const before = this.state.selected;
    this.setState(setActiveKernel(this.state, kernel));
    if (this.state.selected !== before) {
      this.sendWatch();
    }
  }

  /** The active notebook's kernel id as last set. */
  get activeKernel(): string | null {
    return this.state.activeKernel;
  }

  /** Re-style the charts for a dark or light theme. */
  setDark(dark: boolean): void {
    this.dark = dark;
    this.charts?.setDark(dark);
  }

  /** Set by the plugin: opens a topic's charts in the main area. */
  onOpenTopic: ((cluster: string, topic: string) => void) | null = null;

  /** Apply new settings (refresh rate is sent to the server at once). */
  configure(settings: Partial<IPanelSettings>): void {
    this.settings = { ...this.settings, ...settings };
    this.send({ type: 'interval', ms: this.settings.refreshRate });
  }

  /** Connect the feed (idempotent); called when the panel is first shown. */
  start(): void {
    if (!this.started) {
      this.started = true;
      this.connect();
    }
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    window.clearTimeout(this.reconnectTimer);
    this.socket?.close();
    this.socket = null;
    this.charts?.dispose();
    super.dispose();
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this.start();
    this.charts?.resize();
  }

  protected onResize(msg: Widget.ResizeMessage): void {
    super.onResize(msg);
    this.charts?.resize();
  }

  protected onAfterAttach(msg: Message): void {
    super.onAfterAttach(msg);
    if (this.isVisible) {
      this.start();
    }
  }

  // -- feed --------------------------------------------------------------------
  private connect(): void {
    if (this.isDisposed) {
      return;
    }
    let socket: WebSocket;
    try {
      socket = new WebSocket(eventsURL());
    } catch {
      this.scheduleReconnect();
      return;
    }
    this.socket = socket;
    socket.onopen = () => {
      this.backoff = 500;
      this.setError(null);
      this.send({ type: 'interval', ms: this.settings.refreshRate });
      this.sendWatch();
    };
    socket.onmessage = event => {
      try {
        this.dispatch(JSON.parse(String(event.data)) as ServerMessage);
      } catch (error) {
        console.error('jupyter-cluster: bad message', error);
      }
    };
    socket.onclose = () => {
      if (this.socket === socket) {
        this.socket = null;
        this.setError('Lost the connection to the server; reconnecting…');
        this.scheduleReconnect();
      }
    };
  }

  private scheduleReconnect(): void {
    if (this.isDisposed) {
      return;
    }
    window.clearTimeout(this.reconnectTimer);
    this.reconnectTimer = window.setTimeout(() => this.connect(), this.backoff);
    this.backoff = Math.min(this.backoff * 2, 10000);
  }

  private send(msg: unknown): void {
    if (this.socket && this.socket.readyState === WebSocket.OPEN) {
      this.socket.send(JSON.stringify(msg));
    }
  }

  private sendWatch(): void {
    this.send(watchMessage(this.state));
  }

  private dispatch(msg: ServerMessage): void {
    const before = this.state;
    this.setState(reduce(before, msg));
    if (msg.type === 'error') {
      console.warn('jupyter-cluster:', msg.message);
    }
    if (this.state.selected !== before.selected || this.state.topic !== before.topic) {
      this.sendWatch();
    }
  }

  private setState(state: IPanelState): void {
    this.state = state;
    this.render();
    this.fetchStopped();
  }

  /**
   * A stopped cluster's topics and metrics no longer change and are not
   * pushed: read them once over REST.
   */
  private fetchStopped(): void {
    const { selected, topic, topics, metrics } = this.state;
    if (!selected || !isStopped(this.state, selected)) {
      return;
    }
    // the overlay's other topics, once each
    for (const other of this.state.overlayTopics) {
      const key = `${selected}\u0000${other}`;
      if (this.state.overlayMetrics[other] || this.fetchedOverlay.has(key)) {
        continue;
      }
      this.fetchedOverlay.add(key);
      void requestAPI<IMetricsModel>(`clusters/${encodeURIComponent(selected)}/metrics/${encodeURIComponent(other)}`)
        .then(data => this.dispatch({ type: 'metrics', cluster: selected, topic: other, data }))
        .catch(error => console.warn('jupyter-cluster:', (error as Error).message));
    }
    const key = `${selected}\u0000${topic ?? ''}\u0000${topics.length}\u0000${metrics ? 1 : 0}`;
    if (key === this.fetched) {
      return;
    }
    this.fetched = key;
    const base = `clusters/${encodeURIComponent(selected)}/metrics`;
    if (topics.length === 0) {
      void requestAPI<{ topics: ITopicSummary[] }>(base)
        .then(reply => this.dispatch({ type: 'topics', cluster: selected, topics: reply.topics }))
        .catch(error => console.warn('jupyter-cluster:', (error as Error).message));
    } else if (topic && !metrics) {
      void requestAPI<IMetricsModel>(`${base}/${encodeURIComponent(topic)}`)
        .then(data => this.dispatch({ type: 'metrics', cluster: selected, topic, data }))
        .catch(error => console.warn('jupyter-cluster:', (error as Error).message));
    }
  }

  private setError(message: string | null): void {
    this.state = { ...this.state, error: message };
    this.renderError();
  }

  // -- actions -------------------------------------------------------------------
  /** Ask for a name and a worker count, then start a cluster from the server. */
  async newCluster(): Promise<void> {
    const defaults = this.settings.defaultWorkers;
    const check = (v: FormValues): string | null => {
      const name = v.name.trim();
      if (name && !validName(name)) {
        return `${JSON.stringify(name)} is not a valid cluster name; use letters, digits, '-', '_' or '.'.`;
      }
      const parsed = v.workers.trim() ? parseWorkers(v.workers) : { value: 0 };
      return 'error' in parsed ? parsed.error : null;
    };
    const values = await this.ask(
      'Start a cluster',
      'Start',
      [
        { name: 'name', label: 'Name', value: '', placeholder: 'automatic' },
        {
          name: 'workers',
          label: 'Workers',
          value: defaults === null ? '' : String(defaults),
          placeholder: 'configured default'
        }
      ],
      check
    );
    if (!values) {
      return;
    }
    const request: { name?: string; workers?: number } = {};
    if (values.name.trim()) {
      request.name = values.name.trim();
    }
    if (values.workers.trim()) {
      request.workers = (parseWorkers(values.workers) as { value: number }).value;
    }
    await this.startCluster(request);
  }

  /**
   * Show a form until its values pass `check` (the error stays in the dialog,
   * with what the user typed); null when cancelled.
   */
  private async ask(
    title: string,
    label: string,
    fields: { name: string; label: string; value: string; placeholder?: string }[],
    check: (values: FormValues) => string | null,
    submit?: (values: FormValues) => Promise<void>
  ): Promise<FormValues | null> {
    let error = '';
    for (;;) {
      const result = await showDialog({
        title,
        body: new FormBody(fields, error, check),
        buttons: [Dialog.cancelButton(), Dialog.okButton({ label })]
      });
      if (!result.button.accept || !result.value) {
        return null;
      }
      const values = result.value;
      error = check(values) ?? '';
      if (!error && submit) {
        // a refusal from the server comes back in the dialog too, with what was typed
        try {
          await submit(values);
        } catch (reason) {
          error = String((reason as Error).message);
        }
      }
      if (!error) {
        return values;
      }
      fields = fields.map(f => ({ ...f, value: values[f.name] ?? f.value }));
    }
  }

  /** Start a cluster through the server; returns its name. */
  async startCluster(request: { name?: string; workers?: number }): Promise<string | null> {
    this.setError(null);
    this.node.classList.add('jc-starting');
    try {
      const reply = await postAPI<{ cluster: IClusterSummary }>('clusters', request);
      this.setState(select(this.state, reply.cluster.name));
      this.sendWatch();
      return reply.cluster.name;
    } catch (error) {
      await showErrorMessage('Could not start the cluster', String((error as Error).message));
      return null;
    } finally {
      this.node.classList.remove('jc-starting');
    }
  }

  /** Ask for a worker count and scale ``name``. */
  async scaleCluster(name: string, workers?: number): Promise<void> {
    if (workers === undefined) {
      const current = this.state.clusters.find(c => c.name === name)?.n_workers ?? 1;
      await this.ask(
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
    await this.ask(
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
    await this.act(`Could not stop ${name}`, () =>
      requestAPI(`clusters/${encodeURIComponent(name)}`, { method: 'DELETE' })
    );
  }

  /** Set by the plugin: inserts `%cluster connect NAME` into the active notebook. */
  onConnect: ((name: string) => void) | null = null;

  private async act(title: string, fn: () => Promise<unknown>): Promise<void> {
    try {
      await fn();
    } catch (error) {
      await showErrorMessage(title, String((error as Error).message));
    }
  }

  // -- drawing -------------------------------------------------------------------
  private section(title: string, body: HTMLElement): HTMLElement {
    const s = el('section', `jc-section jc-section-${title.toLowerCase()}`);
    s.append(el('h3', 'jc-section-title', title), body);
    return s;
  }

  /** Redraw a part only when its data changed (keeps focus, scroll and zoom). */
  private changed(part: string, data: unknown): boolean {
    const key = JSON.stringify(data);
    if (this.drawn[part] === key) {
      return false;
    }
    this.drawn[part] = key;
    return true;
  }

  private render(): void {
    this.renderError();
    this.renderPin();
    this.renderClusters();
    this.renderHistory();
    this.renderWorkers();
    this.renderJobs();
    this.renderMetrics();
  }

  private renderError(): void {
    this.errorNode.textContent = this.state.error ?? '';
    this.errorNode.style.display = this.state.error ? '' : 'none';
  }

  private renderPin(): void {
    const pinned = this.state.pinned;
    this.pinButton.textContent = pinned ? 'Pinned' : 'Follow';
    this.pinButton.classList.toggle('jc-pinned', pinned);
    this.pinButton.title = pinned
      ? "The selection is held; click to follow the active notebook's cluster (or where new work starts)"
      : "Following the active notebook's cluster (or where new work starts); click to hold the selection";
  }

  /** Stopped clusters whose jobs and metrics the server kept. */
  private renderHistory(): void {
    const { history, selected } = this.state;
    if (!this.changed('history', [history.map(h => [h.name, h.topics]), selected])) {
      return;
    }
    this.historyNode.replaceChildren();
    if (history.length === 0) {
      return;
    }
    this.historyNode.append(el('div', 'jc-history-title', 'Stopped (history kept)'));
    for (const h of history) {
      this.historyNode.append(this.historyRow(h, h.name === selected));
    }
  }

  private historyRow(h: IHistoryCluster, isSelected: boolean): HTMLElement {
    const item = el('div', `jc-cluster jc-cluster-stopped${isSelected ? ' jc-selected' : ''}`);
    item.dataset.name = h.name;
    item.addEventListener('click', () => {
      this.setState(select(this.state, h.name));
      this.sendWatch();
    });
    const when = h.stopped ? new Date(h.stopped * 1000).toLocaleTimeString() : '';
    const title = el('div', 'jc-cluster-title');
    title.append(
      el('span', 'jc-cluster-name', h.cluster),
      el('span', 'jc-status jc-status-stopped', `stopped ${when}`)
    );
    const topics = h.topics.length ? `metrics: ${h.topics.join(', ')}` : 'jobs only';
    item.append(title, el('div', 'jc-cluster-meta', topics));
    const actions = el('div', 'jc-cluster-actions');
    actions.append(
      button('Forget', 'jc-forget', `Delete the kept jobs and metrics of ${h.cluster}`, () => void this.forget(h.name))
    );
    item.append(actions);
    return item;
  }

  private async forget(key: string): Promise<void> {
    await this.act('Could not delete the history', () =>
      requestAPI(`clusters/${encodeURIComponent(key)}`, { method: 'DELETE' })
    );
  }

  private renderClusters(): void {
    const { clusters, selected } = this.state;
    if (!this.changed('clusters', [clusters, selected])) {
      return;
    }
    this.listNode.replaceChildren();
    if (clusters.length === 0) {
      this.listNode.append(el('div', 'jc-empty', 'No clusters. Start one with New, or %cluster start in a notebook.'));
      return;
    }
    for (const c of clusters) {
      const item = el('div', `jc-cluster${c.name === selected ? ' jc-selected' : ''}`);
      item.dataset.name = c.name;
      item.addEventListener('click', () => {
        this.setState(select(this.state, c.name));
        this.sendWatch();
      });
      const title = el('div', 'jc-cluster-title');
      title.append(el('span', 'jc-cluster-name', c.name), el('span', `jc-status jc-status-${c.status}`, c.status));
      const meta = el('div', 'jc-cluster-meta', `${c.backend} · ${c.address}`);
      const stats = el(
        'div',
        'jc-cluster-stats',
        `${c.n_workers} workers · ${c.cores} cores · ${formatBytes(c.memory_limit)} · owner: ${ownerText(c)}`
      );
      item.append(title, meta, stats);
      if (c.error && c.status !== 'running') {
        item.append(el('div', 'jc-cluster-error', c.error));
      }
      const actions = el('div', 'jc-cluster-actions');
      if (c.dashboard_link) {
        const link = el('a', 'jc-dashboard', 'Dashboard');
        link.href = c.dashboard_link;
        link.target = '_blank';
        link.rel = 'noopener';
        link.addEventListener('click', event => event.stopPropagation());
        actions.append(link);
      }
      actions.append(
        button('Scale', 'jc-scale', `Set the number of workers of ${c.name}`, () => void this.scaleCluster(c.name)),
        button('Adapt', 'jc-adapt', `Let ${c.name} follow the load`, () => void this.adaptCluster(c.name)),
        button('Stop', 'jc-stop', `Stop ${c.name}`, () => void this.stopCluster(c.name)),
        button('Connect', 'jc-connect', `Insert %cluster connect ${c.name} into the notebook`, () =>
          this.onConnect?.(c.name)
        )
      );
      item.append(actions);
      this.listNode.append(item);
    }
  }

  private renderWorkers(): void {
    const detail = this.state.detail;
    const key = detail
      ? [detail.name, detail.workers]
      : [this.state.selected, isStopped(this.state, this.state.selected)];
    if (!this.changed('workers', key)) {
      return;
    }
    this.workersNode.replaceChildren();
    if (!detail) {
      this.workersNode.append(
        el(
          'div',
          'jc-empty',
          isStopped(this.state, this.state.selected)
            ? 'Stopped: its jobs and metrics are kept below.'
            : this.state.selected
              ? 'Waiting for the scheduler…'
              : 'No cluster selected.'
        )
      );
      return;
    }
    const table = el('table', 'jc-workers');
    const head = el('tr');
    const columns: [string, string][] = [
      ['name', 'worker name'],
      ['status', 'worker status'],
      ['CPU', 'CPU use'],
      ['memory', 'memory used (bar: of its limit)'],
      ['tasks', 'tasks running']
    ];
    for (const [h, title] of columns) {
      const th = el('th', '', h);
      th.title = title;
      head.append(th);
    }
    table.append(el('thead'));
    table.tHead!.append(head);
    const body = el('tbody');
    for (const w of detail.workers) {
      const row = el('tr', 'jc-worker');
      row.title = `${w.address}, ${w.nthreads} threads`;
      const bar = el('div', 'jc-bar');
      const fill = el('div', 'jc-bar-fill');
      const f = memoryFraction(w);
      fill.style.width = `${(f * 100).toFixed(1)}%`;
      if (f > 0.85) {
        fill.classList.add('jc-bar-high');
      }
      bar.append(fill);
      const mem = el('td', 'jc-memory');
      const memText = `${formatBytes(w.memory)} / ${formatBytes(w.memory_limit)}`;
      mem.title = memText;
      mem.append(bar, el('span', 'jc-bar-text', formatBytes(w.memory)));
      row.append(
        el('td', 'jc-worker-name', w.name),
        el('td', `jc-worker-status jc-status-${w.status}`, w.status),
        el('td', 'jc-cpu', `${Math.round(w.cpu)}%`),
        mem,
        el('td', 'jc-tasks', String(w.executing))
      );
      body.append(row);
    }
    table.append(body);
    this.workersNode.append(table);
    if (detail.workers.length === 0) {
      this.workersNode.append(el('div', 'jc-empty', 'No workers yet.'));
    }
  }

  private renderJobs(): void {
    const { rows, more } = visibleJobs(this.state, this.showAllJobs ? 20 : 4);
    if (!this.changed('jobs', [rows, more, this.showAllJobs, this.state.failuresOpen])) {
      return;
    }
    this.jobsNode.replaceChildren();
    if (rows.length === 0) {
      this.jobsNode.append(el('div', 'jc-empty', 'No maps yet: run a %%parallel cell or Pool.map.'));
      return;
    }
    // grouped by where they run: cluster and kernel (a header only when there are several)
    const groups = groupJobs(rows);
    for (const [where, jobs] of groups) {
      if (groups.size > 1) {
        this.jobsNode.append(el('div', 'jc-job-group', where));
      }
      jobs.forEach(job => this.jobsNode.append(this.jobRow(job)));
    }
    if (more > 0 || this.showAllJobs) {
      const toggle = button(
        this.showAllJobs ? 'Show fewer' : `${more} more finished`,
        'jc-more-jobs',
        'Show or hide older finished jobs',
        () => {
          this.showAllJobs = !this.showAllJobs;
          this.renderJobs();
        }
      );
      this.jobsNode.append(toggle);
    }
  }

  private jobRow(job: IJob): HTMLElement {
    const row = el('div', `jc-job jc-job-${job.state}`);
    row.dataset.job = job.job;
    const { fraction, failedFraction, text } = jobProgress(job);
    const head = el('div', 'jc-job-head');
    const label = el('span', 'jc-job-label', job.label);
    label.title = job.label;
    head.append(label, el('span', 'jc-job-state', job.state));
    const bar = el('div', `jc-bar jc-progress${fraction === null ? ' jc-indeterminate' : ''}`);
    const fill = el('div', 'jc-bar-fill');
    fill.style.width = `${((fraction ?? 1) * 100).toFixed(1)}%`;
    bar.append(fill);
    if (failedFraction > 0) {
      const failed = el('div', 'jc-bar-failed');
      failed.style.width = `${(failedFraction * 100).toFixed(1)}%`;
      failed.title = `${job.failed} failed`;
      bar.append(failed);
    }
    const foot = el('div', 'jc-job-foot');
    foot.append(
      el('span', 'jc-job-count', text),
      el('span', 'jc-job-where', `${job.cluster}${job.kernel ? ` · kernel ${job.kernel}` : ''}`)
    );
    row.append(head, bar, foot);
    if (job.failed > 0) {
      // a click shows (or hides) the failed items: index, error, worker, traceback tail
      row.classList.add('jc-job-has-failures');
      const open = this.state.failuresOpen === job.job;
      row.tabIndex = 0;
      row.setAttribute('role', 'button');
      row.setAttribute('aria-expanded', String(open));
      row.title = open ? 'Hide the failed items' : 'Show the failed items';
      const toggle = (): void => this.setState(toggleFailures(this.state, job));
      row.addEventListener('click', toggle);
      row.addEventListener('keydown', event => {
        if (event.key === 'Enter' || event.key === ' ') {
          event.preventDefault();
          toggle();
        }
      });
      if (open) {
        row.append(this.failureList(job));
      }
    }
    return row;
  }

  private failureList(job: IJob): HTMLElement {
    const { rows, more } = failureDetails(job);
    const list = el('div', 'jc-job-failures');
    for (const f of rows) {
      const item = el('div', 'jc-job-failure');
      const head = el('div', 'jc-job-failure-head');
      head.append(el('span', 'jc-job-failure-index', f.head), el('span', 'jc-job-failure-worker', f.worker));
      const error = el('div', 'jc-job-failure-error', f.error);
      error.title = f.error;
      item.append(head, error);
      if (f.traceback) {
        item.append(el('pre', 'jc-job-failure-traceback', f.traceback));
      }
      // selecting the text to copy it must not close the list
      item.addEventListener('click', event => event.stopPropagation());
      list.append(item);
    }
    if (more) {
      list.append(el('div', 'jc-job-failure-more', more));
    }
    return list;
  }

  /**
   * Earlier runs' topics the overlay can draw (the server's kept stopped
   * clusters, other than the one shown); each one's topic list is read once.
   */
  private keptCatalog(): { topic: string; scalars: string[]; cluster: string }[] {
    const out: { topic: string; scalars: string[]; cluster: string }[] = [];
    for (const h of this.state.history) {
      if (h.name === this.state.selected || h.topics.length === 0) {
        continue;
      }
      const topics = this.keptTopics.get(h.name);
      if (topics === undefined) {
        this.keptTopics.set(h.name, null);
        void requestAPI<{ topics: ITopicSummary[] }>(`clusters/${encodeURIComponent(h.name)}/metrics`)
          .then(reply => {
            this.keptTopics.set(h.name, reply.topics);
            this.renderMetrics();
          })
          .catch(error => {
            this.keptTopics.set(h.name, []); // not asked again on every push
            console.warn('jupyter-cluster:', (error as Error).message);
          });
        continue;
      }
      for (const t of topics ?? []) {
        out.push({ topic: t.topic, scalars: t.scalars, cluster: h.name });
      }
    }
    return out;
  }

  private renderMetrics(): void {
    const { topics, topic, metrics, hidden } = this.state;
    if (this.changed('topics', [topics.map(t => t.topic), topic])) {
      this.topicSelect.replaceChildren(
        ...topics.map(t => {
          const o = el('option', '', t.topic);
          o.value = t.topic;
          return o;
        })
      );
      this.topicSelect.value = topic ?? '';
      this.topicSelect.style.display = topics.length ? '' : 'none';
    }
    this.metricsEmpty.style.display = topics.length ? 'none' : '';
    this.openButton.style.display = topic && this.onOpenTopic ? '' : 'none';
    if (!topic || !metrics) {
      if (this.charts && !topic) {
        this.charts.dispose();
        this.charts = null;
        this.chartInput = { metrics: null, off: null, sources: new Map() };
      }
      this.seriesNode.replaceChildren();
      this.drawn.series = '';
      return;
    }
    const keys = seriesKeys(metrics);
    const off = hidden[topic] ?? [];
    if (this.changed('series', [topic, keys, off])) {
      this.seriesNode.replaceChildren();
      if (keys.length > 1) {
        for (const key of keys) {
          const label = el('label', 'jc-series-item');
          const box = el('input');
          box.type = 'checkbox';
          box.checked = !off.includes(key);
          box.addEventListener('change', () => this.setState(toggleSeries(this.state, topic, key)));
          label.title = key;
          label.append(box, document.createTextNode(seriesLabel(key)));
          this.seriesNode.append(label);
        }
      }
    }
    if (!this.charts) {
      this.charts = new MetricsCharts(this.chartsHost, { height: 200, dark: this.dark ?? undefined });
      // an earlier run's topics: read once, then drawn like the others
      this.charts.onOverlayKept = kept => {
        for (const { cluster, topic } of kept) {
          const key = `${cluster}\u0000${topic}`;
          const known = this.keptModels.get(key);
          if (known) {
            this.charts?.setSource(known, cluster);
            continue;
          }
          if (known === null) {
            continue; // being read
          }
          this.keptModels.set(key, null);
          void requestAPI<IMetricsModel>(`clusters/${encodeURIComponent(cluster)}/metrics/${encodeURIComponent(topic)}`)
            .then(data => {
              this.keptModels.set(key, data);
              this.charts?.setSource(data, cluster);
            })
            .catch(error => {
              this.keptModels.delete(key);
              console.warn('jupyter-cluster:', (error as Error).message);
            });
        }
      };
      // the overlay may draw from other topics of the cluster: watch them too
      this.charts.onOverlayTopics = overlayTopics => {
        const before = this.state.overlayTopics;
        this.setState(setOverlayTopics(this.state, overlayTopics));
        if (this.state.overlayTopics !== before) {
          this.sendWatch();
        }
      };
    }
    if (this.chartInput.metrics !== metrics || this.chartInput.off !== off) {
      this.chartInput = { ...this.chartInput, metrics, off };
      this.charts.update(metrics, off);
    }
    this.charts.setCatalog([...topics.map(t => ({ topic: t.topic, scalars: t.scalars })), ...this.keptCatalog()]);
    for (const model of Object.values(this.state.overlayMetrics)) {
      if (this.chartInput.sources.get(model.topic) !== model) {
        this.chartInput.sources.set(model.topic, model);
        this.charts.setSource(model);
      }
    }
  }
}
