// BullMQ drain in phases, for bench/server_instructions.py (server instructions per job):
// a first Worker drains WARMUP no-op jobs (scripts loaded, connections made) and closes;
// then N no-op jobs are enqueued (addBulk) and "ready" is printed; after a line on stdin
// (the driver zeroed its counters) a new Worker at the given concurrency drains them and
// "done" is printed at the N-th completion (before the Worker closes); after a second line
// on stdin everything closes.
// Usage: node drain_once.mjs --port PORT [--jobs N] [--warmup W] [--concurrency C]
// Talks only to 127.0.0.1:PORT, a redis-server the Python driver started.
import { Queue, Worker } from 'bullmq';
import { parseArgs } from 'node:util';
import { createInterface } from 'node:readline';

const { values: args } = parseArgs({
  options: {
    port: { type: 'string' },
    jobs: { type: 'string', default: '2000' },
    warmup: { type: 'string', default: '200' },
    concurrency: { type: 'string', default: '1' },
  },
});
const connection = { host: '127.0.0.1', port: Number(args.port), maxRetriesPerRequest: null };
const concurrency = Number(args.concurrency);
const name = `cg-c${concurrency}`;
const jobOpts = { removeOnComplete: true, removeOnFail: true };
const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();

async function enqueue(queue, n) {
  for (let offset = 0; offset < n; offset += 500) {
    const size = Math.min(500, n - offset);
    await queue.addBulk(Array.from({ length: size }, () => ({ name: 'noop', data: {}, opts: jobOpts })));
  }
}

async function drain(n) {
  let completed = 0;
  let resolveDone;
  const finished = new Promise((resolve) => { resolveDone = resolve; });
  const worker = new Worker(name, async () => {}, { connection, concurrency, autorun: false });
  worker.on('completed', () => {
    completed += 1;
    if (completed === n) resolveDone();
  });
  await worker.waitUntilReady();
  worker.run();
  await finished;
  return worker;
}

const queue = new Queue(name, { connection });
await enqueue(queue, Number(args.warmup));
await (await drain(Number(args.warmup))).close();
await enqueue(queue, Number(args.jobs));
console.log('ready');
await lines.next();
const worker = await drain(Number(args.jobs));
console.log('done');
await lines.next();
await worker.close();
await queue.close();
process.exit(0);
