"""What the pieces of a taskq call cost inside Redis (by hand; for the next server pass).

Usage: .venv/bin/python bench/lua_costs.py

Where it sits: beside `taskq_profile.py`, whose commandstats see only the time inside the
Redis commands a script runs. This prints the rest: a bare FCALL with taskq's 22 KEYS, one
`redis.call` (HGET), TIME, the meta hash read whole into a Lua table, `string.format`, and
taskq's own `ack` with nothing to ack or lease (the fixed part of every call) and acking
the task the last call leased while leasing one (the 1/call hot path, no prefetch). Each
is µs of server time per FCALL (INFO commandstats), best of 3 x 2,000 calls, against a
private redis-server.
"""

from __future__ import annotations

from typing import Any

import common
import redis
from taskq_util import create_job, url_of

import taskq
from taskq.testing import lease_secret, trainer_worker

PROBES = (
    ("empty function", "return 0"),
    ("10 x HGET", "for i = 1, 10 do redis.call('HGET', k[1], 'f1') end return 0"),
    ("30 x HGET", "for i = 1, 30 do redis.call('HGET', k[1], 'f1') end return 0"),
    ("TIME", "redis.call('TIME') return 0"),
    (
        "HGETALL of 36 fields into a table",
        "local kv = redis.call('HGETALL', k[1]) local m = {} "
        "for i = 1, #kv, 2 do m[kv[i]] = kv[i + 1] end return 0",
    ),
    (
        "20 x string.format('%.0f')",
        "for i = 1, 20 do local s = string.format('%.0f', i * 1000.5) end return 0",
    ),
)


def best_us(admin: redis.Redis, call: object, calls: int = 2_000) -> float:
    """Least server µs per FCALL over 3 batches of `calls` calls of `call()`."""
    best = float("inf")
    for _ in range(3):
        admin.config_resetstat()
        for _ in range(calls):
            call()  # type: ignore[operator]
        stats = admin.info("commandstats")["cmdstat_fcall"]
        best = min(best, stats["usec"] / stats["calls"])
    return best


def main() -> None:
    common.install_signal_handlers()
    with common.start_redis() as server:
        admin = redis.Redis(host=common.LOOPBACK, port=server.port)
        keys = [f"k{{j}}:{i}".encode() for i in range(22)]
        admin.hset(keys[0], mapping={f"f{i}": i for i in range(36)})
        args = ("a", "b", "c", 1, 0, 0, 1, "S", -1)
        for label, body in PROBES:
            admin.function_load(
                f"#!lua name=costs\nredis.register_function('costs', function(k, a) {body} end)",
                replace=True,
            )
            us = best_us(admin, lambda: admin.fcall("costs", len(keys), *keys, *args))
            print(f"{label}: {us:.1f} µs")
        client = create_job(server.port, "costs", 20_000, passes=None)
        trainer = taskq.Trainer(
            "costs", url=url_of(server.port), handle_signals=False, heartbeat=False
        )
        job_keys = client.keys("costs").script_bytes
        held: list[Any] = []  # the (task, token) the last call leased: acked by the next
        for label, want in (
            ("taskq ack, nothing to ack or lease", 0),
            ("taskq ack of the last task and lease of one started task", 1),
        ):

            def one(want: int = want) -> None:
                trainer_worker(trainer).leases.call_no += 1
                reply = client.connection.scripts.call(
                    "ack",
                    job_keys,
                    [
                        trainer.job_incarnation,
                        trainer.worker_id,
                        trainer.incarnation,
                        trainer_worker(trainer).leases.call_no,
                        len(held) // 2,
                        *held,
                        0,
                        want,
                        "S",
                        -1,
                        lease_secret(trainer),
                    ],
                )
                assert int(reply[0]) in (0, 1), reply  # a refused call would measure nothing
                held[:] = [x for row in reply[1] for x in row[:2]]

            print(f"{label}: {best_us(admin, one, 1_000):.1f} µs")
        trainer.close()
        admin.close()


if __name__ == "__main__":
    main()
