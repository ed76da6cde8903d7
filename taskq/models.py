"""Plain data the library hands to its users: job config, leased tasks, status snapshots.

Data flow: client.py builds JobConfig and JobStatus; trainer/core.py builds Task from the
lease script's reply; stats.py, the CLI and the exporter read JobStatus.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from typing import Any

from . import errors

STATES = ("running", "paused", "waiting", "completed", "cancelled")

_EVENTS_LOCK = threading.Lock()  # makes a Task's Events once, whichever thread asks first


#: The shortest time setting (seconds): times are stored in whole milliseconds, and a
#: shorter one would round to 0 (a heartbeat storm, or no task timeout at all).
MIN_SECONDS = 0.01


def setting(default: Any, help: str, **bounds: float) -> Any:
    """A ``JobConfig`` field.

    Args:
        default: its default.
        help: what it does, in the words of the API and of ``taskq job create --help``
            (a field's name in double backticks reads as its option there).
        bounds: ``min`` (inclusive) or ``above`` (exclusive): what
            ``config.validate_config`` checks and the CLI shows as the option's range.

    Returns:
        the ``dataclasses.field``, its help and bounds in its ``metadata``.
    """
    return field(default=default, metadata={"help": help, **bounds})


@dataclass(frozen=True)
class JobConfig:
    """Every setting of a job, fixed at create time: ``Client.create_job``, ``taskq job
    create`` (one option per field, generated from these) and the sharded create take one,
    checked whole by ``config.validate_config`` before anything is written.

    A new setting is one field here (and its use in the engine): its help, default and
    bounds give the CLI option (cli/job.py's ``setting_options``).
    """

    chunks_per_task: int = setting(1, "Chunks per task (the unit a trainer leases).", min=1)
    # None: until cancelled
    passes: int | None = setting(1, "Number of passes; 0 or inf runs until cancelled.", min=1)
    worker_ttl: float = setting(
        5.0, "Seconds of silence after which a worker is lost.", min=MIN_SECONDS
    )
    heartbeat_interval: float = setting(
        1.0, "Seconds between a trainer's heartbeats (< ``worker_ttl``).", min=MIN_SECONDS
    )
    # None: no cap
    task_timeout: float | str | None = setting(
        "auto",
        "Cap on one lease's run time: auto (10x p99 once known), none, or seconds.",
    )
    max_failures: int = setting(3, "Failures (fail, timeout) before a task is dead.", min=1)
    max_attempts: int = setting(
        10, "Started leases ending without an ack before a task is dead.", min=1
    )
    shuffle: bool = setting(False, "A seeded new task order every pass.")
    seed: int = setting(0, "The shuffle seed.")
    auto_advance: bool = setting(
        True, "Start the next pass by itself, or wait for `taskq pass next` between passes."
    )
    manual_clock: bool = setting(False, "Tests only: the job's clock moves by advance_clock.")
    # docs/design.md, "Tail splitting": the loop must report the task's size
    split_tails: bool = setting(
        True, "At a pass's tail an idle trainer takes the unread end of a task running long."
    )
    # the permutation is taskq.data.sample_order's, applied by read_task(task) and
    # taskq.torch: what sample i of a task means for every reader (docs/design.md,
    # "Sample order")
    shuffle_samples: bool = setting(
        False,
        "The samples inside each task in a permutation fixed by the seed, the pass and "
        "the task, the same for every reader (else the chunks' order).",
    )
    # off by default: a backup does the task's work twice (docs/trainers.md, "Tails")
    backup_leases: bool = setting(
        False,
        "At a pass's tail an idle trainer may take a backup lease of a task running "
        "longer than ``backup_factor`` x the median (its work done twice; the first ack "
        "wins; docs/trainers.md).",
    )
    backup_factor: float = setting(2.0, "That factor, with ``backup_leases``.", above=1)
    shards: int = setting(
        1,
        "Spread the job over S shards on different cluster masters, one pass "
        "for all (docs/sharding.md).",
        min=1,
    )
    stream: bool = setting(
        False,
        "A job whose data keeps arriving (`taskq job append` / `follow`; no source "
        "needed): its pass stays open until `taskq job seal` (docs/streams.md); "
        "sharded: every shard a stream.",
    )
    # None: no bound
    max_backlog: int | None = setting(
        None,
        "An append that would leave more tasks than this not done waits or is refused "
        "(sharded: divided among the shards).",
        min=1,
    )
    mix: dict[str, float] | None = setting(
        None,
        "A mixed job drawing the tasks of these jobs by weight, e.g. web=0.5,code=0.5 "
        "(no source of its own; its order the weighted schedule; docs/mixing.md).",
    )
    on_exhausted: str = setting(
        "drop",
        "A mixed job's source run out in a pass: drop (the others' weights renormalise) or "
        "cycle (its next pass starts) or stop (the mixed pass ends; docs/mixing.md).",
    )
    mix_by: str = setting(
        "tasks",
        "What a mixed job's weights count: its sources' tasks, or their samples (every "
        "task's size known at create, e.g. parquet rows; docs/mixing.md).",
    )
    max_debt: int = setting(
        0,
        "A mixed job's open stream source with nothing new may owe this many slots (the "
        "others take them, it repays them first) before trainers wait for its feed "
        "(0: wait at once; docs/mixing.md).",
        min=0,
    )

    @classmethod
    def of(cls, config: JobConfig | None = None, **settings: Any) -> JobConfig:
        """``config`` (the defaults when None) with ``settings`` (field names) over it.

        Raises:
            InvalidInput: a setting that is not a field (one line naming it), a
                ``config`` that is not a ``JobConfig``.
        """
        if config is not None and not isinstance(config, cls):
            raise errors.InvalidInput(f"config must be a JobConfig, got {type(config).__name__}")
        unknown = sorted(set(settings) - set(cls.__dataclass_fields__))
        if unknown:
            raise errors.InvalidInput(f"unknown job setting(s): {', '.join(unknown)}")
        return replace(config or cls(), **settings)


@dataclass(eq=False)
class Task:
    """One leased task: an ordered list of chunks, under a lease fenced by ``token``.

    ``revoked`` is set when the server says the lease is no longer this trainer's
    (expired, taken, cancelled); stop work on it, its ack will be rejected as stale.
    ``at_risk`` is set while the trainer has been out of contact with Redis for longer
    than its ttl; the server's answer on reconnect decides.
    """

    id: int
    pass_no: int
    chunks: list[Any]
    token: int
    attempt: int
    job: str = ""
    started: bool = True
    #: the sample index (0-based over the whole task) where reading begins: what earlier
    #: holders of this pass attempt recorded as taken (``Trainer.progress``); 0 for a fresh task
    start: int = 0
    #: where this lease's reading ends (exclusive sample index): None for the task's end;
    #: set when the task was split at a pass's tail (the holder's piece ends at the split
    #: point, the new piece's at the task's end) and moved by the replies to the holder's
    #: progress reports (docs/design.md, "Tail splitting"). Read up to it:
    #: ``read_task(task.chunks, task.start, end=task.current_end)``.
    end: int | None = None
    #: the loop reads this task up to ``end`` as it moves (``current_end`` was asked, or
    #: taskq.torch's loader reads it): only such a task's size goes with its progress, so
    #: only it can be split; a loop that reads to the chunks' end is never split under it
    follows_end: bool = field(default=False, init=False, repr=False)
    #: where its holder's reading actually got, when it knows better than ``end``: the
    #: most progress the loop recorded, or set by taskq.torch before an ack (its readers,
    #: in other processes, may have read past an end learned late); the ack of a split
    #: task's head reports it, which confirms the split or moves its point up
    read_to: int | None = None
    #: what fixes the order of this task's samples (``taskq.data.sample_order``): None, the
    #: chunks' order; else the key of a permutation (the job, its seed, the pass and the
    #: task: the same for every reader of the job). ``task.start`` and ``task.end`` are
    #: positions in that order: read with ``read_task(task)``
    order: str | None = None
    #: the source job a mixed job's task is from (docs/mixing.md); None for other jobs
    source: str | None = None
    # the two Events are made on first use (most tasks never need them; an Event with its
    # Condition and Lock costs more to build than the rest of the task)
    _revoked: threading.Event | None = field(default=None, init=False, repr=False)
    _at_risk: threading.Event | None = field(default=None, init=False, repr=False)

    def _event(self, attr: str) -> threading.Event:
        ev = getattr(self, attr)
        if ev is None:
            with _EVENTS_LOCK:
                ev = getattr(self, attr)
                if ev is None:
                    ev = threading.Event()
                    setattr(self, attr, ev)
        return ev

    @property
    def revoked(self) -> threading.Event:
        """Set when the lease is no longer this trainer's (see the class docstring)."""
        return self._event("_revoked")

    @property
    def at_risk(self) -> threading.Event:
        """Set while the trainer is out of contact for longer than its ttl."""
        return self._event("_at_risk")

    def current_end(self) -> int | None:
        """Where reading stops now (``end`` as the replies move it; None: the task's end).

        Pass it as ``read_task(task.chunks, task.start, end=task.current_end)``: it is
        asked before each sample, and asking it tells the trainer that the loop stops at
        the end, which lets a tail split take this task's unread samples
        (docs/design.md, "Tail splitting").
        """
        self.follows_end = True
        return self.end

    def as_dict(self) -> dict[str, Any]:
        """The task as JSON-able data (what ``taskq work`` passes to its command): its
        range is ``[start, end)`` (``end`` None: the task's end) in its sample ``order``
        (None: the chunks' order; ``taskq.data.sample_order``); ``source`` is a mixed job's
        source job of the task (None for other jobs)."""
        return {
            "job": self.job,
            "id": self.id,
            "pass": self.pass_no,
            "token": self.token,
            "attempt": self.attempt,
            "start": self.start,
            "end": self.end,
            "order": self.order,
            "source": self.source,
            "chunks": self.chunks,
        }


@dataclass(frozen=True)
class AppendResult:
    """What ``append`` did: tasks added (numbered from ``first_task``), chunks skipped
    (their id was appended before), and the backlog after it."""

    tasks: int
    skipped: int
    first_task: int | None
    backlog: int


class SealResult(int):
    """What ``seal`` did: the tasks the stream holds (the int itself), and
    ``already_sealed``: it was sealed before this call, which changed nothing."""

    already_sealed: bool

    def __new__(cls, tasks: int, already_sealed: bool = False) -> SealResult:
        result = super().__new__(cls, tasks)
        result.already_sealed = already_sealed
        return result


@dataclass(frozen=True)
class FollowRecord:
    """A follower's record (``taskq job follow``, docs/streams.md "The follower"): every
    file at or below ``watermark`` (``(mtime, path)``; None before the first) was
    appended; ``files`` are the keys (``path|size|version``) of files above it recorded
    as appended."""

    watermark: tuple[float, str] | None
    files: list[str]


@dataclass
class JobStatus:
    """A read-only snapshot of one job (one pipeline; O(1) in the number of tasks)."""

    job: str
    state: str
    reason: str
    pass_no: int
    passes: int | None
    tasks: int
    todo: int
    leased: int
    done: int
    dead: int
    workers: int
    incarnation: str
    config: dict[str, Any]
    counters: dict[str, int]
    pass_started_ms: int
    created_ms: int
    now_ms: int
    pass_attempt: int = 0
    reserved: int = 0
    summaries: list[dict[str, Any]] = field(default_factory=list)
    histograms: dict[str, dict[str, Any]] = field(default_factory=dict)
    oldest_lease_age_s: float | None = None
    lease_ages: dict[str, int] = field(default_factory=dict)
    #: the training loops' data wait (inputwait_view.summary): totals, recent, worst
    input: dict[str, Any] = field(default_factory=dict)
    #: live tasks not done in this pass (appended or not): what trainers have left
    backlog: int = 0
    #: tasks appended since the create, and whether the job is a stream (None: not one,
    #: "open", "sealed")
    appended: int = 0
    stream: str | None = None
    #: a stream's tasks trimmed behind its watermark (tasks 0 .. trimmed - 1: done, their
    #: descriptors gone; docs/streams.md)
    trimmed: int = 0
    #: how long the oldest task not done has waited (since it was appended or the pass
    #: started, whichever is later); None when every task is done
    oldest_unfinished_age_s: float | None = None

    def as_dict(self) -> dict[str, Any]:
        """The documented status keys (the CLI's ``job status --json`` prints these)."""
        elapsed_s = max(0.0, (self.now_ms - self.pass_started_ms) / 1000.0)
        rate = self.done / elapsed_s if elapsed_s > 0 and self.state == "running" else 0.0
        remaining = self.todo + self.leased
        return {
            "job": self.job,
            "state": self.state,
            "reason": self.reason,
            "pass": self.pass_no,
            "passes": self.passes,
            "pass_attempt": self.pass_attempt,
            "tasks": self.tasks,
            "todo": self.todo,
            "leased": self.leased,
            "reserved": self.reserved,
            "done": self.done,
            "dead": self.dead,
            "workers": self.workers,
            "incarnation": self.incarnation,
            "throughput_per_s": round(rate, 3),
            "eta_s": round(remaining / rate, 1) if rate > 0 else None,
            "oldest_lease_age_s": self.oldest_lease_age_s,
            "backlog": self.backlog,
            "appended": self.appended,
            "trimmed": self.trimmed,
            "stream": self.stream,
            "oldest_unfinished_age_s": self.oldest_unfinished_age_s,
            "config": self.config,
            "counters": self.counters,
            "summaries": self.summaries,
        }
