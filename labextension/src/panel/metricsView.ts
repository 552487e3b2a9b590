/**
 * The metrics section: topic picker, series list with colour swatches, and
 * the charts.  It draws only what it is given; the overlay's wishes (other
 * topics, earlier runs) go out through callbacks and the panel feeds them.
 * Charts are updated only when their model object changed.  With more
 * series than SERIES_LISTED, the series list names those the charts draw
 * (after their filter and top-k), not all of them: 200 checkboxes in a small
 * box tell no one anything.
 */
import { IMetricsModel, MetricsCharts } from '../charts/charts';
import { seriesLabel } from '../charts/data';
import { el } from '../common/dom';
import { IPanelState, seriesKeys } from '../model';
import { button } from './clusters';
import { setText } from './order';

export interface IMetricsHost {
  openTopic: ((cluster: string, topic: string) => void) | null;
  selectTopic(topic: string | null): void;
  toggleSeries(topic: string, key: string): void;
  /** the overlay draws from these other topics of the shown cluster */
  overlayTopics(topics: string[]): void;
  /** the overlay draws from these earlier runs' topics */
  overlayKept(sources: { cluster: string; topic: string }[]): void;
}

const NONE_HIDDEN: string[] = [];

/** Series above which the list shows only those drawn (and those switched off). */
export const SERIES_LISTED = 40;

export type Catalog = { topic: string; scalars: string[]; cluster?: string }[];

export class MetricsView {
  readonly node = el('div', 'jc-metrics-section');
  private readonly topicSelect = el('select', 'jp-mod-styled jc-topic');
  private readonly seriesNode = el('div', 'jc-series');
  private readonly chartsHost = el('div', 'jc-charts');
  private readonly empty = el('div', 'jc-empty', 'No metrics yet: call jupyter_cluster.report(...) in a task.');
  private readonly openButton: HTMLButtonElement;
  private charts: MetricsCharts | null = null;
  private dark: boolean | undefined;
  private drawn: { topics?: string; series?: string; catalog?: string } = {};
  private input: { metrics: unknown; off: unknown; sources: Map<string, IMetricsModel> } = {
    metrics: null,
    off: null,
    sources: new Map()
  };
  private shownTopic: string | null = null;
  private selected: string | null = null;
  private last: [IPanelState, Catalog] | null = null;

  constructor(private readonly host: IMetricsHost) {
    this.topicSelect.title = 'Metrics topic';
    this.topicSelect.addEventListener('change', () => host.selectTopic(this.topicSelect.value || null));
    this.openButton = button('Open', 'jc-open-topic', 'Open this topic in the main area', () => {
      if (this.selected && this.shownTopic) {
        host.openTopic?.(this.selected, this.shownTopic);
      }
    });
    const topicRow = el('div', 'jc-topic-row');
    topicRow.append(this.topicSelect, this.openButton);
    this.node.append(topicRow, this.seriesNode, this.empty, this.chartsHost);
  }

  setDark(dark: boolean): void {
    this.dark = dark;
    this.charts?.setDark(dark);
    // the series list's swatches in the new theme's palette (its list is not rebuilt for a theme)
    this.seriesNode.querySelectorAll<HTMLElement>('.jc-swatch').forEach(swatch => {
      swatch.style.background = this.charts?.seriesColor(swatch.dataset.key ?? '') ?? '';
    });
  }

  resize(): void {
    this.charts?.resize();
  }

  dispose(): void {
    this.charts?.dispose();
    this.charts = null;
  }

  /** An earlier run's model the overlay asked for. */
  setKept(model: IMetricsModel, cluster: string): void {
    this.charts?.setSource(model, cluster);
  }

  update(state: IPanelState, catalog: Catalog): void {
    this.last = [state, catalog];
    const { topics, topic, metrics, hidden, selected } = state;
    this.selected = selected;
    this.shownTopic = topic;
    const topicsKey = JSON.stringify([topics.map(t => t.topic), topic]);
    if (this.drawn.topics !== topicsKey) {
      this.drawn.topics = topicsKey;
      this.topicSelect.replaceChildren(
        ...topics.map(t => {
          const o = el('option', '', t.topic);
          o.value = t.topic;
          return o;
        })
      );
      this.topicSelect.value = topic ?? '';
      this.topicSelect.style.display = topics.length ? '' : 'none';
    }
    this.empty.style.display = topics.length ? 'none' : '';
    this.openButton.style.display = topic && this.host.openTopic ? '' : 'none';
    if (!topic || !metrics) {
      if (this.charts && !topic) {
        this.charts.dispose();
        this.charts = null;
        this.input = { metrics: null, off: null, sources: new Map() };
        this.drawn.catalog = undefined;
      }
      if (this.drawn.series !== '') {
        this.seriesNode.replaceChildren();
        this.drawn.series = '';
      }
      return;
    }
    const charts = this.chartsFor();
    const keys = seriesKeys(metrics);
    // one empty list, not a new one per render: a new array would pass for a change of the hidden
    // series and make every push (jobs, workers) go through the charts' redraw
    const off = hidden[topic] ?? NONE_HIDDEN;
    if (this.input.metrics !== metrics || this.input.off !== off) {
      this.input = { ...this.input, metrics, off };
      charts.update(metrics, off);
    }
    const many = keys.length > SERIES_LISTED;
    const listed = many ? listedSeries(keys, charts.drawnSeries(), off) : keys;
    const seriesKey = JSON.stringify([topic, keys.length, listed, off]);
    if (this.drawn.series !== seriesKey) {
      this.drawn.series = seriesKey;
      this.seriesNode.replaceChildren();
      if (many) {
        const note = el(
          'div',
          'jc-series-more',
          `${listed.length} of ${keys.length} series listed: the chart's filter and top k choose which`
        );
        note.style.flexBasis = '100%';
        this.seriesNode.append(note);
      }
      if (keys.length > 1) {
        for (const key of listed) {
          const label = el('label', 'jc-series-item');
          const box = el('input');
          box.type = 'checkbox';
          box.checked = !off.includes(key);
          box.addEventListener('change', () => this.host.toggleSeries(topic, key));
          const swatch = el('span', 'jc-swatch');
          swatch.dataset.key = key;
          swatch.style.background = charts.seriesColor(key);
          label.title = key;
          const name = el('span', 'jc-series-name');
          setText(name, seriesLabel(key));
          label.append(box, swatch, name);
          this.seriesNode.append(label);
        }
      }
    }
    const catalogKey = JSON.stringify(catalog);
    if (this.drawn.catalog !== catalogKey) {
      this.drawn.catalog = catalogKey;
      charts.setCatalog(catalog);
    }
    for (const model of Object.values(state.overlayMetrics)) {
      if (this.input.sources.get(model.topic) !== model) {
        this.input.sources.set(model.topic, model);
        charts.setSource(model);
      }
    }
  }

  private chartsFor(): MetricsCharts {
    if (!this.charts) {
      this.charts = new MetricsCharts(this.chartsHost, { height: 200, dark: this.dark });
      this.charts.onOverlayKept = kept => this.host.overlayKept(kept);
      this.charts.onOverlayTopics = topics => this.host.overlayTopics(topics);
      // the filter or top k changed what is drawn: a long series list follows it
      this.charts.onViewState = () => {
        if (this.last) {
          this.update(...this.last);
        }
      };
    }
    return this.charts;
  }
}

/** The series a long list shows: those drawn, and those switched off (to switch them on), at most SERIES_LISTED. */
export function listedSeries(keys: string[], drawn: string[], off: string[]): string[] {
  const wanted = new Set([...drawn, ...off]);
  const listed = keys.filter(k => wanted.has(k));
  return (listed.length ? listed : keys).slice(0, SERIES_LISTED);
}
