// BullMQ empty-job throughput: enqueue WARMUP + N no-op jobs (addBulk), then drain them
// with one Worker at a given concurrency; prints one JSON line per concurrency. The clock
// runs from the WARMUP-th completion to the last (steady state: the Worker's start, its
// connections and the first jobs are excluded); start_jobs_per_s is the older reading,
// all jobs from worker.run().
// Usage: node throughput.mjs --port PORT [--jobs N] [--warmup W] [--concurrency 1,16]
//        [--timeout-s S]
// Talks only to 127.0.0.1:PORT, a redis-server the Python driver started.
import { Queue, Worker } from 'bullmq';
import { parseArgs } from 'node:util';

const { values: args } = parseArgs({
  options: {
    port: { type: 'string' },
    jobs: { type: 'string', default: '10000' },
    warmup: { type: 'string', default: '2000' },
    concurrency: { type: 'string', default: '1,16' },
    'timeout-s': { type: 'string', default: '300' },
  },
});
const connection = { host: '127.0.0.1', port: Number(args.port), maxRetriesPerRequest: null };
const jobs = Number(args.jobs);
const warmup = Number(args.warmup);
const BATCH = 500;

setTimeout(() => {
  console.log(JSON.stringify({ error: `timed out after ${args['timeout-s']} s` }));
  process.exit(2);
}, Number(args['timeout-s']) * 1000).unref();

async function measure(concurrency) {
  const name = `throughput-c${concurrency}`;
  const queue = new Queue(name, { connection });
  const jobOpts = { removeOnComplete: true, removeOnFail: true };
  const enqueueStart = performance.now();
  const total = warmup + jobs;
  for (let offset = 0; offset < total; offset += BATCH) {
    const size = Math.min(BATCH, total - offset);
    await queue.addBulk(Array.from({ length: size }, () => ({ name: 'noop', data: {}, opts: jobOpts })));
  }
  const enqueueSeconds = (performance.now() - enqueueStart) / 1000;

  let completed = 0;
  let steadyStart = 0;
  let resolveDone;
  const done = new Promise((resolve) => { resolveDone = resolve; });
  const worker = new Worker(name, async () => {}, { connection, concurrency, autorun: false });
  worker.on('completed', () => {
    completed += 1;
    if (completed === warmup) steadyStart = performance.now();
    if (completed === total) resolveDone();
  });
  await worker.waitUntilReady();
  const drainStart = performance.now();
  worker.run();
  await done;
  const drainEnd = performance.now();
  const drainSeconds = (drainEnd - drainStart) / 1000;
  const steadySeconds = (drainEnd - (warmup > 0 ? steadyStart : drainStart)) / 1000;
  await worker.close();
  await queue.close();
  return {
    concurrency,
    jobs,
    warmup,
    enqueue_jobs_per_s: total / enqueueSeconds,
    jobs_per_s: jobs / steadySeconds,
    start_jobs_per_s: total / drainSeconds,
  };
}

for (const concurrency of args.concurrency.split(',').map(Number)) {
  console.log(JSON.stringify(await measure(concurrency)));
}
process.exit(0);
