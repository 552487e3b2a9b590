/**
 * The one client of the server's events websocket, for the sidebar and the
 * main-area topic views alike: connects, reconnects with back-off, re-sends
 * the last watch and interval on every (re)connection, and hands each parsed
 * message to its listener.  Other views listen on the sidebar's connection
 * (listen(), through ClusterPanel.feed) rather than open one each: the
 * server pumps the whole cluster and job lists down every socket.
 */
import { eventsURL } from '../api';
import type { ServerMessage } from '../messages';

export interface IEventsOptions {
  /** each message from the server */
  onMessage: (msg: ServerMessage) => void;
  /** the connection's state: null when open, a sentence while it is lost */
  onStatus?: (error: string | null) => void;
  /** first reconnection delay (ms), doubled after each failure up to maxBackoff */
  backoff?: number;
  maxBackoff?: number;
}

/** A view listening on a connection it does not own (see EventsClient.listen). */
export interface IEventsListener {
  onMessage(msg: ServerMessage): void;
  /** null when the connection (re)opened, a sentence while it is lost */
  onStatus?(error: string | null): void;
}

/** A connection other views listen on instead of opening their own. */
export interface IEventsFeed {
  /** whether the socket is open now */
  readonly isOpen: boolean;
  /** Hand `listener` every message and change of state from now on (connecting if need be); returns the function that stops it. */
  listen(listener: IEventsListener): () => void;
}

export type ClientMessage =
  { type: 'watch'; cluster: string | null; topics: string[] } | { type: 'interval'; ms: number };

export class EventsClient implements IEventsFeed {
  private readonly listeners = new Set<IEventsListener>();
  private socket: WebSocket | null = null;
  private timer = 0;
  private delay: number;
  private closed = false;
  private watchMsg: ClientMessage | null = null;
  private intervalMsg: ClientMessage | null = null;

  constructor(private readonly options: IEventsOptions) {
    this.delay = options.backoff ?? 500;
  }

  /** Whether the socket is open now. */
  get isOpen(): boolean {
    return this.socket?.readyState === WebSocket.OPEN;
  }

  listen(listener: IEventsListener): () => void {
    this.listeners.add(listener);
    this.connect();
    return () => {
      this.listeners.delete(listener);
    };
  }

  /** Connect (idempotent). */
  connect(): void {
    if (this.closed || this.socket) {
      return;
    }
    let socket: WebSocket;
    try {
      socket = new WebSocket(eventsURL());
    } catch {
      this.retry();
      return;
    }
    this.socket = socket;
    socket.onopen = () => {
      this.delay = this.options.backoff ?? 500;
      this.status(null);
      // what the server must know again after a reconnection
      for (const msg of [this.intervalMsg, this.watchMsg]) {
        if (msg) {
          socket.send(JSON.stringify(msg));
        }
      }
    };
    socket.onmessage = event => {
      let msg: ServerMessage;
      try {
        msg = JSON.parse(String(event.data)) as ServerMessage;
      } catch (error) {
        console.error('jupyter-cluster: bad message', error);
        return;
      }
      this.options.onMessage(msg);
      // a listener that throws must not keep the message from the others
      for (const listener of [...this.listeners]) {
        try {
          listener.onMessage(msg);
        } catch (error) {
          console.error('jupyter-cluster: an events listener failed', error);
        }
      }
    };
    socket.onclose = () => {
      if (this.socket === socket) {
        this.socket = null;
        if (!this.closed) {
          this.status('Lost the connection to the server; reconnecting…');
          this.retry();
        }
      }
    };
  }

  /** Say which cluster and topics to push (kept and re-sent after a reconnection); unchanged watches are not sent. */
  watch(cluster: string | null, topics: string[]): void {
    const msg: ClientMessage = { type: 'watch', cluster, topics };
    if (JSON.stringify(msg) === JSON.stringify(this.watchMsg)) {
      return;
    }
    this.watchMsg = msg;
    this.send(msg);
  }

  /** Force the watch to be sent again (the server then sends the cluster's full worker list). */
  rewatch(): void {
    if (this.watchMsg) {
      this.send(this.watchMsg);
    }
  }

  /** The push interval in ms (kept and re-sent after a reconnection). */
  setInterval(ms: number): void {
    this.intervalMsg = { type: 'interval', ms };
    this.send(this.intervalMsg);
  }

  /** Close for good. */
  dispose(): void {
    this.closed = true;
    this.listeners.clear();
    window.clearTimeout(this.timer);
    const socket = this.socket;
    this.socket = null;
    socket?.close();
  }

  private status(error: string | null): void {
    this.options.onStatus?.(error);
    for (const listener of [...this.listeners]) {
      try {
        listener.onStatus?.(error);
      } catch (err) {
        console.error('jupyter-cluster: an events listener failed', err);
      }
    }
  }

  private send(msg: ClientMessage): void {
    if (this.socket && this.socket.readyState === WebSocket.OPEN) {
      this.socket.send(JSON.stringify(msg));
    }
  }

  private retry(): void {
    if (this.closed) {
      return;
    }
    window.clearTimeout(this.timer);
    this.timer = window.setTimeout(() => {
      this.socket = null;
      this.connect();
    }, this.delay);
    this.delay = Math.min(this.delay * 2, this.options.maxBackoff ?? 10000);
  }
}
