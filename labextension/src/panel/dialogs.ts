/**
 * The panel's dialogs: a form whose errors stay in the dialog with what was
 * typed (a check as the user types, a server refusal after submitting), and
 * the New dialog's fields come from newCluster.ts.
 */
import { Dialog, showDialog } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import { el } from '../common/dom';
import { FormValues, IField } from './newCluster';

/**
 * A dialog body with labelled inputs; getValue() returns their current values.
 * `check` returns an error sentence for values that cannot be sent; it is
 * shown in the dialog as the user types, as is `error` (a refusal from before).
 */
export class FormBody extends Widget implements Dialog.IBodyWidget<FormValues> {
  private readonly inputs = new Map<string, HTMLInputElement | HTMLSelectElement>();
  private readonly errorNode = el('div', 'jc-form-error');

  constructor(
    fields: IField[],
    error = '',
    private readonly check: (values: FormValues) => string | null = () => null
  ) {
    super();
    this.addClass('jc-form');
    for (const f of fields) {
      const label = el('label', 'jc-form-row');
      label.append(el('span', '', f.label));
      let input: HTMLInputElement | HTMLSelectElement;
      if (f.choices) {
        const select = el('select', `jp-mod-styled jc-input-${f.name}`);
        for (const c of f.choices) {
          const o = el('option', '', c.label);
          o.value = c.value;
          select.append(o);
        }
        input = select;
      } else {
        const text = el('input', `jp-mod-styled jc-input-${f.name}`);
        text.placeholder = f.placeholder ?? '';
        input = text;
      }
      input.name = f.name;
      input.value = f.value;
      if (f.title) {
        label.title = f.title;
      }
      input.addEventListener('input', () => this.showError(this.check(this.getValue()) ?? ''));
      label.append(input);
      this.node.append(label);
      this.inputs.set(f.name, input);
    }
    this.node.append(this.errorNode);
    this.showError(error);
  }

  private showError(message: string): void {
    this.errorNode.textContent = message;
    this.errorNode.style.display = message ? '' : 'none';
  }

  getValue(): FormValues {
    const out: FormValues = {};
    this.inputs.forEach((input, name) => (out[name] = input.value));
    return out;
  }
}

/**
 * Show a form until its values pass `check` and `submit` (the error stays in
 * the dialog, with what the user typed); null when cancelled.
 */
export async function ask(
  title: string,
  label: string,
  fields: IField[],
  check: (values: FormValues) => string | null,
  submit?: (values: FormValues) => Promise<void>
): Promise<FormValues | null> {
  let error = '';
  for (;;) {
    const result = await showDialog({
      title,
      body: new FormBody(fields, error, check),
      buttons: [Dialog.cancelButton(), Dialog.okButton({ label })]
    });
    if (!result.button.accept || !result.value) {
      return null;
    }
    const values = result.value;
    error = check(values) ?? '';
    if (!error && submit) {
      try {
        await submit(values);
      } catch (reason) {
        error = String((reason as Error).message);
      }
    }
    if (!error) {
      return values;
    }
    fields = fields.map(f => ({ ...f, value: values[f.name] ?? f.value }));
  }
}
