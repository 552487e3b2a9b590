/**
 * The metric charts' view controls (smoothing slider, y scale, x axis,
 * top-k, series filter): their DOM, their values, and the state a host keeps
 * to restore them (e.g. across a re-rendered notebook output).  MetricsCharts
 * (charts.ts) puts them in its toolbar and redraws when they change.
 */
import type { XAxisMode } from './data';
import { X_AXIS_NAMES } from './data';
import { el } from '../common/dom';
import type { ITopK, YScale } from './lines';
import type { IOverlayPick, OverlayAxes } from './overlay';

/** The user's choices of a MetricsCharts: its toolbar and overlay. */
export interface IChartsState {
  smoothing: number;
  yScale: YScale;
  x: XAxisMode;
  /** a TOP_K value: 'all', 'top10', 'bottom5', ... */
  topK: string;
  filter: string;
  picks: IOverlayPick[];
  overlayAxes: OverlayAxes;
}

/** The top-k choices: which series a chart draws. */
export const TOP_K: [string, string, ITopK | null][] = [
  ['all', 'all series', null],
  ['top5', 'top 5', { k: 5, order: 'top' }],
  ['top10', 'top 10', { k: 10, order: 'top' }],
  ['top20', 'top 20', { k: 20, order: 'top' }],
  ['bottom5', 'lowest 5', { k: 5, order: 'bottom' }],
  ['bottom10', 'lowest 10', { k: 10, order: 'bottom' }],
  ['bottom20', 'lowest 20', { k: 20, order: 'bottom' }]
];

/** A toolbar control in the theme's colours (JupyterLab's variables, a fallback for either theme). */
export function controlStyle(dark: boolean): string {
  return (
    'font-size: 11px; padding: 0 4px; border-radius: 2px; ' +
    `background: var(--jp-layout-color1, ${dark ? '#2b2b2b' : '#fff'}); ` +
    `color: var(--jp-ui-font-color1, ${dark ? '#ddd' : '#222'}); ` +
    `border: 1px solid var(--jp-border-color1, ${dark ? '#555' : '#bbb'});`
  );
}

/**
 * The overlay's "two axes" toggle, on the chart: the overlay starts on one
 * axis, and the button is shown only when its metrics look like two units
 * or more (see overlay.ts), pressed while two axes are drawn.
 */
export function axesToggle(dark: boolean, toggled: () => void): HTMLButtonElement {
  const button = el('button', 'jc-overlay-two-axes', 'two axes');
  button.title =
    'The metrics look like two units: draw the first on the left axis and the others on a right axis ' +
    '(click again for one axis)';
  button.style.cssText = `${controlStyle(dark)} margin-bottom: 2px;`;
  button.setAttribute('aria-pressed', 'false');
  button.addEventListener('click', toggled);
  return button;
}

/** How the toggle looks: shown when the metrics are of `units` > 1 units (or two axes are drawn), pressed while they are. */
export function axesToggleState(units: number, axes: OverlayAxes): { shown: boolean; pressed: boolean; label: string } {
  const pressed = axes === 'dual';
  return { shown: units > 1 || pressed, pressed, label: pressed ? 'two axes ✓' : 'two axes' };
}

/** Show and press the toggle as axesToggleState() says. */
export function showAxesToggle(button: HTMLButtonElement, units: number, axes: OverlayAxes): void {
  const { shown, pressed, label } = axesToggleState(units, axes);
  button.style.display = shown ? '' : 'none';
  button.setAttribute('aria-pressed', String(pressed));
  button.textContent = label;
  button.style.fontWeight = pressed ? 'bold' : '';
}

/** What the toggle asks for after a click: two axes, or back to the default (one). */
export function toggledAxes(axes: OverlayAxes): OverlayAxes {
  return axes === 'dual' ? 'auto' : 'dual';
}

/** The view controls; `changed` is called after the user changed one. */
export class ChartControls {
  smoothing = 0;
  yScale: YScale = 'linear';
  x: XAxisMode = 'step';
  topK: ITopK | null = null;
  filter = '';
  /** what goes into the toolbar, in order */
  readonly nodes: HTMLElement[];
  private readonly smoothingInput = el('input', 'jc-smoothing');
  private readonly smoothValue = el('span', 'jc-smoothing-value', 'off');
  private readonly yScaleSelect = el('select', 'jc-y-scale');
  private readonly xSelect = el('select', 'jc-x-axis');
  private readonly topKSelect = el('select', 'jc-top-k');
  private readonly filterInput = el('input', 'jc-series-filter');

  constructor(changed: () => void) {
    const smoothLabel = el('label', 'jc-tool', 'smooth ');
    const smoothing = this.smoothingInput;
    smoothing.type = 'range';
    smoothing.min = '0';
    smoothing.max = '0.99';
    smoothing.step = '0.01';
    smoothing.value = '0';
    smoothing.style.cssText = 'width: 5em; vertical-align: middle;';
    this.smoothValue.style.cssText = 'display: inline-block; min-width: 2.2em;';
    smoothing.title =
      'Exponential moving average, as in TensorBoard: the raw data stays faint behind and in the tooltip';
    smoothing.addEventListener('input', () => {
      this.setSmoothing(Number(smoothing.value) || 0);
      changed();
    });
    smoothLabel.append(smoothing, this.smoothValue);

    const yLabel = el('label', 'jc-tool', 'y ');
    this.yScaleSelect.title =
      'The y scale: linear; log (points at or below 0 cannot be drawn: the chart says how many); ' +
      'symlog (log far from 0, linear near it: draws 0 and negative values too)';
    fill(
      this.yScaleSelect,
      ['linear', 'log', 'symlog'].map(v => [v, v])
    );
    this.yScaleSelect.addEventListener('change', () => {
      this.yScale = this.yScaleSelect.value as YScale;
      changed();
    });
    yLabel.append(this.yScaleSelect);

    const xLabel = el('label', 'jc-tool', 'x ');
    this.xSelect.title =
      'The x axis: the reported step, the wall-clock time of each report, or the time since the first';
    fill(
      this.xSelect,
      (Object.keys(X_AXIS_NAMES) as XAxisMode[]).map(m => [m, X_AXIS_NAMES[m]])
    );
    this.xSelect.addEventListener('change', () => {
      this.x = this.xSelect.value as XAxisMode;
      changed();
    });
    xLabel.append(this.xSelect);

    this.topKSelect.title = 'Draw every series, or only those with the highest or lowest last value';
    fill(
      this.topKSelect,
      TOP_K.map(([value, label]) => [value, label])
    );
    this.topKSelect.addEventListener('change', () => {
      this.topK = TOP_K.find(t => t[0] === this.topKSelect.value)?.[2] ?? null;
      changed();
    });

    this.filterInput.type = 'search';
    this.filterInput.placeholder = 'filter series';
    this.filterInput.style.cssText = 'width: 8em; font-size: 11px;';
    this.filterInput.addEventListener('input', () => {
      this.filter = this.filterInput.value;
      changed();
    });
    this.nodes = [smoothLabel, yLabel, xLabel, this.topKSelect, this.filterInput];
  }

  /** The choices as IChartsState has them (no overlay). */
  get state(): Omit<IChartsState, 'picks' | 'overlayAxes'> {
    return {
      smoothing: this.smoothing,
      yScale: this.yScale,
      x: this.x,
      topK: this.topKSelect.value,
      filter: this.filter
    };
  }

  /** Restore choices (unknown or missing ones stay as they are). */
  set(state: Partial<IChartsState>): void {
    if (typeof state.smoothing === 'number' && state.smoothing >= 0 && state.smoothing < 1) {
      this.setSmoothing(state.smoothing);
      this.smoothingInput.value = String(state.smoothing);
    }
    if (state.yScale === 'linear' || state.yScale === 'log' || state.yScale === 'symlog') {
      this.yScale = state.yScale;
      this.yScaleSelect.value = state.yScale;
    }
    if (state.x && state.x in X_AXIS_NAMES) {
      this.x = state.x;
      this.xSelect.value = state.x;
    }
    const topK = TOP_K.find(t => t[0] === state.topK);
    if (topK) {
      this.topK = topK[2];
      this.topKSelect.value = topK[0];
    }
    if (typeof state.filter === 'string') {
      this.filter = state.filter;
      this.filterInput.value = state.filter;
    }
  }

  private setSmoothing(weight: number): void {
    this.smoothing = weight;
    this.smoothValue.textContent = weight ? weight.toFixed(2) : 'off';
  }
}

function fill(select: HTMLSelectElement, choices: string[][]): void {
  for (const [value, label] of choices) {
    const o = el('option', '', label);
    o.value = value;
    select.append(o);
  }
}
