/**
 * The wire contract: payloads written by the Python builders (jupyter_cluster/wire/models.py,
 * tests/wire/test_models.py -> fixtures/wire.json) against the interfaces of model.ts.
 *
 * The assignments below are checked by tsc (`jlpm lint`, and tests/wire/test_models.py): a
 * field renamed on either side leaves a required property missing.  The tests then
 * feed the payloads to the panel's reducers and read them back through the fields.
 */
import type { IMetricsModel } from '../charts/charts';
import {
  IClusterModel,
  IClusterSummary,
  IJob,
  IJobs,
  ITopicSummary,
  failureDetails,
  initialState,
  jobProgress,
  memoryFraction,
  ownerText,
  parseWorkers,
  reduce,
  seriesKeys,
  toggleFailures,
  validName,
  clusterOfKernel
} from '../model';
import { onAxis } from '../charts/data';
import wire from './fixtures/wire.json';

const summary: IClusterSummary = wire.clusterSummary;
const detail: IClusterModel = wire.clusterModel;
const job: IJob = wire.job;
const jobs: IJobs = wire.jobs;
const topics: ITopicSummary[] = wire.topics;
// JSON arrays type as number[][], not the [step, value] tuples of Point, so the
// metrics model is checked by its field names here and by its use below.
const metricsFields: Required<Record<keyof IMetricsModel, unknown>> = wire.metrics;
const metrics = metricsFields as IMetricsModel;

describe('the Python builders and model.ts agree', () => {
  it('a cluster list, its detail view and its workers go through the reducer', () => {
    let state = reduce(initialState(), { type: 'clusters', clusters: [summary] });
    expect(state.selected).toBe('demo');
    expect(state.clusters[0].n_workers).toBe(2);
    expect(ownerText(state.clusters[0])).toBe('kernel 4242');
    state = reduce(state, { type: 'cluster', name: 'demo', model: detail });
    expect(state.detail?.workers.map(w => w.name)).toEqual(['a', 'b']);
    expect(state.detail?.workers[1].executing).toBe(3);
    expect(memoryFraction(state.detail!.workers[1])).toBeCloseTo(0.25);
    expect(state.detail?.owns_cluster).toBe(true);
    // the owner's and an attached notebook's kernel ids: either notebook, when active, shows it
    expect(clusterOfKernel([summary], summary.kernels[1])).toBe('demo');
    expect(clusterOfKernel([summary], summary.kernels[0])).toBe('demo');
    // a job names the kernel running it: a notebook that only connected by name is followed by its maps
    expect(clusterOfKernel([{ ...summary, kernels: [] }], job.kernel_id, [job])).toBe('demo');
  });

  it('jobs go through the reducer and the progress text', () => {
    let state = reduce(initialState(), { type: 'clusters', clusters: [summary] });
    state = reduce(state, { type: 'jobs', ...jobs });
    expect(state.jobs.running.map(j => j.job)).toEqual(['job-1']);
    expect(state.jobs.recent.map(j => j.job)).toEqual(['job-0']);
    expect(jobProgress(job).text).toContain('1 failed');
    // the failed item the job message carries, as the panel lists it on a click
    state = toggleFailures(state, state.jobs.running[0]);
    expect(state.failuresOpen).toBe('job-1');
    expect(failureDetails(state.jobs.running[0])).toEqual({
      rows: [
        {
          head: "item 7: {'lr': 0.01}", // by its value too, not only its index
          error: 'ValueError: bad 7',
          worker: 'on tcp://127.0.0.1:40000',
          traceback: 'Traceback (most recent call last):\n  File "<cell>", line 2\nValueError: bad 7'
        }
      ],
      more: ''
    });
  });

  it('topics and a metrics model go through the reducer to the charts', () => {
    let state = reduce(initialState(), { type: 'clusters', clusters: [summary] });
    state = reduce(state, { type: 'topics', cluster: 'demo', topics });
    expect(state.topic).toBe('es');
    expect(state.topics[0].series).toBe(3);
    state = reduce(state, { type: 'metrics', cluster: 'demo', topic: 'es', data: metrics });
    expect(state.metrics?.received).toBe(7);
    expect(seriesKeys(state.metrics!)).toEqual(['all', 'member=0', 'member=1']);
    expect(state.metrics?.vectors.load.all.rows).toEqual([[1, 0, 4]]);
    // each report's time: the relative-time x axis starts at the topic's first report
    expect(onAxis(state.metrics!.scalars.reward, state.metrics!, 'relative')['member=1'].map(p => p[0])).toEqual([
      0, 1, 2
    ]);
  });

  it('the panel accepts the names and worker counts the server accepts', () => {
    for (const [name, ok] of Object.entries(wire.names)) {
      expect([name, validName(name)]).toEqual([name, ok]);
    }
    for (const [text, ok] of Object.entries(wire.counts)) {
      expect([text, 'value' in parseWorkers(text, 'workers', 0, wire.maxWorkers)]).toEqual([text, ok]);
    }
  });
});
