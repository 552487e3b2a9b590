/**
 * The jobs list: the active notebook's jobs first, then the others grouped
 * by cluster and kernel; rows keyed by job id and updated in place, so an
 * expanded job with failures stays where it is while others arrive.
 */
import { el } from '../common/dom';
import { IPanelState, failureDetails, groupJobs, isActiveJob, jobProgress } from '../model';
import type { IJob } from '../messages';
import { button } from './clusters';
import { orderJobs, placeChildren, setAttr, setText } from './order';

class JobRow {
  readonly node = el('div', 'jc-job');
  private readonly label = el('span', 'jc-job-label');
  private readonly state = el('span', 'jc-job-state');
  private readonly bar = el('div', 'jc-bar jc-progress');
  private readonly fill = el('div', 'jc-bar-fill');
  private readonly failed = el('div', 'jc-bar-failed');
  private readonly count = el('span', 'jc-job-count');
  private readonly where = el('span', 'jc-job-where');
  private readonly context = el('div', 'jc-job-context');
  private readonly contextText = el('span', 'jc-job-context-text');
  private readonly cellLink: HTMLButtonElement | null;
  private readonly sweepLink: HTMLButtonElement | null;
  private failures: HTMLElement | null = null;
  private failuresKey = '';
  job: IJob;

  constructor(
    job: IJob,
    onToggle: (job: IJob) => void,
    onOpenCell: ((job: IJob) => void) | null,
    onOpenSweep: ((run: string) => void) | null
  ) {
    this.job = job;
    this.context.append(this.contextText);
    if (onOpenCell) {
      // a link on the context line (button() stops the click: the row's own click toggles its failures)
      this.cellLink = button('cell', 'jc-job-link jc-job-cell-link', 'Show the cell that started this job', () =>
        onOpenCell(this.job)
      );
      this.context.append(this.cellLink);
    } else {
      this.cellLink = null;
    }
    if (onOpenSweep) {
      this.sweepLink = button('table', 'jc-job-link jc-job-sweep-link', "Open this run's sweep table", () => {
        const run = sweepRun(this.job);
        if (run) {
          onOpenSweep(run);
        }
      });
      this.context.append(this.sweepLink);
    } else {
      this.sweepLink = null;
    }
    this.node.dataset.job = job.job;
    const head = el('div', 'jc-job-head');
    head.append(this.label, this.state);
    this.bar.append(this.fill, this.failed);
    const foot = el('div', 'jc-job-foot');
    foot.append(this.count, this.where);
    this.node.append(head, this.bar, foot, this.context);
    const toggle = (): void => {
      if (this.job.failed > 0) {
        onToggle(this.job);
      }
    };
    this.node.addEventListener('click', toggle);
    this.node.addEventListener('keydown', event => {
      if ((event.key === 'Enter' || event.key === ' ') && this.job.failed > 0) {
        event.preventDefault();
        toggle();
      }
    });
  }

  update(job: IJob, open: boolean): void {
    this.job = job;
    const cls = `jc-job jc-job-${job.state}${job.failed > 0 ? ' jc-job-has-failures' : ''}`;
    if (this.node.className !== cls) {
      this.node.className = cls;
    }
    setText(this.label, job.label);
    setAttr(this.label, 'title', job.label);
    setText(this.state, job.state);
    const { fraction, failedFraction, text } = jobProgress(job);
    this.bar.classList.toggle('jc-indeterminate', fraction === null);
    setAttr(this.fill, 'style', `width: ${((fraction ?? 1) * 100).toFixed(1)}%`);
    setAttr(
      this.failed,
      'style',
      failedFraction > 0 ? `width: ${(failedFraction * 100).toFixed(1)}%` : 'display: none'
    );
    setAttr(this.failed, 'title', `${job.failed} failed`);
    setText(this.count, text);
    setText(this.where, `${job.cluster}${job.kernel ? ` · kernel ${job.kernel}` : ''}`);
    // a running job's duration moves only when a message comes (no timer: an idle panel stays still)
    const context = jobContextText(job, job.updated);
    setText(this.contextText, context);
    setAttr(this.context, 'title', typeof job.notebook === 'string' ? job.notebook : '');
    if (this.cellLink) {
      this.cellLink.hidden = !jobCell(job);
    }
    if (this.sweepLink) {
      this.sweepLink.hidden = sweepRun(job) === null;
    }
    if (job.failed > 0) {
      setAttr(this.node, 'tabindex', '0');
      setAttr(this.node, 'role', 'button');
      setAttr(this.node, 'aria-expanded', String(open));
      setAttr(this.node, 'title', open ? 'Hide the failed items' : 'Show the failed items');
    }
    const key = open ? JSON.stringify([job.failed, job.failures]) : '';
    if (key !== this.failuresKey) {
      this.failuresKey = key;
      this.failures?.remove();
      this.failures = open ? failureList(job) : null;
      if (this.failures) {
        this.node.append(this.failures);
      }
    }
  }
}

/** 0.42 -> "0.4 s", 95 -> "1 min 35 s", 7300 -> "2 h 01 min". */
export function formatSeconds(seconds: number): string {
  if (!Number.isFinite(seconds) || seconds < 0) {
    return '';
  }
  if (seconds < 60) {
    return `${seconds < 10 ? seconds.toFixed(1) : Math.round(seconds)} s`;
  }
  const s = Math.round(seconds);
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  return h > 0 ? `${h} h ${String(m).padStart(2, '0')} min` : `${m} min ${String(s % 60).padStart(2, '0')} s`;
}

/**
 * Where a job came from and how long it took, from the run fields its
 * messages carry (notebook, cell, its number in the run: an ES loop's
 * generation, a named run's values): "02-sweep.ipynb · In [7] · job 3 ·
 * 4.2 s".  Older kernels send none of them: then only the duration.
 */
export function jobContextText(job: IJob, now: number = Date.now() / 1000): string {
  const parts: string[] = [];
  const notebook = typeof job.notebook === 'string' ? job.notebook : '';
  if (notebook) {
    parts.push(notebook.split('/').pop() ?? notebook);
  }
  const cell = job.cell as { execution_count?: number | null } | null | undefined;
  if (cell && typeof cell.execution_count === 'number') {
    parts.push(`In [${cell.execution_count}]`);
  }
  const context = job.context as { [key: string]: unknown } | null | undefined;
  if (context && typeof context === 'object') {
    for (const [key, value] of Object.entries(context).slice(0, 3)) {
      if (key === 'job' && value === 1) {
        continue; // the first (often only) job of its run: no news
      }
      if (['string', 'number', 'boolean'].includes(typeof value)) {
        parts.push(`${key} ${String(value)}`);
      }
    }
  }
  const end = job.state === 'running' ? now : job.updated;
  if (job.started > 0 && end >= job.started) {
    parts.push(formatSeconds(end - job.started));
  }
  return parts.join(' · ');
}

/**
 * The notebook and cell a job came from (its cell's id, else its execution
 * count), or null when its kernel sent neither (an nbclient or older kernel).
 */
export function jobCell(job: IJob): { notebook: string; cellId: string | null; count: number | null } | null {
  const notebook = typeof job.notebook === 'string' ? job.notebook : '';
  const cell = job.cell as { execution_count?: unknown; cell_id?: unknown } | null | undefined;
  if (!notebook || !cell || typeof cell !== 'object') {
    return null;
  }
  const cellId = typeof cell.cell_id === 'string' && cell.cell_id ? cell.cell_id : null;
  const count = typeof cell.execution_count === 'number' ? cell.execution_count : null;
  return cellId === null && count === null ? null : { notebook, cellId, count };
}

/**
 * The run whose sweep table a job has: a `%%parallel` sweep's (it names its
 * items: `item_count`, sent when it ends) or a named run's (its config), else null.
 */
export function sweepRun(job: IJob): string | null {
  if (typeof job.run !== 'string' || !job.run) {
    return null;
  }
  const configured = !!job.config && Object.keys(job.config).length > 0;
  return typeof job.item_count === 'number' || configured ? job.run : null;
}

function failureList(job: IJob): HTMLElement {
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

export class JobsView {
  readonly node = el('div', 'jc-jobs');
  private readonly rows = new Map<string, JobRow>();
  private readonly headers = new Map<string, HTMLElement>();
  private readonly empty = el('div', 'jc-empty', 'No maps yet: run a %%parallel cell or Pool.map.');
  private readonly more: HTMLButtonElement;
  showAll = false;

  constructor(
    private readonly onToggleFailures: (job: IJob) => void,
    private readonly onShowAll: () => void,
    private readonly onOpenCell: ((job: IJob) => void) | null = null,
    private readonly onOpenSweep: ((run: string) => void) | null = null
  ) {
    this.more = button('', 'jc-more-jobs', 'Show or hide older finished jobs', () => {
      this.showAll = !this.showAll;
      this.onShowAll();
    });
  }

  update(
    rows: IJob[],
    more: number,
    failuresOpen: string | null,
    active: Pick<IPanelState, 'activeKernel' | 'activeNotebook'>
  ): void {
    const wanted: HTMLElement[] = [];
    const ordered = orderJobs(rows, active);
    const groups = groupJobs(ordered);
    const ids = new Set(rows.map(j => j.job));
    for (const id of [...this.rows.keys()]) {
      if (!ids.has(id)) {
        this.rows.delete(id);
      }
    }
    for (const [where, jobs] of groups) {
      if (groups.size > 1) {
        let header = this.headers.get(where);
        if (!header) {
          header = el('div', 'jc-job-group', where);
          this.headers.set(where, header);
        }
        const mine = isActiveJob(jobs[0], active);
        header.classList.toggle('jc-mine', mine);
        setText(header, mine ? `${where} (this notebook)` : where);
        wanted.push(header);
      }
      for (const job of jobs) {
        let row = this.rows.get(job.job);
        if (!row) {
          row = new JobRow(job, this.onToggleFailures, this.onOpenCell, this.onOpenSweep);
          this.rows.set(job.job, row);
        }
        row.update(job, failuresOpen === job.job);
        wanted.push(row.node);
      }
    }
    if (!rows.length) {
      wanted.push(this.empty);
    }
    if (more > 0 || this.showAll) {
      setText(this.more, this.showAll ? 'Show fewer' : `${more} more finished`);
      wanted.push(this.more);
    }
    placeChildren(this.node, wanted);
  }
}
