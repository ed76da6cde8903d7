"""Checks of a job's settings and chunks, before anything is written.

Data flow: client.py (create_job) -> config.py -> (nothing: pure checks and encoding).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Any

from . import errors
from .mix import ON_EXHAUSTED, check_mix
from .models import JobConfig

#: The shortest time setting (seconds): times are stored in whole milliseconds, and a
#: shorter one would round to 0 (a heartbeat storm, or no task timeout at all).
MIN_SECONDS = 0.01
#: The only maxmemory-policy under which Redis never drops a job's keys by itself.
SAFE_POLICY = "noeviction"


def validate_config(cfg: JobConfig) -> None:
    """Check a job's settings before anything is written.

    Args:
        cfg: the settings.

    Raises:
        InvalidConfig: a setting the engine cannot run (one line naming it).
    """

    def bad(msg: str) -> None:
        raise errors.InvalidConfig(msg)

    if not isinstance(cfg.chunks_per_task, int) or cfg.chunks_per_task < 1:
        bad(f"chunks_per_task must be an integer >= 1, got {cfg.chunks_per_task!r}")
    if cfg.passes is not None and (not isinstance(cfg.passes, int) or cfg.passes < 1):
        bad(f"passes must be an integer >= 1 or None, got {cfg.passes!r}")
    for name in ("worker_ttl", "heartbeat_interval"):
        v = getattr(cfg, name)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
            bad(f"{name} must be a number, got {v!r}")
        if v < MIN_SECONDS:
            bad(f"{name} must be at least {MIN_SECONDS:g} s (times are kept in ms), got {v!r}")
    if cfg.heartbeat_interval >= cfg.worker_ttl:
        bad(
            f"heartbeat_interval ({cfg.heartbeat_interval}) must be shorter than "
            f"worker_ttl ({cfg.worker_ttl})"
        )
    tt = cfg.task_timeout
    if not (tt is None or tt == "auto"):
        if not isinstance(tt, (int, float)) or isinstance(tt, bool) or not math.isfinite(tt):
            bad(f"task_timeout must be 'auto', None or seconds, got {tt!r}")
        elif tt < MIN_SECONDS:
            bad(
                f"task_timeout must be at least {MIN_SECONDS:g} s (times are kept in ms), "
                f"got {tt!r}"
            )
    for name in ("max_failures", "max_attempts"):
        v = getattr(cfg, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            bad(f"{name} must be an integer >= 1, got {v!r}")
    if not isinstance(cfg.seed, int) or isinstance(cfg.seed, bool):
        bad(f"seed must be an integer, got {cfg.seed!r}")
    k = cfg.backup_factor
    if not isinstance(k, (int, float)) or isinstance(k, bool) or not math.isfinite(k) or k <= 1:
        bad(f"backup_factor must be a number > 1, got {k!r}")
    limit = cfg.max_backlog
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        bad(f"max_backlog must be an integer >= 1, got {limit!r}")
    if isinstance(cfg.shards, bool) or not isinstance(cfg.shards, int) or cfg.shards < 1:
        bad(f"shards must be an integer >= 1, got {cfg.shards!r}")
    if cfg.on_exhausted not in ON_EXHAUSTED:
        bad(f"on_exhausted must be one of {', '.join(ON_EXHAUSTED)}, got {cfg.on_exhausted!r}")
    if cfg.mix is not None:
        check_mix(cfg.mix)
        if cfg.shards != 1 or cfg.stream or cfg.shuffle:
            bad(
                "a mixed job's tasks are its sources' and its order its schedule: no shards, "
                "stream or shuffle"
            )


def encode_tasks(chunks: Iterable[Any], chunks_per_task: int) -> tuple[list[str], int]:
    """Group chunks into tasks and encode each as a JSON list; validates every chunk.

    Returns:
        (the tasks' JSON, the number of chunks).

    Raises:
        InvalidInput: a chunk is not JSON-serialisable, or there are none.
    """
    tasks: list[str] = []
    group: list[str] = []
    count = 0
    for i, chunk in enumerate(chunks):
        count += 1
        try:
            group.append(json.dumps(chunk, separators=(",", ":"), allow_nan=False))
        except (TypeError, ValueError) as e:
            raise errors.InvalidInput(f"chunk {i} is not JSON: {e}") from e
        if len(group) == chunks_per_task:
            tasks.append("[" + ",".join(group) + "]")
            group = []
    if group:
        tasks.append("[" + ",".join(group) + "]")
    if not tasks:
        raise errors.InvalidInput("a job needs at least one chunk")
    return tasks, count


def check_memory_policy(policy: str | None, url: str) -> None:
    """Refuse a Redis whose ``maxmemory-policy`` may evict keys.

    Args:
        policy: the policy read from Redis, or None when it could not be read (an ACL
            without INFO): then nothing is refused.
        url: the (masked) URL, for the message.

    Raises:
        InvalidConfig: ``policy`` is not ``noeviction``.
    """
    if policy is not None and policy != SAFE_POLICY:
        raise errors.InvalidConfig(
            f"Redis at {url} has maxmemory-policy {policy}: it may evict a job's keys "
            f"(leases, done marks) silently; set maxmemory-policy {SAFE_POLICY} (or pass "
            f"allow_eviction=True to accept the risk)"
        )
