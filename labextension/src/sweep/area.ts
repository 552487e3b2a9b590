/**
 * The sweep table of one run in JupyterLab's main area (a dockable tab, like
 * a metrics topic's view): the run's rows from `GET runs/RUN`, the curves
 * from its cluster's metrics topics, drawn by the same SweepView as the
 * notebook widget.  Read again every few seconds while the run is running, and
 * when the server's events socket says the run was added or finished (a
 * `{"type": "run", "event": "added" | "finished", "run": {...}}` message), so a
 * view opened before the server heard of its run does not poll for it.
 *
 * `registerSweep()` adds the command that opens it
 * (`jupyter-cluster:open-sweep`, args `{run}`; without a run it asks which,
 * newest first) and its palette entry; index.ts calls it once.
 */
import type { JupyterFrontEnd } from '@jupyterlab/application';
import { ICommandPalette, InputDialog, MainAreaWidget } from '@jupyterlab/apputils';
import type { LabIcon } from '@jupyterlab/ui-components';
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { requestAPI } from '../api';
import type { IMetricsModel } from '../charts/data';
import type { IRunRecord } from '../messages';
import type { IEventsFeed } from '../panel/events';
import type { ITableRow, ItemCurves } from './model';
import { rowsComplete, sweepFromTable } from './model';
import { SweepView } from './view';

export const OPEN_SWEEP = 'jupyter-cluster:open-sweep';

/** Seconds between reads while the run is running. */
const POLL_SECONDS = 3;
/** Reads in a row that may find no run or no rows before the view stops asking (about a minute), while
 *  the events socket is closed: while it is open, the server's "run" message says when to read again. */
const MAX_MISSES = 20;

interface IRunDetail {
  run: IRunRecord;
  rows: ITableRow[];
}

/** How a run is offered in the picker: its name (or id), notebook and start time. */
export function runLabel(r: IRunRecord): string {
  const when = r.started ? new Date(r.started * 1000).toLocaleTimeString() : '';
  const where = r.notebook ? ` · ${r.notebook}` : '';
  return `${r.name || r.run}${where}${when ? ` · ${when}` : ''} [${r.run}]`;
}

export class SweepArea extends Widget {
  private readonly view: SweepView;
  private readonly topicModels = new Map<string, { version?: number; model: IMetricsModel }>();
  private timer = 0;
  private misses = 0;
  private loading = false;
  private again = false;
  private stopListening: (() => void) | null = null;

  /**
   * @param run the run's id
   * @param feed the events connection it listens on (the sidebar's: each tab opening its own socket would
   *   have the server push its whole cluster and job lists once more per tab)
   * @param dark the theme at opening
   */
  constructor(
    readonly run: string,
    private readonly feed: IEventsFeed,
    dark?: boolean
  ) {
    super();
    this.addClass('jc-sweep-area');
    this.id = `jupyter-cluster-sweep-${run}`.replace(/[^A-Za-z0-9_-]/g, '_');
    this.title.label = `Sweep ${run}`;
    this.title.closable = true;
    this.node.style.overflow = 'auto';
    this.node.style.padding = '8px';
    this.view = new SweepView(this.node, { dark, height: 320 });
  }

  setDark(dark: boolean): void {
    this.view.setDark(dark);
  }

  /** Read the run's rows and curves now; again in a few seconds while it runs. */
  async load(): Promise<void> {
    if (this.isDisposed) {
      return;
    }
    if (this.loading) {
      this.again = true; // an event during a read: read once more after it
      return;
    }
    this.loading = true;
    let running = false;
    // A view opened right after its run's cell may ask before the server has heard of the run (its
    // job messages reach the server through the scheduler): a miss is read again, a bounded number of times.
    let missed = true;
    // rows listed, some of their reports not yet at the server: read again (bounded like a miss)
    let partial = false;
    try {
      const detail = await requestAPI<IRunDetail>(`runs/${encodeURIComponent(this.run)}`);
      // the tab may close during any read: a disposed view is not drawn into
      if (this.isDisposed) {
        return;
      }
      const rec = detail.run;
      running = rec.state === 'running';
      this.title.label = `Sweep: ${rec.name || rec.run}`;
      // each item's own curves; the cluster's topics only for rows that have none (older servers)
      const { curves } = await requestAPI<{ curves: ItemCurves[string] }>(
        `runs/${encodeURIComponent(this.run)}/curves`
      ).catch(() => ({ curves: {} as ItemCurves[string] }));
      if (this.isDisposed) {
        return;
      }
      // the cluster's topics: the series of rows without curves of their own, and each row's colour
      // (its series' in the topic's charts); a topic is read again only when its version changed
      const cluster = rec.history || rec.cluster;
      const models: IMetricsModel[] = [];
      if (cluster) {
        const wanted = new Set(detail.rows.flatMap(r => Object.keys(r.final ?? {})));
        const { topics } = await requestAPI<{ topics: { topic: string; scalars: string[]; version?: number }[] }>(
          `clusters/${encodeURIComponent(cluster)}/metrics`
        );
        if (this.isDisposed) {
          return;
        }
        for (const t of topics.filter(t => t.scalars.some(s => wanted.has(s)))) {
          const id = `${cluster}\u0000${t.topic}`;
          const kept = this.topicModels.get(id);
          const model =
            kept && kept.version === t.version && t.version !== undefined
              ? kept.model
              : await requestAPI<IMetricsModel>(
                  `clusters/${encodeURIComponent(cluster)}/metrics/${encodeURIComponent(t.topic)}`
                );
          if (this.isDisposed) {
            return;
          }
          this.topicModels.set(id, { version: t.version, model });
          models.push(model);
        }
      }
      this.view.update(sweepFromTable(detail.rows, models, rec.name || rec.run, { [rec.run]: curves }));
      missed = detail.rows.length === 0;
      partial = !missed && !rowsComplete(detail.rows, curves ?? {});
    } catch (error) {
      console.warn('jupyter-cluster:', (error as Error).message);
    } finally {
      this.loading = false;
    }
    window.clearTimeout(this.timer);
    this.misses = missed || partial ? this.misses + 1 : 0;
    if (this.again && !this.isDisposed) {
      this.again = false;
      void this.load();
      return;
    }
    const waitForEvent = missed && this.feed.isOpen;
    // (a partial table is read again even while the socket is open: no event says a report arrived)
    const retry = (missed && !waitForEvent) || partial;
    if ((running || (retry && this.misses < MAX_MISSES)) && !this.isDisposed) {
      this.timer = window.setTimeout(() => void this.load(), POLL_SECONDS * 1000);
    }
  }

  protected onAfterAttach(msg: Message): void {
    super.onAfterAttach(msg);
    this.stopListening ??= this.feed.listen({
      onMessage: m => {
        if (m.type === 'run' && m.run?.run === this.run) {
          void this.load();
        }
      },
      // (re)connected: what the socket did not see meanwhile is read once
      onStatus: error => {
        if (error === null && this.isAttached) {
          void this.load();
        }
      }
    });
    void this.load();
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    window.clearTimeout(this.timer);
    this.stopListening?.();
    this.stopListening = null;
    this.view.dispose();
    super.dispose();
  }
}

/**
 * Register the command that opens a run's sweep table in the main area; the
 * tables listen on `feed` (the sidebar's events connection).  Returns a function that re-styles the open tables for a theme.
 */
export function registerSweep(
  app: JupyterFrontEnd,
  palette: ICommandPalette | null,
  feed: IEventsFeed,
  dark: () => boolean | undefined,
  icon?: LabIcon
): (dark: boolean) => void {
  const open = new Set<SweepArea>();
  app.commands.addCommand(OPEN_SWEEP, {
    label: args => (args.run ? `Open the Sweep Table of Run ${String(args.run)}` : 'Open a Sweep Table…'),
    execute: async args => {
      let run = typeof args.run === 'string' ? args.run : '';
      if (!run) {
        const { runs } = await requestAPI<{ runs: IRunRecord[] }>('runs');
        if (!runs.length) {
          console.warn('jupyter-cluster: no runs yet; a %%parallel sweep, a map or jc.run() makes one');
          return;
        }
        const labels = runs.map(runLabel);
        const picked = await InputDialog.getItem({ title: 'Sweep table of run', items: labels });
        if (!picked.button.accept || picked.value === null) {
          return;
        }
        run = runs[labels.indexOf(picked.value)]?.run ?? '';
      }
      if (!run) {
        return;
      }
      const existing = [...open].find(a => a.run === run);
      if (existing) {
        app.shell.activateById(existing.parent?.id ?? existing.id);
        return;
      }
      const content = new SweepArea(run, feed, dark());
      const widget = new MainAreaWidget({ content });
      widget.id = `${content.id}-area`;
      widget.title.label = content.title.label;
      content.title.changed.connect(() => (widget.title.label = content.title.label));
      if (icon) {
        widget.title.icon = icon;
      }
      open.add(content);
      content.disposed.connect(() => open.delete(content));
      app.shell.add(widget, 'main', { mode: 'split-right' });
      app.shell.activateById(widget.id);
    }
  });
  palette?.addItem({ command: OPEN_SWEEP, category: 'Dask Clusters' });
  return (isDark: boolean) => open.forEach(a => a.setDark(isDark));
}
