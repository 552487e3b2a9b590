/**
 * The code a renamed notebook's kernel runs: a Python literal of any path, no name left behind.
 */
import { followsRenames, pyString, renameCode } from '../notebook/rename';

describe('renameCode', () => {
  it('passes both paths as Python string literals', () => {
    const code = renameCode('Untitled.ipynb', 'work/sweep "lr".ipynb');
    expect(code).toContain('__jupyter_cluster_follow("Untitled.ipynb", "work/sweep \\"lr\\".ipynb")');
    expect(code.trim().split('\n').pop()).toBe('del __jupyter_cluster_follow');
  });

  it('escapes what would end a Python string or line', () => {
    const lit = pyString('a\nb\\c\u2028"\'');
    expect(lit).not.toMatch(/\n|\u2028/);
    expect(lit).toBe('"a\\nb\\\\c\\u2028\\"\'"');
  });

  it('is run only in Python kernels', () => {
    expect(followsRenames('python')).toBe(true);
    expect(followsRenames('Python')).toBe(true);
    expect(followsRenames('R')).toBe(false);
    expect(followsRenames(undefined)).toBe(false);
  });
});
