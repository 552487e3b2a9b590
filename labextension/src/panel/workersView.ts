/**
 * The selected cluster's workers: a summary first (workers, threads, tasks,
 * CPU and memory distribution, hosts), then a collapsible list sorted by any
 * column (numbers as numbers) and virtualised: whatever the cluster's size,
 * the DOM holds the rows in view plus a few, reused as the list scrolls.
 * Nothing is written to the DOM unless a value shown changed.
 */
import { el } from '../common/dom';
import { formatBytes, memoryFraction } from '../model';
import type { IClusterModel, IWorker } from '../messages';
import { setAttr, setText } from './order';
import { IWorkerSort, WorkerColumn, nextSort, sortWorkers, summarize, tasksText, visibleRange } from './workers';

/** px per row (CSS .jc-worker has the same height) */
export const ROW_HEIGHT = 22;
/** rows in view before the list scrolls */
const VIEW_ROWS = 10;
/** the memory bar's least width beside its text, and the gap between them (base.css) */
const MEMORY_BAR_MIN = 24 + 3;
/** the grid's column gap and the row's padding, left and right (base.css) */
const COLUMN_GAP = 4;
const ROW_PADDING = 6;
/** hosts listed in the summary */
const HOSTS_SHOWN = 6;

/** The fields a batch backend (SLURM, PBS, …) may add to a worker row: [field, column label]. */
const BATCH_FIELDS: [string, string][] = [
  ['job_id', 'job'],
  ['node', 'node'],
  ['walltime_left', 'left']
];

/** A batch cluster's facts (the server's `batch` field: SLURM's squeue, read by the cluster's owner). */
interface IBatchFacts {
  system?: string;
  running?: number;
  pending?: number;
  pending_jobs?: { job_id: string; reason: string }[];
  walltime_left?: string | null;
}

/** "slurm: 4 jobs running, 2 pending (job 17: Resources; job 18: Priority) · walltime left 1:23:45", or "". */
export function batchText(batch: IBatchFacts | null | undefined): string {
  if (!batch || typeof batch !== 'object') {
    return '';
  }
  const parts = [`${batch.system || 'batch'}: ${batch.running ?? 0} jobs running`];
  const pending = Array.isArray(batch.pending_jobs) ? batch.pending_jobs : [];
  if (pending.length || batch.pending) {
    const shown = pending.slice(0, 4).map(j => `job ${j.job_id}: ${j.reason || 'no reason given'}`);
    if (pending.length > 4) {
      shown.push(`${pending.length - 4} more`);
    }
    parts.push(`${batch.pending ?? pending.length} pending${shown.length ? ` (${shown.join('; ')})` : ''}`);
  }
  const text = parts.join(', ');
  return batch.walltime_left ? `${text} · walltime left ${batch.walltime_left}` : text;
}

const COLUMNS: [WorkerColumn, string, string][] = [
  ['name', 'name', 'worker name'],
  ['status', 'status', 'worker status'],
  ['threads', 'thr', 'threads'],
  ['cpu', 'CPU', 'CPU use'],
  ['memory', 'memory', 'memory used (bar: of its limit)'],
  ['tasks', 'tasks', 'tasks running ("idle": only leases waiting for a map)']
];

class WorkerRow {
  readonly node = el('div', 'jc-worker');
  private readonly cells: { [k: string]: HTMLElement } = {};
  private readonly fill = el('div', 'jc-bar-fill');
  private readonly memText = el('span', 'jc-bar-text');
  private readonly batch: HTMLElement[] = [];

  constructor(batchColumns: number) {
    this.node.setAttribute('role', 'row');
    for (const [key, cls] of [
      ['name', 'jc-worker-name'],
      ['status', 'jc-worker-status'],
      ['threads', 'jc-threads'],
      ['cpu', 'jc-cpu']
    ]) {
      this.cells[key] = el('span', cls);
      this.node.append(this.cells[key]);
    }
    const mem = el('span', 'jc-memory');
    const bar = el('div', 'jc-bar');
    bar.append(this.fill);
    mem.append(bar, this.memText);
    this.cells.memory = mem;
    this.cells.tasks = el('span', 'jc-tasks');
    this.node.append(mem, this.cells.tasks);
    for (let i = 0; i < batchColumns; i++) {
      const cell = el('span', 'jc-worker-batch');
      this.batch.push(cell);
      this.node.append(cell);
    }
  }

  show(w: IWorker, top: number, batchFields: string[]): void {
    setAttr(this.node, 'style', `top: ${top}px`);
    setAttr(this.node, 'data-address', w.address);
    const extra = batchFields.map(f => (w[f] === undefined || w[f] === null ? '' : `, ${f} ${String(w[f])}`)).join('');
    setAttr(this.node, 'title', `${w.address}, ${w.nthreads} threads${extra}`);
    setText(this.cells.name, w.name);
    setText(this.cells.status, w.status);
    const statusClass = `jc-worker-status jc-status-${w.status}`;
    if (this.cells.status.className !== statusClass) {
      this.cells.status.className = statusClass;
    }
    setText(this.cells.threads, String(w.nthreads));
    setText(this.cells.cpu, `${Math.round(w.cpu)}%`);
    const f = memoryFraction(w);
    setAttr(this.fill, 'style', `width: ${(f * 100).toFixed(0)}%`);
    this.fill.classList.toggle('jc-bar-high', f > 0.85);
    setText(this.memText, formatBytes(w.memory));
    setAttr(this.cells.memory, 'title', `${formatBytes(w.memory)} / ${formatBytes(w.memory_limit)}`);
    const tasks = tasksText(w);
    setText(this.cells.tasks, tasks);
    this.cells.tasks.classList.toggle('jc-idle', tasks === 'idle');
    setAttr(
      this.cells.tasks,
      'title',
      w.leases ? `${w.executing} running; ${w.leases} lease task(s), ${w.idle_leases ?? 0} waiting for a map` : ''
    );
    batchFields.forEach((f, i) => setText(this.batch[i], w[f] === undefined || w[f] === null ? '' : String(w[f])));
  }
}

export class WorkersView {
  readonly node = el('div', 'jc-workers-section');
  private readonly message = el('div', 'jc-empty');
  private readonly summaryNode = el('div', 'jc-workers-summary');
  private readonly line1 = el('div', 'jc-summary-line jc-summary-totals');
  private readonly line2 = el('div', 'jc-summary-line jc-summary-cpu');
  private readonly histogram = el('div', 'jc-memory-histogram');
  private readonly bars: HTMLElement[] = [];
  private readonly memRow = el('div', 'jc-summary-line jc-summary-memory');
  private readonly batchNode = el('div', 'jc-summary-line jc-summary-batch');
  private readonly hostsNode = el('div', 'jc-hosts');
  private readonly toggle = el('button', 'jp-Button jc-button jc-workers-toggle');
  private readonly listNode = el('div', 'jc-worker-list');
  private readonly header = el('div', 'jc-worker-header');
  private readonly viewport = el('div', 'jc-worker-viewport');
  private readonly canvas = el('div', 'jc-worker-canvas');
  private rows: WorkerRow[] = [];
  private sorted: IWorker[] = [];
  private workers: IWorker[] | null = null;
  private sort: IWorkerSort = { column: 'name', descending: false };
  private open = true;
  private batchFields: string[] = [];
  private frame = 0;
  private fitFrame = 0;
  private columns = '';

  constructor() {
    for (let i = 0; i < 10; i++) {
      const bar = el('div', 'jc-histogram-bar');
      bar.title = `memory ${i * 10}–${i * 10 + 10} % of the limit`;
      this.bars.push(bar);
      this.histogram.append(bar);
    }
    this.memRow.append(el('span', 'jc-summary-label', 'memory use'), this.histogram);
    this.summaryNode.append(this.batchNode, this.line1, this.line2, this.memRow, this.hostsNode);
    this.toggle.addEventListener('click', () => {
      this.open = !this.open;
      this.drawList();
    });
    this.viewport.append(this.canvas);
    this.viewport.addEventListener('scroll', () => {
      // draw the newly visible rows on the next frame (one layout read per frame)
      if (!this.frame) {
        this.frame = requestAnimationFrame(() => {
          this.frame = 0;
          this.drawRows();
        });
      }
    });
    this.listNode.append(this.header, this.viewport);
    this.node.append(this.message, this.summaryNode, this.toggle, this.listNode);
    this.drawHeader();
  }

  /** Rows in the DOM now (bounded, whatever the number of workers). */
  get rowCount(): number {
    return this.rows.length;
  }

  /** No cluster details: say why. */
  showMessage(text: string): void {
    this.workers = null;
    setText(this.message, text);
    this.message.style.display = '';
    this.summaryNode.style.display = 'none';
    this.toggle.style.display = 'none';
    this.listNode.style.display = 'none';
  }

  /** The cluster's model (call only when it changed). */
  update(detail: IClusterModel): void {
    this.workers = detail.workers;
    const fields = BATCH_FIELDS.map(([f]) => f).filter(f => detail.workers.some(w => w[f] !== undefined));
    if (fields.join() !== this.batchFields.join()) {
      this.batchFields = fields;
      this.rows.forEach(r => r.node.remove());
      this.rows = [];
      this.drawHeader();
    }
    this.sorted = sortWorkers(detail.workers, this.sort);
    const empty = detail.workers.length === 0;
    const batched = !!(detail as { batch?: unknown }).batch;
    setText(this.message, empty ? 'No workers yet.' : '');
    this.message.style.display = empty ? '' : 'none';
    this.summaryNode.style.display = empty && !batched ? 'none' : '';
    this.toggle.style.display = empty ? 'none' : '';
    this.drawSummary();
    const batch = batchText((detail as { batch?: IBatchFacts }).batch);
    setText(this.batchNode, batch);
    this.batchNode.style.display = batch ? '' : 'none';
    this.drawList();
  }

  private drawHeader(): void {
    const columns: [string, string, string][] = [
      ...COLUMNS,
      ...BATCH_FIELDS.filter(([f]) => this.batchFields.includes(f)).map(
        ([f, label]) => [f, label, `the batch system's ${label}`] as [string, string, string]
      )
    ];
    this.header.replaceChildren(
      ...columns.map(([column, label, title]) => {
        const sortable = COLUMNS.some(([c]) => c === column);
        const h = el('span', `jc-worker-col jc-col-${column}`);
        const active = this.sort.column === column;
        h.textContent = active ? `${label} ${this.sort.descending ? '▼' : '▲'}` : label;
        h.title = sortable ? `${title}; click to sort` : title;
        if (sortable) {
          h.classList.add('jc-sortable');
          h.setAttribute('role', 'button');
          h.addEventListener('click', () => {
            this.sort = nextSort(this.sort, column as WorkerColumn);
            this.drawHeader();
            if (this.workers) {
              this.sorted = sortWorkers(this.workers, this.sort);
              this.drawRows();
            }
          });
        }
        return h;
      })
    );
    this.header.classList.toggle('jc-with-batch', this.batchFields.length > 0);
    this.canvas.classList.toggle('jc-with-batch', this.batchFields.length > 0);
  }

  private drawSummary(): void {
    const s = summarize(this.workers ?? []);
    const statuses = Object.entries(s.statuses)
      .filter(([k]) => k !== 'running')
      .map(([k, n]) => `${n} ${k}`);
    setText(
      this.line1,
      `${s.workers} workers · ${s.threads} threads · ${s.tasks} tasks running` +
        (s.idleLeases ? ` · ${s.idleLeases} idle leases` : '') +
        (statuses.length ? ` · ${statuses.join(', ')}` : '')
    );
    setText(
      this.line2,
      `CPU min ${Math.round(s.cpu.min)}% · median ${Math.round(s.cpu.median)}% · p90 ${Math.round(s.cpu.p90)}% · ` +
        `max ${Math.round(s.cpu.max)}% · memory ${formatBytes(s.memory)} / ${formatBytes(s.memory_limit)}`
    );
    this.memRow.style.display = s.memory_limit > 0 ? '' : 'none';
    const most = Math.max(1, ...s.memoryHistogram);
    s.memoryHistogram.forEach((n, i) => {
      setAttr(this.bars[i], 'style', `height: ${n ? Math.max(2, Math.round((16 * n) / most)) : 0}px`);
      setAttr(this.bars[i], 'title', `${n} worker(s) use ${i * 10}–${i * 10 + 10} % of their memory limit`);
    });
    const hosts = s.hosts
      .slice(0, HOSTS_SHOWN)
      .map(
        h =>
          `${h.host}: ${h.workers} workers, ${h.threads} threads, ` +
          `${formatBytes(h.memory)} / ${formatBytes(h.memory_limit)}, CPU ${Math.round(h.cpu / Math.max(1, h.workers))}%`
      );
    if (s.hosts.length > HOSTS_SHOWN) {
      hosts.push(`… ${s.hosts.length - HOSTS_SHOWN} more hosts`);
    }
    const text = s.hosts.length > 1 ? hosts.join('\n') : s.hosts.length === 1 ? `host ${hosts[0]}` : '';
    setText(this.hostsNode, text);
  }

  private drawList(): void {
    const n = this.workers?.length ?? 0;
    setText(this.toggle, this.open ? `Hide the ${n} workers` : `Show the ${n} workers`);
    this.toggle.setAttribute('aria-expanded', String(this.open));
    this.listNode.style.display = this.open && n ? '' : 'none';
    if (!this.open) {
      return;
    }
    setAttr(this.viewport, 'style', `height: ${Math.min(n, VIEW_ROWS) * ROW_HEIGHT}px`);
    setAttr(this.canvas, 'style', `height: ${n * ROW_HEIGHT}px`);
    this.drawRows();
  }

  private drawRows(): void {
    if (!this.open || !this.workers) {
      return;
    }
    const n = this.sorted.length;
    // the viewport's height is fixed by CSS; its scroll position is the only layout read
    const { start, end } = visibleRange(this.viewport.scrollTop, VIEW_ROWS * ROW_HEIGHT, ROW_HEIGHT, n, 4);
    const needed = end - start;
    while (this.rows.length < needed) {
      const row = new WorkerRow(this.batchFields.length);
      this.rows.push(row);
      this.canvas.append(row.node);
    }
    while (this.rows.length > needed) {
      this.rows.pop()!.node.remove();
    }
    // a worker keeps its row while it stays in view (fewer writes when the order holds)
    for (let i = start; i < end; i++) {
      this.rows[i - start].show(this.sorted[i], i * ROW_HEIGHT, this.batchFields);
    }
    if (!this.fitFrame) {
      this.fitFrame = requestAnimationFrame(() => {
        this.fitFrame = 0;
        this.fitColumns();
      });
    }
  }

  /**
   * Each column as wide as its widest text in the header and the drawn rows
   * (the memory column at least that, taking what is left); the list scrolls
   * sideways when the sidebar is narrower.  One layout read per frame, one
   * write when the widths changed.
   */
  private fitColumns(): void {
    if (!this.open || !this.workers || !this.listNode.isConnected) {
      return;
    }
    const widths: number[] = [];
    const range = document.createRange();
    for (const line of [this.header, ...this.rows.map(r => r.node)]) {
      Array.from(line.children).forEach((cell, i) => {
        const memory = cell.classList.contains('jc-memory');
        const text = memory ? cell.querySelector('.jc-bar-text') : cell;
        if (!text) {
          return;
        }
        range.selectNodeContents(text);
        const w = Math.ceil(range.getBoundingClientRect().width) + 1 + (memory ? MEMORY_BAR_MIN : 0);
        widths[i] = Math.max(widths[i] ?? 0, w);
      });
    }
    if (!widths.length || widths.every(w => w <= 1)) {
      return; // not laid out (a folded section, a hidden panel): measured when drawn again
    }
    const memory = COLUMNS.findIndex(([c]) => c === 'memory');
    const template = widths.map((w, i) => (i === memory ? `minmax(${w}px, 1fr)` : `${w}px`)).join(' ');
    if (template === this.columns) {
      return;
    }
    this.columns = template;
    const total = widths.reduce((a, b) => a + b, 0) + COLUMN_GAP * (widths.length - 1) + ROW_PADDING;
    this.listNode.style.setProperty('--jc-worker-columns', template);
    this.listNode.style.setProperty('--jc-worker-width', `${total}px`);
  }
}
