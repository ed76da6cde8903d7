// BullMQ stalled-job recovery with default settings (lockDuration 30 s, stalledInterval
// 30 s, maxStalledCount 1): a long job runs in a worker child process (child_process.fork);
// once it has started the child is SIGKILLed and a second worker child is forked; prints
// {"recovery_s": seconds from the kill until the job started again, or null}.
// Usage: node stalled.mjs --port PORT [--max-wait-s S]
// Talks only to 127.0.0.1:PORT, a redis-server the Python driver started.
import { Queue, Worker } from 'bullmq';
import { Redis } from 'ioredis';
import { fork } from 'node:child_process';
import { parseArgs } from 'node:util';

const { values: args } = parseArgs({
  options: {
    port: { type: 'string' },
    'max-wait-s': { type: 'string', default: '120' },
    child: { type: 'boolean', default: false },
  },
});
const connection = { host: '127.0.0.1', port: Number(args.port), maxRetriesPerRequest: null };
const QUEUE = 'stalled';
const STARTS_KEY = 'bench:bullmq:starts';

if (args.child) {
  // A worker with BullMQ's defaults whose job records its start time, then runs for an hour.
  const recorder = new Redis(connection);
  const worker = new Worker(QUEUE, async () => {
    await recorder.rpush(STARTS_KEY, String(Date.now() / 1000));
    await new Promise((resolve) => setTimeout(resolve, 3_600_000));
  }, { connection });
  await worker.waitUntilReady();
} else {
  const children = [];
  const killChildren = () => { for (const child of children) child.kill('SIGKILL'); };
  process.on('exit', killChildren);
  for (const signal of ['SIGINT', 'SIGTERM']) process.on(signal, () => process.exit(130));

  const client = new Redis(connection);
  const waitForStarts = async (count, timeoutS) => {
    const deadline = Date.now() + timeoutS * 1000;
    while (Date.now() < deadline) {
      if ((await client.llen(STARTS_KEY)) >= count) return true;
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    return false;
  };
  const startChild = () => {
    const child = fork(new URL(import.meta.url).pathname, ['--port', args.port, '--child']);
    children.push(child);
    return child;
  };

  const queue = new Queue(QUEUE, { connection });
  await queue.add('long', {});
  const first = startChild();
  let result;
  if (!(await waitForStarts(1, 60))) {
    result = { recovery_s: null, error: 'the job never started on the first worker' };
  } else {
    first.kill('SIGKILL');
    const killedAt = Date.now() / 1000;
    startChild();
    const maxWait = Number(args['max-wait-s']);
    if (await waitForStarts(2, maxWait)) {
      const restartedAt = Number(await client.lindex(STARTS_KEY, 1));
      result = { recovery_s: restartedAt - killedAt };
    } else {
      result = { recovery_s: null, error: `not within ${maxWait} s` };
    }
  }
  console.log(JSON.stringify(result));
  await queue.close();
  client.disconnect();
  process.exit(0);
}
