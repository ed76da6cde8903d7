"""One rq worker process for the recovery rows: `python rq_worker.py PORT VARIANT QUEUE`.

Where it sits: started (and SIGKILLed) by `rq_bench.py`; VARIANT is a key of
`RQ_VARIANTS` there, i.e. rq's defaults or the tuned settings. Connects only to
127.0.0.1:PORT, a redis-server the bench started.
"""

from __future__ import annotations

import sys

import redis
from rq import Queue, Worker

WORKER_SETTINGS = {
    # rq's defaults: maintenance every 600 s, job monitoring every 30 s, worker ttl 420 s.
    "default": {},
    # Shortest settings the installed rq accepts; rq still adds a fixed 60 s to every
    # started-registry heartbeat, so an abandoned job cannot be seen before ~61 s.
    "tuned": {"maintenance_interval": 1, "job_monitoring_interval": 1, "worker_ttl": 20},
}


def main(argv: list[str]) -> None:
    port, variant, queue_name = int(argv[0]), argv[1], argv[2]
    connection = redis.Redis(host="127.0.0.1", port=port)
    queue = Queue(queue_name, connection=connection)
    worker = Worker([queue], connection=connection, **WORKER_SETTINGS[variant])
    worker.work(logging_level="WARNING")


if __name__ == "__main__":
    main(sys.argv[1:])
