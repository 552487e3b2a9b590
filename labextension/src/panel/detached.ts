/**
 * Work that outlives the kernel: the kept clusters (idle countdown, attached
 * kernels) and the detached jobs under them (progress, notebook and cell,
 * Cancel, "copy the code that fetches the results"), from
 * `GET jupyter-cluster/api/detached`, read every few seconds while the panel
 * is shown.  The text is made by the pure functions below (Jest-tested).
 */
import { postAPI, requestAPI } from '../api';
import { el } from '../common/dom';
import { button, formatDuration } from './clusters';

/** A detached job, as `server.detached` lists it. */
export interface IDetachedJob {
  name: string;
  cluster: string | null;
  notebook: string | null;
  cell: string | null;
  state: string;
  done: number;
  failed: number;
  total: number;
  started: number | null;
  duration: number | null;
  reason: string | null;
  fetch_code: string;
}

/** A kept cluster: owned by a host process, stopping itself once idle. */
export interface IKeptCluster {
  name: string;
  backend: string;
  idle_timeout: number;
  idle_since: number | null;
  stops_in: number | null;
  attached: { pid: number; kernel_id: string | null; since: number }[];
  jobs_running: number;
}

export interface IDetached {
  jobs: IDetachedJob[];
  kept: IKeptCluster[];
}

/** How often the view reads the list again (ms). */
export const DETACHED_POLL_MS = 3000;

/** "kept · 2 kernels attached · 1 job running" or "kept · idle, stops in 12 min 05 s". */
export function keptText(k: IKeptCluster): string {
  const parts = ['kept'];
  const n = k.attached.length;
  if (n) {
    parts.push(`${n} kernel${n > 1 ? 's' : ''} attached`);
  }
  if (k.jobs_running) {
    parts.push(`${k.jobs_running} job${k.jobs_running > 1 ? 's' : ''} running`);
  }
  if (k.stops_in !== null && k.stops_in !== undefined) {
    parts.push(`idle, stops in ${formatDuration(k.stops_in)}`);
  } else if (!n && !k.jobs_running && !k.idle_timeout) {
    parts.push('never stops by itself');
  }
  return parts.join(' · ');
}

/** "running 12/40 (1 failed) · 3 min 02 s" */
export function detachedJobText(j: IDetachedJob): string {
  const failed = j.failed ? ` (${j.failed} failed)` : '';
  const time = j.duration !== null && j.duration !== undefined ? ` · ${formatDuration(j.duration)}` : '';
  return `${j.state} ${j.done}/${j.total}${failed}${time}`;
}

/** Where a job came from: "analysis.ipynb · In[3]: %%parallel x in grid | train(x)". */
export function detachedWhere(j: IDetachedJob): string {
  return [j.notebook, j.cell].filter(x => !!x).join(' · ');
}

/** The jobs under each cluster: kept clusters first (in their order), then any other cluster named by a job. */
export function groupDetached(data: IDetached): { cluster: string; kept: IKeptCluster | null; jobs: IDetachedJob[] }[] {
  const groups = new Map<string, { cluster: string; kept: IKeptCluster | null; jobs: IDetachedJob[] }>();
  for (const k of data.kept) {
    groups.set(k.name, { cluster: k.name, kept: k, jobs: [] });
  }
  for (const j of data.jobs) {
    const key = j.cluster ?? '';
    if (!groups.has(key)) {
      groups.set(key, { cluster: key, kept: null, jobs: [] });
    }
    groups.get(key)!.jobs.push(j);
  }
  return [...groups.values()];
}

/** Whether a job can still be cancelled. */
export function cancellable(j: IDetachedJob): boolean {
  return j.state === 'running' || j.state === 'submitted';
}

/** The "Detached" section: rebuilt from each read (a handful of rows). */
export class DetachedView {
  readonly node = el('div', 'jc-detached');
  private timer: number | null = null;
  private lastText = '';

  /** Read now and every {@link DETACHED_POLL_MS} ms (idempotent). */
  start(): void {
    if (this.timer === null) {
      void this.refresh();
      this.timer = window.setInterval(() => void this.refresh(), DETACHED_POLL_MS);
    }
  }

  dispose(): void {
    if (this.timer !== null) {
      window.clearInterval(this.timer);
      this.timer = null;
    }
  }

  async refresh(): Promise<void> {
    try {
      this.render(await requestAPI<IDetached>('detached'));
    } catch (error) {
      this.node.textContent = `Detached jobs: ${(error as Error).message}`;
    }
  }

  render(data: IDetached): void {
    const text = JSON.stringify(data);
    if (text === this.lastText) {
      return;
    }
    this.lastText = text;
    this.node.replaceChildren();
    const groups = groupDetached(data);
    if (!groups.length) {
      this.node.append(
        el(
          'div',
          'jc-empty',
          'No kept clusters or detached jobs (%cluster start --keep, %%parallel ... --detach NAME).'
        )
      );
      return;
    }
    for (const g of groups) {
      const group = el('div', 'jc-detached-group');
      group.dataset.cluster = g.cluster;
      const head = el('div', 'jc-detached-cluster');
      head.append(el('span', 'jc-cluster-name', g.cluster || '(no cluster)'));
      if (g.kept) {
        head.append(el('span', 'jc-badge jc-kept', keptText(g.kept)));
      }
      group.append(head);
      for (const j of g.jobs) {
        group.append(this.row(j));
      }
      this.node.append(group);
    }
  }

  private row(j: IDetachedJob): HTMLElement {
    const row = el('div', `jc-detached-job jc-state-${j.state}`);
    row.dataset.job = j.name;
    const title = el('div', 'jc-detached-title');
    title.append(el('span', 'jc-job-name', j.name), el('span', 'jc-job-progress', detachedJobText(j)));
    const bar = el('progress', 'jc-detached-bar');
    bar.max = Math.max(1, j.total);
    bar.value = j.done + j.failed;
    row.append(title, bar);
    const where = detachedWhere(j);
    if (where) {
      row.append(el('div', 'jc-detached-where', where));
    }
    if (j.reason) {
      row.append(el('div', 'jc-detached-reason', j.reason));
    }
    const tools = el('div', 'jc-detached-tools');
    tools.append(
      button('Copy code', 'jc-copy-fetch', 'Copy the code that fetches the results in a notebook', () => {
        void navigator.clipboard?.writeText(j.fetch_code);
      })
    );
    if (cancellable(j)) {
      tools.append(
        button('Cancel', 'jc-cancel-detached', 'Cancel this detached job (finished results stay)', () => {
          void postAPI(`detached/${encodeURIComponent(j.name)}/cancel`, {}).then(() => this.refresh());
        })
      );
    }
    row.append(tools);
    return row;
  }
}
