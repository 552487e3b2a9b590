/**
 * The cluster cards and the stopped clusters kept for their history.  Cards
 * are keyed by name and updated in place (text set only where it changed);
 * their order is by start time with the pinned one first, so a cluster
 * starting or stopping elsewhere never moves the card under the pointer and
 * a click target is never replaced while it is clicked.
 */
import { el } from '../common/dom';
import { formatBytes, ownerText } from '../model';
import type { IClusterSummary, IHistoryCluster } from '../messages';
import { orderClusters, placeChildren, scrollToShow, setText } from './order';

export function button(label: string, className: string, title: string, onClick: () => void): HTMLButtonElement {
  const b = el('button', `jp-Button jc-button ${className}`, label);
  b.title = title;
  b.addEventListener('click', event => {
    event.stopPropagation();
    onClick();
  });
  return b;
}

/** What a card's buttons do (the panel's actions). */
export interface IClusterActions {
  select(name: string): void;
  scale(name: string): void;
  adapt(name: string): void;
  stop(name: string): void;
  connect(name: string): void;
  forget(key: string): void;
  readonly canConnect: boolean;
}

/** The fields a batch backend may add to a cluster's summary (shown when present). */
function batchText(c: IClusterSummary & { [k: string]: unknown }): string {
  const parts: string[] = [];
  const pending = c.pending_jobs ?? c.jobs_pending;
  if (Array.isArray(pending) && pending.length) {
    parts.push(`${pending.length} job${pending.length > 1 ? 's' : ''} pending`);
  } else if (typeof pending === 'number' && pending > 0) {
    parts.push(`${pending} job${pending > 1 ? 's' : ''} pending`);
  }
  const left = c.walltime_left ?? c.walltime_remaining;
  if (typeof left === 'number' && Number.isFinite(left)) {
    parts.push(`walltime left ${formatDuration(left)}`);
  } else if (typeof left === 'string' && left) {
    parts.push(`walltime left ${left}`);
  }
  return parts.join(' · ');
}

/** 3725 -> "1 h 02 min"; 95 -> "1 min 35 s". */
export function formatDuration(seconds: number): string {
  const s = Math.max(0, Math.round(seconds));
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  if (h > 0) {
    return `${h} h ${String(m).padStart(2, '0')} min`;
  }
  return m > 0 ? `${m} min ${String(s % 60).padStart(2, '0')} s` : `${s} s`;
}

class ClusterCard {
  readonly node = el('div', 'jc-cluster');
  private readonly name = el('span', 'jc-cluster-name');
  private readonly badges = el('span', 'jc-cluster-badges');
  private readonly status = el('span', 'jc-status');
  private readonly meta = el('div', 'jc-cluster-meta');
  private readonly stats = el('div', 'jc-cluster-stats');
  private readonly batch = el('div', 'jc-cluster-batch');
  private readonly error = el('div', 'jc-cluster-error');
  private readonly dashboard = el('a', 'jc-dashboard', 'Dashboard');

  constructor(
    readonly key: string,
    actions: IClusterActions
  ) {
    this.node.dataset.name = key;
    this.node.addEventListener('click', () => actions.select(key));
    const title = el('div', 'jc-cluster-title');
    title.append(this.name, this.badges, this.status);
    setText(this.name, key);
    this.dashboard.target = '_blank';
    this.dashboard.rel = 'noopener';
    this.dashboard.addEventListener('click', event => event.stopPropagation());
    const buttons = el('div', 'jc-cluster-actions');
    buttons.append(
      this.dashboard,
      button('Scale', 'jc-scale', `Set the number of workers of ${key}`, () => actions.scale(key)),
      button('Adapt', 'jc-adapt', `Let ${key} follow the load`, () => actions.adapt(key)),
      button('Stop', 'jc-stop', `Stop ${key}`, () => actions.stop(key))
    );
    if (actions.canConnect) {
      buttons.append(
        button('Connect', 'jc-connect', `Insert %cluster connect ${key} into the notebook`, () => actions.connect(key))
      );
    }
    this.node.append(title, this.meta, this.stats, this.batch, this.error, buttons);
  }

  update(c: IClusterSummary & { [k: string]: unknown }, selected: boolean, pinned: boolean, mine: boolean): void {
    this.node.classList.toggle('jc-selected', selected);
    this.node.classList.toggle('jc-pinned-card', pinned);
    this.node.classList.toggle('jc-mine', mine);
    const adaptive = c.adaptive as { minimum?: number; maximum?: number } | null | undefined;
    this.node.classList.toggle('jc-adaptive', !!adaptive);
    const badges: string[] = [];
    if (mine) {
      badges.push('this notebook');
    }
    if (adaptive) {
      badges.push(`adaptive ${adaptive.minimum ?? 0}–${adaptive.maximum ?? '∞'}`);
    }
    if (c.kept === true) {
      badges.push('kept');
    }
    this.node.classList.toggle('jc-kept-card', c.kept === true);
    setText(this.badges, badges.join(' · '));
    this.badges.style.display = badges.length ? '' : 'none';
    setText(this.status, c.status);
    const statusClass = `jc-status jc-status-${c.status}`;
    if (this.status.className !== statusClass) {
      this.status.className = statusClass;
    }
    setText(this.meta, `${c.backend} · ${c.address}`);
    setText(
      this.stats,
      `${c.n_workers} workers · ${c.cores} threads · ${formatBytes(c.memory_limit)} · owner: ${ownerText(c)}`
    );
    const batch = batchText(c);
    setText(this.batch, batch);
    this.batch.style.display = batch ? '' : 'none';
    const error = c.error && c.status !== 'running' ? c.error : '';
    setText(this.error, error);
    this.error.style.display = error ? '' : 'none';
    if (c.dashboard_link) {
      if (this.dashboard.getAttribute('href') !== c.dashboard_link) {
        this.dashboard.href = c.dashboard_link;
      }
      this.dashboard.style.display = '';
    } else {
      this.dashboard.style.display = 'none';
    }
  }
}

/** The live clusters, plus a card for each cluster being started from the panel. */
export class ClusterList {
  readonly node = el('div', 'jc-clusters');
  /** the selection and its place the list last showed: a new one (or a move) is scrolled into view */
  private shown = '';
  private readonly cards = new Map<string, ClusterCard>();
  private readonly starting = new Map<string, HTMLElement>();
  private readonly empty = el('div', 'jc-empty', 'No clusters. Start one with New, or %cluster start in a notebook.');

  constructor(private readonly actions: IClusterActions) {}

  /** A placeholder card while a cluster starts (the ~5 s a start takes); returns a function that removes it. */
  showStarting(label: string, detail: string): () => void {
    const id = `${label}\u0000${Date.now()}\u0000${Math.random()}`;
    const card = el('div', 'jc-cluster jc-cluster-starting');
    const title = el('div', 'jc-cluster-title');
    title.append(el('span', 'jc-cluster-name', label), el('span', 'jc-status jc-status-starting', 'starting'));
    const bar = el('div', 'jc-bar jc-progress jc-indeterminate');
    bar.append(el('div', 'jc-bar-fill'));
    card.append(title, el('div', 'jc-cluster-meta', detail), bar);
    const started = Date.now();
    const elapsed = el('div', 'jc-cluster-stats', 'starting the scheduler and workers…');
    card.append(elapsed);
    const tick = window.setInterval(() => {
      elapsed.textContent = `starting the scheduler and workers… ${Math.round((Date.now() - started) / 1000)} s`;
    }, 1000);
    this.starting.set(id, card);
    this.node.prepend(card);
    this.empty.remove();
    return () => {
      window.clearInterval(tick);
      card.remove();
      this.starting.delete(id);
    };
  }

  update(clusters: IClusterSummary[], selected: string | null, pinned: string | null, mine: string | null): void {
    const ordered = orderClusters(clusters, pinned);
    const wanted: HTMLElement[] = [...this.starting.values()];
    const names = new Set(ordered.map(c => c.name));
    for (const name of [...this.cards.keys()]) {
      if (!names.has(name)) {
        this.cards.delete(name);
      }
    }
    for (const c of ordered) {
      let card = this.cards.get(c.name);
      if (!card) {
        card = new ClusterCard(c.name, this.actions);
        this.cards.set(c.name, card);
      }
      card.update(
        c as IClusterSummary & { [k: string]: unknown },
        c.name === selected,
        c.name === pinned,
        c.name === mine
      );
      wanted.push(card.node);
    }
    if (!wanted.length) {
      wanted.push(this.empty);
    }
    placeChildren(this.node, wanted);
    this.keepInView(selected, ordered.map(c => c.name).indexOf(selected ?? ''));
  }

  /**
   * Keep the selected card in its scroller's view (the Workers section shows
   * it): when the selection changes or its card moves, not on every update,
   * so a user's own scrolling stays.
   */
  private keepInView(selected: string | null, index: number): void {
    const key = `${selected}\u0000${index}`;
    const card = selected ? this.cards.get(selected)?.node : undefined;
    const scroller = this.node.parentElement;
    if (key === this.shown || !card || !scroller || !scroller.clientHeight) {
      return;
    }
    this.shown = key;
    // the card's place in the scroller's content (wherever the offset parents are)
    const top = card.getBoundingClientRect().top - scroller.getBoundingClientRect().top + scroller.scrollTop;
    scroller.scrollTop = scrollToShow(top, card.offsetHeight, scroller.scrollTop, scroller.clientHeight);
    this.node.dataset.shownSelected = selected ?? '';
  }
}

/** Stopped clusters whose jobs and metrics the server kept (newest first: the server's order). */
export class HistoryList {
  readonly node = el('div', 'jc-history');
  private readonly title = el('div', 'jc-history-title', 'Stopped (history kept)');
  private readonly rows = new Map<string, { node: HTMLElement; meta: HTMLElement }>();

  constructor(private readonly actions: IClusterActions) {}

  update(history: IHistoryCluster[], selected: string | null): void {
    const wanted: HTMLElement[] = history.length ? [this.title] : [];
    const keys = new Set(history.map(h => h.name));
    for (const key of [...this.rows.keys()]) {
      if (!keys.has(key)) {
        this.rows.delete(key);
      }
    }
    for (const h of history) {
      let row = this.rows.get(h.name);
      if (!row) {
        row = this.row(h);
        this.rows.set(h.name, row);
      }
      row.node.classList.toggle('jc-selected', h.name === selected);
      setText(row.meta, keptText(h));
      wanted.push(row.node);
    }
    placeChildren(this.node, wanted);
  }

  private row(h: IHistoryCluster): { node: HTMLElement; meta: HTMLElement } {
    // the key ("local-1.stopped-140509") tells two kept clusters of one name apart where the card's text cannot
    const tip = `${h.name}${h.id ? ` (id ${h.id})` : ''}`;
    const node = el('div', 'jc-cluster jc-cluster-stopped');
    node.dataset.name = h.name;
    node.title = tip;
    node.addEventListener('click', () => this.actions.select(h.name));
    const when = h.stopped ? new Date(h.stopped * 1000).toLocaleTimeString() : '';
    const title = el('div', 'jc-cluster-title');
    title.append(
      el('span', 'jc-cluster-name', h.cluster),
      el('span', 'jc-status jc-status-stopped', `stopped ${when}`)
    );
    const meta = el('div', 'jc-cluster-meta');
    const actions = el('div', 'jc-cluster-actions');
    actions.append(
      button('Forget', 'jc-forget', `Delete the kept jobs and metrics of ${h.cluster}`, () =>
        this.actions.forget(h.name)
      )
    );
    node.append(title, meta, actions);
    return { node, meta };
  }
}

/**
 * What a kept (stopped) cluster's card says beside its name, so that two of
 * one name differ: the notebooks that ran on it, its backend and when it
 * started, and what was kept ("Untitled.ipynb +1 · local · 14:02–14:09 · metrics: loss").
 */
export function keptText(h: IHistoryCluster): string {
  const parts: string[] = [];
  const notebooks = Array.isArray(h.notebooks) ? h.notebooks.filter(n => typeof n === 'string' && n) : [];
  if (notebooks.length) {
    const first = notebooks[0].split('/').pop() ?? notebooks[0];
    parts.push(notebooks.length > 1 ? `${first} +${notebooks.length - 1}` : first);
  }
  if (h.backend) {
    parts.push(h.backend);
  }
  const time = (t: number): string => new Date(t * 1000).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit' });
  if (typeof h.started === 'number' && h.started > 0) {
    parts.push(
      typeof h.stopped === 'number' && h.stopped > 0
        ? `${time(h.started)}–${time(h.stopped)}`
        : `from ${time(h.started)}`
    );
  }
  parts.push(h.topics.length ? `metrics: ${h.topics.join(', ')}` : 'jobs only');
  return parts.join(' · ');
}
