/**
 * A renamed or moved notebook: the kernel is told its new path, so that the
 * runs it records name the notebook as the browser does (the server follows
 * the session's path itself: jupyter_cluster/server/renames.py).
 */

/** A Python string literal of `text` (JSON's escapes are Python's, and no quote or newline survives). */
export function pyString(text: string): string {
  return JSON.stringify(text)
    .replace(/\u2028/g, '\\u2028')
    .replace(/\u2029/g, '\\u2029');
}

/**
 * The code a Python kernel runs silently to follow a rename from `oldPath` to
 * `newPath`: nothing happens in a kernel without jupyter_cluster, and no name
 * is left in the user's namespace.
 */
export function renameCode(oldPath: string, newPath: string): string {
  return [
    'def __jupyter_cluster_follow(old, new):',
    '    try:',
    '        from jupyter_cluster.tracking.renamed import follow_rename',
    '    except ImportError:',
    '        return',
    '    follow_rename(old, new)',
    `__jupyter_cluster_follow(${pyString(oldPath)}, ${pyString(newPath)})`,
    'del __jupyter_cluster_follow'
  ].join('\n');
}

/** Whether a kernel of this language can run {@link renameCode}. */
export function followsRenames(language: string | null | undefined): boolean {
  return typeof language === 'string' && language.toLowerCase() === 'python';
}
