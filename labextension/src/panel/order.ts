/**
 * Orders that keep the panel still (pure, Jest-tested): cards by start time
 * with the pinned one first, jobs with the active notebook's first.  Neither
 * depends on when a push arrived, so nothing moves under the pointer unless
 * a card or job is added or removed.
 */
import { isActiveJob } from '../model';
import type { IPanelState } from '../model';
import type { IClusterSummary, IJob } from '../messages';

/** Live clusters oldest first (ties by name), the pinned one (if any) at the top. */
export function orderClusters(clusters: IClusterSummary[], pinned: string | null): IClusterSummary[] {
  return [...clusters].sort((a, b) => {
    if ((a.name === pinned) !== (b.name === pinned)) {
      return a.name === pinned ? -1 : 1;
    }
    return a.started - b.started || a.name.localeCompare(b.name);
  });
}

/**
 * Jobs with the active notebook's first (by its path, else its kernel: see
 * `isActiveJob`); each part keeps the order it had (running newest first,
 * then finished newest first).
 */
export function orderJobs(jobs: IJob[], active: Pick<IPanelState, 'activeKernel' | 'activeNotebook'>): IJob[] {
  if (!active.activeKernel && !active.activeNotebook) {
    return jobs;
  }
  const mine = jobs.filter(j => isActiveJob(j, active));
  return mine.length ? [...mine, ...jobs.filter(j => !isActiveJob(j, active))] : jobs;
}

/**
 * Reorder `parent`'s children to `wanted` with as few moves as there are
 * misplaced nodes (a node already in place is not touched, so a pointer on
 * it keeps its target), and remove children not wanted.
 */
export function placeChildren(parent: HTMLElement, wanted: HTMLElement[]): void {
  const keep = new Set(wanted);
  for (const child of [...parent.children]) {
    if (!keep.has(child as HTMLElement)) {
      child.remove();
    }
  }
  wanted.forEach((node, i) => {
    if (parent.children[i] !== node) {
      parent.insertBefore(node, parent.children[i] ?? null);
    }
  });
}

/** Set a node's text only when it differs (a write that changes nothing still costs a mutation). */
export function setText(node: HTMLElement, text: string): void {
  if (node.textContent !== text) {
    node.textContent = text;
  }
}

/** Set an attribute only when it differs. */
export function setAttr(node: HTMLElement, name: string, value: string): void {
  if (node.getAttribute(name) !== value) {
    node.setAttribute(name, value);
  }
}

/** Which jobs the list shows: every notebook's, the active notebook's, or the shown cluster's. */
export type JobsScope = 'all' | 'notebook' | 'cluster';

/**
 * The job rows to draw for a scope: running ones, then at most `limit`
 * finished ones not cleared, the active notebook's first in each part (so
 * other notebooks' newer jobs never push its own out of the list); `more`
 * counts the finished ones left out.
 */
export function scopedJobs(
  state: Pick<IPanelState, 'jobs' | 'clearedBefore' | 'activeKernel' | 'activeNotebook' | 'selected' | 'history'>,
  scope: JobsScope,
  limit: number
): { rows: IJob[]; more: number } {
  const kept = state.history.find(h => h.name === state.selected);
  const cluster = kept ? kept.cluster : state.selected;
  const wanted = (j: IJob): boolean =>
    scope === 'notebook' ? isActiveJob(j, state) : scope === 'cluster' ? j.cluster === cluster : true;
  const running = orderJobs(state.jobs.running.filter(wanted), state);
  const finished = orderJobs(
    state.jobs.recent.filter(j => j.updated > state.clearedBefore && wanted(j)),
    state
  );
  return { rows: [...running, ...finished.slice(0, limit)], more: Math.max(0, finished.length - limit) };
}

/**
 * The scroll position that shows an item (`top` and `height` within the
 * scroller's content) in a view `viewHeight` tall now at `scrollTop`: the
 * same when it is in view already, else the least scroll that shows it (its
 * top when it is taller than the view).
 */
export function scrollToShow(top: number, height: number, scrollTop: number, viewHeight: number): number {
  if (top < scrollTop || height >= viewHeight) {
    return top;
  }
  if (top + height > scrollTop + viewHeight) {
    return top + height - viewHeight;
  }
  return scrollTop;
}
