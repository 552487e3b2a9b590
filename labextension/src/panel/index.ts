/**
 * The sidebar panel in parts: events.ts (the websocket client), dialogs.ts,
 * the section views (clusters.ts, workersView.ts, jobs.ts, metricsView.ts),
 * loader.ts (REST reads outside render), pure helpers (workers.ts, order.ts)
 * and panel.ts, which puts them together.
 */
export { ClusterPanel, DEFAULT_SETTINGS } from './panel';
export type { IPanelSettings } from './panel';
export { clusterIcon } from './icon';
export { EventsClient } from './events';
