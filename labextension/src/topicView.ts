/**
 * One metrics topic in the main area (a dockable tab, as dask-labextension
 * does for its plots): the same charts as the sidebar with room to read
 * them.  It watches its own cluster and topic on an events socket of its
 * own, so the sidebar can show something else; a stopped cluster's kept
 * history is read once over REST.
 */
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { eventsURL, requestAPI } from './api';
import { IMetricsModel, MetricsCharts } from './charts/charts';
import { ServerMessage } from './model';

export class TopicView extends Widget {
  private readonly charts: MetricsCharts;
  private socket: WebSocket | null = null;
  private retry = 0;

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
    window.clearTimeout(this.retry);
    const socket = this.socket;
    this.socket = null;
    socket?.close();
    this.charts.dispose();
    super.dispose();
  }

  private watch(): void {
    const topics = [this.topic, ...this.overlayTopics.filter(t => t !== this.topic)].slice(0, 20);
    if (this.socket?.readyState === WebSocket.OPEN) {
      this.socket.send(JSON.stringify({ type: 'watch', cluster: this.cluster, topics }));
    }
  }

  private connect(): void {
    if (this.isDisposed || this.socket) {
      return;
    }
    const socket = new WebSocket(eventsURL());
    this.socket = socket;
    socket.onopen = () => this.watch();
    socket.onmessage = event => {
      const msg = JSON.parse(String(event.data)) as ServerMessage;
      if (msg.type === 'metrics' && msg.cluster === this.cluster) {
        if (msg.topic === this.topic) {
          this.charts.update(msg.data);
        } else if (this.overlayTopics.includes(msg.topic)) {
          this.charts.setSource(msg.data);
        }
      } else if (msg.type === 'topics' && msg.cluster === this.cluster) {
        this.charts.setCatalog(msg.topics.map(t => ({ topic: t.topic, scalars: t.scalars })));
      }
    };
    socket.onclose = () => {
      if (this.socket === socket) {
        this.socket = null;
        this.retry = window.setTimeout(() => this.connect(), 2000);
      }
    };
  }
}
