/**
 * What the panel reads over REST (never from a render): a stopped cluster's
 * topics and metrics, and the topics and models of earlier runs the overlay
 * draws.  Results are cached by cluster and topic and handed to the panel as
 * server messages; `sync` is called after every state change and fills in
 * whatever the state lacks that the cache has, so a reply that arrived while
 * the user looked elsewhere is shown when they come back, not lost.
 */
import { requestAPI } from '../api';
import type { IMetricsModel } from '../charts/charts';
import { IPanelState, isStopped } from '../model';
import type { ITopicSummary, ServerMessage } from '../messages';

type Entry<T> = { value: T } | 'loading' | 'failed';

export class Loader {
  private readonly topics = new Map<string, Entry<ITopicSummary[]>>();
  private readonly models = new Map<string, Entry<IMetricsModel>>();

  /**
   * @param dispatch - apply a message to the panel's state (as if the server had pushed it)
   * @param changed - something the panel shows outside its state arrived (an earlier run's topics or model)
   */
  constructor(
    private readonly dispatch: (msg: ServerMessage) => void,
    private readonly changed: () => void
  ) {}

  /** Fill in what the state of a stopped cluster lacks: its topics, the shown topic's points, the overlay's. */
  sync(state: IPanelState): void {
    const { selected, topic, topics, metrics } = state;
    if (!selected || !isStopped(state, selected)) {
      return;
    }
    if (topics.length === 0) {
      const known = this.topicsOf(selected);
      // none kept (or the read failed): the state already says so, and sending it again would
      // come straight back here (each dispatch syncs again): an endless recursion
      if (known && known.length > 0) {
        this.dispatch({ type: 'topics', cluster: selected, topics: known });
      }
      return;
    }
    if (topic && !metrics) {
      const model = this.model(selected, topic);
      if (model) {
        this.dispatch({ type: 'metrics', cluster: selected, topic, data: model });
      }
    }
    for (const other of state.overlayTopics) {
      if (!state.overlayMetrics[other]) {
        const model = this.model(selected, other);
        if (model) {
          this.dispatch({ type: 'metrics', cluster: selected, topic: other, data: model });
        }
      }
    }
  }

  /** A kept cluster's topics if read (null meanwhile: asked for once, `changed` is called when they come). */
  topicsOf(cluster: string): ITopicSummary[] | null {
    const entry = this.topics.get(cluster);
    if (entry === undefined) {
      this.topics.set(cluster, 'loading');
      void requestAPI<{ topics: ITopicSummary[] }>(`clusters/${encodeURIComponent(cluster)}/metrics`)
        .then(reply => {
          this.topics.set(cluster, { value: reply.topics });
          this.arrived();
        })
        .catch(error => {
          this.topics.set(cluster, 'failed'); // not asked again on every push
          console.warn('jupyter-cluster:', (error as Error).message);
        });
      return null;
    }
    return typeof entry === 'object' ? entry.value : entry === 'failed' ? [] : null;
  }

  /** A kept cluster's topic model if read (null meanwhile; a failed read is tried again next time). */
  model(cluster: string, topic: string): IMetricsModel | null {
    const key = `${cluster}\u0000${topic}`;
    const entry = this.models.get(key);
    if (entry === undefined || entry === 'failed') {
      this.models.set(key, 'loading');
      void requestAPI<IMetricsModel>(`clusters/${encodeURIComponent(cluster)}/metrics/${encodeURIComponent(topic)}`)
        .then(data => {
          this.models.set(key, { value: data });
          this.arrived();
        })
        .catch(error => {
          this.models.set(key, 'failed');
          console.warn('jupyter-cluster:', (error as Error).message);
        });
      return null;
    }
    return typeof entry === 'object' ? entry.value : null;
  }

  /** Forget a cluster's kept data (its history was deleted). */
  forget(cluster: string): void {
    this.topics.delete(cluster);
    for (const key of [...this.models.keys()]) {
      if (key.startsWith(`${cluster}\u0000`)) {
        this.models.delete(key);
      }
    }
  }

  private pending = 0;

  private arrived(): void {
    // several replies at once cause one update
    if (!this.pending) {
      this.pending = window.setTimeout(() => {
        this.pending = 0;
        this.changed();
      }, 0);
    }
  }
}
