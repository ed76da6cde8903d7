"""What the tests share: the server binary, local servers and clusters, job factories,
and the checks of the CLI's output.

The servers, ``wait_until`` and ``free_port`` come from ``taskq.testing``, the helpers
users' tests get too (its servers are ``taskq.devserver``'s, which the demo and the bench
start theirs with). ``TASKQ_TEST_SERVER`` names the binary (default ``redis-server``; CI also runs
a subset with ``valkey-server``). The suite only ever talks to servers it started.
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from data_files import write_parquet

import taskq
from taskq.data import build_chunks
from taskq.devserver import LOOPBACK, cluster_port, find_server, stop_process
from taskq.mix import Feed, MixSpec, PassPlan, plan_pass
from taskq.testing import RedisCluster, RedisServer, free_port, wait_until

__all__ = [
    "ENTRY_POINT",
    "LOOPBACK",
    "SERVER_BINARY",
    "RedisClusterProcs",
    "SLOW_TASK_ROWS",
    "cluster_port",
    "RedisServer",
    "ROOT",
    "assert_no_job",
    "free_port",
    "job_keys",
    "load_yaml",
    "load_yaml_all",
    "make_job",
    "manual_job",
    "one_error_line",
    "quiet_trainer",
    "slow_reader_of_one_task",
    "part_with",
    "server_version",
    "stop_process",
    "wait_until",
]

#: The server binary every test starts (``$TASKQ_TEST_SERVER`` or redis-server); a missing
#: one fails the run at collection: the test command installs it, nothing is skipped.
SERVER_BINARY = find_server()


def server_version() -> str:
    """``<binary> <version>`` of the server the tests start, e.g. ``valkey-server 8.0.1``."""
    out = subprocess.run(
        [SERVER_BINARY, "--version"], capture_output=True, text=True, timeout=30
    ).stdout
    version = next((w[2:] for w in out.split() if w.startswith("v=")), out.strip())
    return f"{os.path.basename(SERVER_BINARY)} {version}"


def make_job(client: taskq.Client, name: str, n: int = 4, **kw: Any) -> taskq.JobStatus:
    """Create job ``name`` of ``n`` one-chunk tasks ``{"i": i}``; ``kw`` go to create_job."""
    return client.create_job(name, [{"i": i} for i in range(n)], **kw)


def manual_job(client: taskq.Client, name: str, n: int = 4, **kw: Any) -> taskq.JobStatus:
    """``make_job`` on the job's manual clock with no task timeout unless ``kw`` says
    otherwise: a test drives every step itself."""
    kw.setdefault("manual_clock", True)
    kw.setdefault("task_timeout", None)
    return make_job(client, name, n, **kw)


def quiet_trainer(client: taskq.Client, job: str, wid: str, **kw: Any) -> taskq.Trainer:
    """Trainer ``wid`` of ``job`` without its heartbeat thread (unless ``kw`` gives one):
    the test sends the heartbeats."""
    kw.setdefault("heartbeat", False)
    return taskq.Trainer(job, client=client, worker_id=wid, **kw)


#: The local cluster of the cluster tests (its nodes run ``SERVER_BINARY`` too: both
#: follow ``$TASKQ_TEST_SERVER``).
RedisClusterProcs = RedisCluster


# -- the CLI ------------------------------------------------------------------------------
#: The installed ``taskq`` console script of the environment running the tests.
ENTRY_POINT = os.path.join(os.path.dirname(sys.executable), "taskq")


#: The samples of ``slow_reader_of_one_task``'s one task.
SLOW_TASK_ROWS = 200


def slow_reader_of_one_task(
    client: taskq.Client, url: str, job: str, tmp_path: Path, script: str, **kw: Any
) -> tuple[subprocess.Popen[str], Path]:
    """A job of one task, a Parquet file of ``SLOW_TASK_ROWS`` rows in 4 row groups (ttl
    1 s, heartbeats every 0.2 s, no task timeout; ``kw``: more settings), and a real
    trainer process ``tests/SCRIPT URL JOB OUT`` started on it, which writes the samples
    it reads to OUT and says on stdout when it holds the task.

    Returns:
        the process (stop it with ``stop_process``) and OUT.
    """
    path = write_parquet(tmp_path / "d.parquet", rows=SLOW_TASK_ROWS, row_group_size=50)
    chunks = build_chunks(path)
    client.create_job(
        job,
        chunks=chunks,
        chunks_per_task=len(chunks),
        worker_ttl=1.0,
        heartbeat_interval=0.2,
        task_timeout=None,
        **kw,
    )
    out = tmp_path / "first.txt"
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).parent / script), url, job, str(out)],
        stdout=subprocess.PIPE,
        text=True,
    )
    return proc, out


def one_error_line(stderr: str) -> str:
    """The single ``taskq: error:`` line a failing command must print (and nothing else)."""
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("taskq: error: "), stderr
    return lines[0]


def job_keys(client: taskq.Client, name: str) -> list[str]:
    """Every key of job ``name`` (staging keys included)."""
    return list(client.redis.scan_iter(match=f"{client.connection.prefix}:{{{name}}}*", count=1000))


def assert_no_job(client: taskq.Client, name: str) -> None:
    """Job ``name`` has no key and is not in the jobs index (a refused create wrote nothing)."""
    assert job_keys(client, name) == []
    assert name not in client.list_jobs()


# -- files of the repo -------------------------------------------------------------------
ROOT = Path(__file__).resolve().parent.parent


def load_yaml(path: Path) -> Any:
    """The one YAML document of ``path``."""
    with path.open() as f:
        return yaml.safe_load(f)


def load_yaml_all(path: Path) -> list[Any]:
    """Every non-empty YAML document of ``path``."""
    with path.open() as f:
        return [doc for doc in yaml.safe_load_all(f) if doc is not None]


def part_with(part: str, lua: str, exports: str = "") -> str:
    """The Lua of part ``lib/<part>`` as shipped with ``lua`` added before its return table,
    which also returns ``exports`` (``"name = name, "``): a changed part for
    ``library.build``."""
    text = (resources.files("taskq.engine") / "lua" / "lib" / part).read_text()
    at = text.rindex("\nreturn {")
    return text[:at] + "\n" + lua + text[at:].replace("return {", "return {" + exports, 1)


def check_debt_readers(
    job: Any,
    spec: MixSpec,
    log: list[tuple[int, list[str]]],
    feed: list[Feed],
    p: int,
    plan: PassPlan,
) -> None:
    """A mixed job's debt as its readers show it equals the reference's (docs/mixing.md,
    "Debt, as shown"): ``mix_sequence(p)``'s ``repaid`` against ``plan`` (``plan_pass`` of
    pass ``p`` from the logs ``log`` and ``feed``, whole: a trimmed job's as kept before
    its trims), slot by slot; while ``p`` is the current pass, each
    source's ``debt`` in ``mix_status()`` against the plan cut at the charge's high-water,
    and ``waits_on`` against the plan's wait there."""
    rows = job.mix_sequence(p)  # (a trimmed pass's: from its watermark)
    repaid = {s.slot: s.repaid for s in plan.slots}
    assert [r["repaid"] for r in rows] == [repaid.get(r["slot"]) for r in rows]
    status = job.mix_status()
    if status["pass"] != p:
        return
    high, at, first = status["high_water"], plan, p * spec.stride
    if plan.end not in ("done", "stop") or len(plan.slots) != high:
        at = plan_pass(spec, log, p, feed=feed, first_slot=first, length=high)
    assert [r["debt"] for r in status["sources"]] == at.debt
    if status["waits_on"] is not None:
        assert plan.end == "wait" and len(plan.slots) == high
        assert plan.waits_on is not None
        assert status["waits_on"] == {"source": spec.sources[plan.waits_on], "slot": first + high}
