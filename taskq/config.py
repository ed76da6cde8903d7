"""Checks of a job's settings and chunks, before anything is written.

Data flow: client.py (create_job) -> config.py -> (nothing: pure checks and encoding).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import fields
from typing import Any, get_type_hints

from . import errors
from .mix import MAX_DEBT, MIX_BY, ON_EXHAUSTED, check_mix
from .models import MIN_SECONDS, JobConfig

__all__ = ["MIN_SECONDS", "check_memory_policy", "encode_tasks", "validate_config"]

#: The only maxmemory-policy under which Redis never drops a job's keys by itself.
SAFE_POLICY = "noeviction"


#: Each setting's type (``JobConfig``'s annotations, read once).
_KINDS = get_type_hints(JobConfig)


def validate_config(cfg: JobConfig) -> None:
    """Check a job's settings before anything is written.

    Args:
        cfg: the settings.

    Raises:
        InvalidConfig: a setting the engine cannot run (one line naming it).
    """

    def bad(msg: str) -> None:
        raise errors.InvalidConfig(msg)

    for f in fields(JobConfig):  # each field by its type and its bounds (models.setting)
        v, kind = getattr(cfg, f.name), _KINDS[f.name]
        lo, above = f.metadata.get("min"), f.metadata.get("above")
        if kind is bool and not isinstance(v, bool):
            bad(f"{f.name} must be True or False, got {v!r}")
        elif kind in (int, int | None) and not (v is None and kind is not int):
            if not isinstance(v, int) or isinstance(v, bool) or (lo is not None and v < lo):
                floor = "" if lo is None else f" >= {lo}"
                optional = "" if kind is int else " or None"
                bad(f"{f.name} must be an integer{floor}{optional}, got {v!r}")
        elif kind is float:
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
                bad(f"{f.name} must be a number, got {v!r}")
            if above is not None and v <= above:
                bad(f"{f.name} must be a number > {above:g}, got {v!r}")
            if lo is not None and v < lo:  # a float with a floor is a time
                bad(f"{f.name} must be at least {lo:g} s (times are kept in ms), got {v!r}")
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
    if cfg.on_exhausted not in ON_EXHAUSTED:
        bad(f"on_exhausted must be one of {', '.join(ON_EXHAUSTED)}, got {cfg.on_exhausted!r}")
    if cfg.mix_by not in MIX_BY:
        bad(f"mix_by must be one of {', '.join(MIX_BY)}, got {cfg.mix_by!r}")
    if cfg.max_debt > MAX_DEBT:  # (a slot's deferrals are bounded: lib/mixfeed.lua)
        bad(f"max_debt must be at most {MAX_DEBT}, got {cfg.max_debt!r}")
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
