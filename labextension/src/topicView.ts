/**
 * One metrics topic in the main area (a dockable tab, as dask-labextension
 * does for its plots): the same charts as the sidebar with room to read
 * them.  It watches its own cluster and topic on an events connection of
 * its own (the same EventsClient as the sidebar's, with its back-off), so
 * the sidebar can show something else; a stopped cluster's kept history is
 * read once over REST.
 */
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { requestAPI } from './api';
import { IMetricsModel, MetricsCharts } from './charts/charts';
import type { ServerMessage } from './messages';
import { EventsClient } from './panel/events';

export class TopicView extends Widget {
  private readonly charts: MetricsCharts;
  private readonly events = new EventsClient({ onMessage: msg => this.onMessage(msg) });

  constructor(
    readonly cluster: string,
    readonly topic: string,
    dark?: boolean
  ) {
    super();
    this.addClass('jc-topic-view');
    this.id = `jupyter-cluster-topic-${cluster}-${topic}`.replace(/[^A-Za-z0-9_-]/g, '_');
    this.title.label = `${topic} (${cluster})`;
    this.title.closable = true;
    this.node.style.overflow = 'auto';
    this.node.style.padding = '8px';
    this.charts = new MetricsCharts(this.node, { height: 320, dark });
    // the overlay may draw from the cluster's other topics: watch them on this view's socket too
    this.charts.onOverlayTopics = topics => {
      this.overlayTopics = topics;
      this.watch();
    };
  }

  private overlayTopics: string[] = [];

  /** Re-style the charts for a dark or light theme. */
  setDark(dark: boolean): void {
    this.charts.setDark(dark);
  }

  /** Read a stopped cluster's history over REST (the socket pushes live clusters only). */
  async load(): Promise<void> {
    try {
      const data = await requestAPI<IMetricsModel>(
        `clusters/${encodeURIComponent(this.cluster)}/metrics/${encodeURIComponent(this.topic)}`
      );
      this.charts.update(data);
    } catch (error) {
      console.warn('jupyter-cluster:', (error as Error).message);
    }
  }

  protected onAfterAttach(msg: Message): void {
    super.onAfterAttach(msg);
    void this.load();
    this.connect();
  }

  protected onResize(msg: Widget.ResizeMessage): void {
    super.onResize(msg);
    this.charts.resize();
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this.events.dispose();
    this.charts.dispose();
    super.dispose();
  }

  private watch(): void {
    const topics = [this.topic, ...this.overlayTopics.filter(t => t !== this.topic)].slice(0, 20);
    this.events.watch(this.cluster, topics);
  }

  private connect(): void {
    this.watch();
    this.events.connect();
  }

  private onMessage(msg: ServerMessage): void {
    if (msg.type === 'metrics' && msg.cluster === this.cluster) {
      if (msg.topic === this.topic) {
        this.charts.update(msg.data);
      } else if (this.overlayTopics.includes(msg.topic)) {
        this.charts.setSource(msg.data);
      }
    } else if (msg.type === 'topics' && msg.cluster === this.cluster) {
      this.charts.setCatalog(msg.topics.map(t => ({ topic: t.topic, scalars: t.scalars })));
    }
  }
}
