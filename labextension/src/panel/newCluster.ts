/**
 * The New dialog's fields, checks and request (no DOM, no JupyterLab:
 * Jest-tested): the configured backends, workers, threads and memory.
 */
import { parseWorkers, validName } from '../model';

export type FormValues = { [name: string]: string };

export interface IField {
  name: string;
  label: string;
  value: string;
  placeholder?: string;
  /** a select with these choices instead of a text input */
  choices?: { value: string; label: string }[];
  title?: string;
}

/** What the New dialog sends (POST clusters). */
export interface INewCluster {
  name?: string;
  workers?: number;
  threads?: number;
  memory_limit?: string;
  backend?: string;
}

/** A memory size as the server takes it ("4GiB", "2 GB", "500MB", a number of bytes), or false. */
export function validMemory(text: string): boolean {
  return /^\s*(auto|\d+(\.\d+)?\s*([kKmMgGtT]i?[bB]?|[bB])?)\s*$/.test(text);
}

/** The New dialog's values checked: an error sentence, or null. */
export function checkNewCluster(v: FormValues): string | null {
  const name = (v.name ?? '').trim();
  if (name && !validName(name)) {
    return `${JSON.stringify(name)} is not a valid cluster name; use letters, digits, '-', '_' or '.'.`;
  }
  if ((v.workers ?? '').trim()) {
    const parsed = parseWorkers(v.workers, 'workers', 1);
    if ('error' in parsed) {
      return parsed.error;
    }
  }
  if ((v.threads ?? '').trim()) {
    const parsed = parseWorkers(v.threads, 'threads', 1, 1024);
    if ('error' in parsed) {
      return parsed.error;
    }
  }
  const memory = (v.memory ?? '').trim();
  if (memory && !validMemory(memory)) {
    return `memory ${JSON.stringify(memory)} is not a size; write it like 4GiB or 500MB.`;
  }
  return null;
}

/** The POST body for checked New dialog values. */
export function newClusterRequest(v: FormValues): INewCluster {
  const request: INewCluster = {};
  const text = (k: string): string => (v[k] ?? '').trim();
  if (text('name')) {
    request.name = text('name');
  }
  if (text('workers')) {
    request.workers = Number(text('workers'));
  }
  if (text('threads')) {
    request.threads = Number(text('threads'));
  }
  if (text('memory')) {
    request.memory_limit = text('memory').replace(/\s+/g, '');
  }
  if (text('backend')) {
    request.backend = text('backend');
  }
  return request;
}

/** The New dialog's fields: the configured backends (the default first), workers, threads, memory. */
export function newClusterFields(
  backends: string[],
  defaultBackend: string | null,
  defaultWorkers: number | null
): IField[] {
  const ordered =
    defaultBackend && backends.includes(defaultBackend)
      ? [defaultBackend, ...backends.filter(b => b !== defaultBackend)]
      : backends;
  const fields: IField[] = [{ name: 'name', label: 'Name', value: '', placeholder: 'automatic' }];
  if (ordered.length) {
    fields.push({
      name: 'backend',
      label: 'Backend',
      value: ordered[0],
      choices: ordered.map(b => ({ value: b, label: b === defaultBackend ? `${b} (default)` : b })),
      title: 'Where the workers run: the backends configured on this server'
    });
  }
  fields.push(
    {
      name: 'workers',
      label: 'Workers',
      value: defaultWorkers === null ? '' : String(defaultWorkers),
      placeholder: 'configured default'
    },
    { name: 'threads', label: 'Threads', value: '', placeholder: 'per worker: configured default' },
    { name: 'memory', label: 'Memory', value: '', placeholder: 'per worker, e.g. 4GiB' }
  );
  return fields;
}
