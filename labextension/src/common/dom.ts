/**
 * Building DOM nodes, for the charts and the sidebar panel alike (no JupyterLab
 * import here: the notebook widget's bundle includes it).
 */

/** A new ``tag`` element with ``className`` and, when given, ``text`` as its content. */
export function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className = '',
  text?: string
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (className) {
    node.className = className;
  }
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

/** Whether JupyterLab's current theme is dark (from the body attribute it sets). */
export function isDark(): boolean {
  const body = typeof document !== 'undefined' ? document.body : null;
  return !!body && body.getAttribute('data-jp-theme-light') === 'false';
}
