/**
 * The parallel coordinates' axis switch: pick an axis, then its scale (log,
 * categories or linear).  Each axis starts on the scale chosen from its
 * values (axes.ts axisKind()); the switch offers only the scales its values
 * allow (axisChoices(): no log with a value <= 0, only categories for text).
 */
import { controlStyle } from '../charts/controls';
import { el } from '../common/dom';
import type { AxisKind } from './axes';
import type { IAxisSwitch } from './parallel';

/** How each scale reads in the switch. */
export const AXIS_KIND_LABELS: { [kind in AxisKind]: string } = {
  log: 'log',
  category: 'categorical',
  linear: 'linear'
};

export class AxisSwitch {
  /** Called with an axis's key and the scale the user picked for it. */
  onChange: ((key: string, kind: AxisKind) => void) | null = null;
  readonly node = el('label', 'jc-sweep-axis-switch', 'axis ');
  private readonly axisSelect = el('select', 'jc-sweep-axis');
  private readonly kindSelect = el('select', 'jc-sweep-axis-kind');
  private axes: IAxisSwitch[] = [];

  constructor() {
    this.axisSelect.title = 'A parallel-coordinates axis';
    this.kindSelect.title = "Its scale: log for values spanning decades, categorical for a few values (a seed's)";
    this.axisSelect.addEventListener('change', () => this.showKinds());
    this.kindSelect.addEventListener('change', () => {
      const key = this.axisSelect.value;
      if (key) {
        this.onChange?.(key, this.kindSelect.value as AxisKind);
      }
    });
    this.node.append(this.axisSelect, ' scale ', this.kindSelect);
  }

  /** Style the two selects for the theme. */
  style(dark: boolean): void {
    this.axisSelect.style.cssText = controlStyle(dark);
    this.kindSelect.style.cssText = controlStyle(dark);
  }

  /** Show these axes (the picked axis stays picked while it is among them). */
  update(axes: IAxisSwitch[]): void {
    this.axes = axes;
    const keep = this.axisSelect.value;
    const signature = JSON.stringify(axes.map(a => a.key));
    if (this.axisSelect.dataset.choices !== signature) {
      this.axisSelect.dataset.choices = signature;
      this.axisSelect.replaceChildren(
        ...axes.map(a => {
          const o = el('option', '', a.key);
          o.value = a.key;
          return o;
        })
      );
    }
    this.axisSelect.value = axes.some(a => a.key === keep) ? keep : (axes[0]?.key ?? '');
    this.node.style.display = axes.length ? '' : 'none';
    this.showKinds();
  }

  /** The picked axis's scales, its drawn one selected; "(auto)" marks the one chosen from the values. */
  private showKinds(): void {
    const axis = this.axes.find(a => a.key === this.axisSelect.value);
    const choices = axis?.choices ?? [];
    this.kindSelect.replaceChildren(
      ...choices.map(k => {
        const o = el('option', '', AXIS_KIND_LABELS[k] + (axis && k === axis.auto ? ' (auto)' : ''));
        o.value = k;
        return o;
      })
    );
    this.kindSelect.value = axis?.kind ?? '';
    this.kindSelect.disabled = choices.length < 2;
  }
}
