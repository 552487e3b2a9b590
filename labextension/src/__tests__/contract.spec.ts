/**
 * The wire contract: payloads written by the Python builders (jupyter_cluster/wire/models.py,
 * tests/wire/test_models.py -> fixtures/wire.json) against the interfaces of messages.ts.
 *
 * The assignments below are checked by tsc (`jlpm lint`, and tests/wire/test_models.py): a
 * field renamed on either side leaves a required property missing.  The tests then
 * feed the payloads to the panel's reducers and read them back through the fields.
 */
import type { IMetricsModel } from '../charts/charts';
import {
  watchMessage,
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
import type { IClusterModel, IClusterSummary, ServerMessage, IJob, IJobs, ITopicSummary } from '../messages';
import { onAxis } from '../charts/data';
import type { ClientMessage } from '../panel/events';
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

// The events socket's envelopes (jupyter_cluster/wire/envelopes.py), one of each type: every field
// messages.ts's ServerMessage (and panel/events.ts's ClientMessage) names must be in the server's
// envelope of that type, and every type on one side must exist on the other (the Jest test below).
// JSON types a string field as string, not as its literal, so the fields are checked by name.
type Fields<T> = Required<Record<keyof T, unknown>>;
type ByType<M extends { type: string }> = { [K in M['type']]: Fields<Extract<M, { type: K }>> };
const serverEnvelopes: ByType<ServerMessage> = wire.envelopes.server;
const clientEnvelopes: ByType<ClientMessage> = wire.envelopes.client;
// each type the panel handles, exactly (tsc refuses a type missing here or one messages.ts has not)
const SERVER_TYPES: Record<ServerMessage['type'], true> = {
  clusters: true,
  jobs: true,
  cluster: true,
  workers: true,
  topics: true,
  metrics: true,
  run: true,
  error: true
};
const CLIENT_TYPES: Record<ClientMessage['type'], true> = { watch: true, interval: true };

describe('the Python builders and messages.ts agree', () => {
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

  it('the events socket sends the envelope types the panel handles, and takes the two it sends', () => {
    expect(Object.keys(wire.envelopes.server).sort()).toEqual(Object.keys(SERVER_TYPES).sort());
    expect(Object.keys(wire.envelopes.client).sort()).toEqual(Object.keys(CLIENT_TYPES).sort());
    for (const [type, msg] of Object.entries({ ...serverEnvelopes, ...clientEnvelopes })) {
      expect(msg.type).toBe(type);
    }
    // what the panel sends has exactly the fields the server takes
    const watch = watchMessage({ ...initialState(), selected: 'demo', topic: 'es' });
    expect(Object.keys(watch).sort()).toEqual(Object.keys(wire.envelopes.client.watch).sort());
    expect(watch).toEqual(wire.envelopes.client.watch);
  });

  it('each server envelope goes through the reducer as the panel reads it', () => {
    const server = wire.envelopes.server as unknown as {
      [K in ServerMessage['type']]: Extract<ServerMessage, { type: K }>;
    };
    let state = reduce(initialState(), server.clusters);
    expect(state.selected).toBe('demo');
    state = reduce(state, server.jobs);
    expect(state.jobs.running.map(j => j.job)).toEqual(['job-1']);
    expect(state.history).toEqual([]);
    state = reduce(state, server.cluster);
    expect(state.detail?.workers.map(w => w.name)).toEqual(['a', 'b']);
    state = reduce(state, server.workers);
    expect(state.detail?.workers.map(w => [w.name, w.memory])).toEqual([['a', 900_000_000]]);
    expect(state.detail?.n_workers).toBe(1);
    state = reduce(state, server.topics);
    expect(state.topic).toBe('es');
    state = reduce(state, server.metrics);
    expect(state.metrics?.received).toBe(7);
    expect(server.run.run.run).toBeTruthy();
    expect(['added', 'finished']).toContain(server.run.event);
    state = reduce(state, server.error);
    expect(state.error).toContain("unknown message type 'nope'");
  });
});
