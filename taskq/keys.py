"""The only place a Redis key string is built.

Every key of one job shares the hash tag ``{job}``, so a job lives in one Redis Cluster
slot. A job script is passed the keys its hot verbs touch, ``SCRIPT_KEYS`` (KEYS, in that
order; ``engine/library.py`` turns them into Lua locals ``K_META`` ...), and makes the
others, ``COLD_KEYS``, from the job's key base when it needs one: every key of the job is
in its slot, so Redis (standalone or Cluster) runs the commands on them as on a declared
key, and the ACL checks each command's keys either way. Each key passed costs ~0.9 k
instructions of a call (bench/HISTORY.md, "the data model's floor"), so Python and Lua
cannot drift apart and the cold ones cost nothing on the hot path.

Data flow: client.py / trainer/core.py / reaper.py / stats.py -> keys.py -> engine/transport.py -> Redis.
"""

from __future__ import annotations

import os
import re

DEFAULT_PREFIX = "taskq"
JOB_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")

#: Job keys, in KEYS order. Names are the Lua local names without the ``K_`` prefix.
JOB_KEYS: tuple[str, ...] = (
    "meta",  # hash: config, state, counters, incarnation, pass, round, cursor, clock
    "chunks",  # hash: task id -> JSON list of chunks (a mixed job's: its copies, by copy id)
    "done",  # bitmap: tasks acked in the current pass attempt
    "dead",  # set: dead task ids (job-wide)
    "deadbits",  # bitmap: the dead set's members as bits (kept with it; a checkpoint copies it)
    "front",  # zset: re-dispatched task ids, leased before the cursor's order
    "leases",  # hash: task id -> current (or just ended) lease record; "b:<task>" a backup's
    "owned",  # zset (lex): "worker|incarnation|task" for every lease held
    "deadlines",  # zset: not written any more (task timeouts run from "started"); a pass
    # end, cancel or delete still removes one an older version left
    "reserved",  # zset: task id -> lease time, for prefetched leases not yet started
    "started",  # zset: task id -> start time (job clock, ms), for lease ages
    "workers",  # zset: "worker|incarnation" -> liveness deadline (job clock, ms)
    "winfo",  # hash: worker id -> "incarnation|ttl_ms|joined_ms|host|pid|drain|digest|conn"
    "waiting",  # zset: "worker|incarnation" -> time it began waiting for work
    "counts",  # hash: "f:<task>" failures, "a:<task>" attempts, "s:<task>" solo, "x:<task>" failer
    "passes",  # hash: "<pass>", "<pass>/r<k>", "<pass>/w<e>" -> JSON summary (bounded in all)
    "passidx",  # zset: summary field of passes -> its sequence (the oldest go first)
    "hist",  # hash: histogram buckets (task duration, re-dispatch lateness)
    "events",  # stream: what happened, trimmed by approximate MAXLEN
    "wake",  # list: one token per task that became leasable, popped by waiters
    "bcast0",  # list: broadcast tokens for even generations (pass/job state changes)
    "bcast1",  # list: broadcast tokens for odd generations
    "clock",  # string: the manual clock (ms), for tests
    "lock",  # string: the reaper's short per-job lock
    "progress",  # hash: task id -> samples its holders recorded as taken (this pass attempt)
    "ckpts",  # zset: checkpoint id -> sequence, the sealed checkpoints (last N kept)
    "ckpt",  # hash: "<id>" -> JSON record, "<id>:d:<k>" done / "<id>:x:<k>" dead bitmap pages,
    # "<id>:p:<k>" progress pages, "<id>:policy" the opaque policy blob it carries (if any);
    # a stream's ":bound" and ":sweep" (lib/cuts.lua)
    "ckprog",  # hash: task id -> progress at an open checkpoint's cut (a COPY, paged into ckpt)
    "appids",  # hash: chunk id given to an append -> the task it went into (duplicates skipped)
    "appidx",  # hash: task id -> JSON list of the chunk ids it was appended with (for the trim)
    "appends",  # zset: the first task of each append -> "first:ms" (when it was appended)
    "follow",  # hash: "path|size|version" of each file `taskq job follow` appended -> chunks
    "mix",  # hash: a mixed job's schedule state, now and as each kept pass was left (lib/mix.lua)
    "mixlog",  # zset: a mixed job's weight log, "<slot>|<seq>|<weights>" scored by slot
    "mixdead",  # set: a mixed job's dead copies (copy ids): dead in every pass until a retry
    "mixahead",  # zset: a mixed job's positions of the state's pass granted past the cursor
    # (a dead slot retried), each scored by itself, within the page charged (lib/mixslot.lua)
    "mixsz",  # hash: a mixed job's copies' sizes in samples, "<source>:<block>" -> '>I4' each
    # of 256 tasks, when its weights count samples (written by the create, read by lib/mix.lua)
    "mixstore",  # zset: a mixed job's stream sources' stores, written by their feed (append.lua):
    # "<source>" scored by its tasks, "<source>:s" by 1 once sealed
    "mixfeed",  # zset: a mixed job's feed log, "<slot>|<seq>|<source>|<tasks>|<sealed>" scored by
    # slot, written by the charge where a store differs from the log (lib/mixfeed.lua)
    "mixrepaid",  # zset: the slots of a mixed job that repaid a stream source's debt, each
    # scored by itself, written by the charge (lib/mixfeed.lua)
    "sources",  # hash: a source given to append (a file) -> its chunks appended, from its start
    "srcseq",  # zset: source -> the sequence of its last append (the oldest go past SOURCES_KEEP)
    "aside",  # zset: task -> task, a stream's tasks below its watermark that keep their records
    # (dead, or dead at a kept checkpoint's cut: trim.lua)
    "appended",  # hash: what appends added, the only job record append writes besides the
    # tasks' (the producer's credential writes no meta field, docs/security.md):
    # APPENDED_FIELDS; the job's tasks are meta's n plus its "tasks" (lib/meta.lua tasks_n)
)

#: The fields of ``appended``, each a count append adds to (a fixed set: bounded): the
#: tasks and chunks appended, the chunks skipped as appended before (their id or source),
#: the sequence of the appends that named a source (``srcseq``'s scores). A job made
#: before the record has these counts in meta (``n``, ``nchunks``, ``c_appended``,
#: ``c_append_dup``): readers add the two (stats.lua).
APPENDED_FIELDS: tuple[str, ...] = ("tasks", "chunks", "dup", "src_seq")

#: The keys no hot verb (lease, ack, heartbeat) touches on its common path: made by the
#: script that needs one (``kc('name')`` in the Lua, engine/library.py), not passed.
COLD_KEYS: tuple[str, ...] = (
    "deadbits",
    "deadlines",
    "passes",
    "passidx",
    "wake",
    "bcast0",
    "bcast1",
    "clock",
    "lock",
    "ckpts",
    "ckpt",
    "ckprog",
    "appids",
    "appidx",
    "appends",
    "follow",
    "mix",
    "mixlog",
    "mixdead",
    "mixahead",
    "mixsz",
    "mixstore",
    "mixfeed",
    "mixrepaid",
    "sources",
    "srcseq",
    "aside",
    "appended",
)
#: The keys a job script is passed, in KEYS order (the others are ``COLD_KEYS``).
SCRIPT_KEYS: tuple[str, ...] = tuple(k for k in JOB_KEYS if k not in COLD_KEYS)

#: A mixed job's stored sequence (engine/lua/lib/mixseq.lua): the copy ids its charge fixed,
#: by position, 10 hex digits each, in blocks of ``MIXSEQ_BLOCK`` positions; block ``b`` of
#: pass ``p`` is the string ``<job's base>:mixseq<p % MIXSEQ_KEEP>.<b>`` (``JobKeys.mixseq_block``),
#: a cold key made from the job's base. Not in ``JOB_KEYS``: a pass fed by an open stream
#: source has as many blocks as it reached (a stream's trim frees those below its watermark),
#: so delete.lua finds them from the mix state, and ``KEY_FAMILIES`` gives their glob (the
#: ACL rules, ``acl_key_patterns``).
MIXSEQ_BLOCK = 65536
MIXSEQ_KEEP = 3
#: The job's keys it has many of, by family name: the glob (after ``<job's base>:``) of
#: their names.
KEY_FAMILIES: dict[str, str] = {"mixseq": "mixseq[012].*"}


class MetaField:
    """The fields of a job's meta hash (KEY ``meta``), the one list of their names.

    Python reads them as ``MetaField.PASS``; the Lua library writes ``F.PASS`` (the field's
    slot in its cache of the hash) or ``N.PASS`` (its name, ``'pass'``), which
    ``engine/library.py`` replaces when it builds the library, refusing a name not here. Counters ``C_*`` are job-wide, ``P_*`` per pass
    attempt.
    """

    INC = "inc"  # job incarnation (random hex, new on every create)
    STATE = "state"  # running | waiting | completed | cancelled
    REASON = "reason"  # why waiting: manual_advance | all_dead | rewinding | ''
    PASS = "pass"  # current pass number
    PASSES = "passes"  # passes to run (-1 = until cancelled)
    ROUND = "round"  # pass attempt id: grows on every pass start / reset / cancel / completion
    N = "n"  # number of tasks made by the create (appended ones: KEY appended's "tasks")
    NCHUNKS = "nchunks"  # number of chunks made by the create (appended: appended's "chunks")
    CPT = "cpt"  # chunks per task
    TTL = "ttl"  # worker liveness ttl (ms)
    HBI = "hbi"  # heartbeat interval (ms)
    TT = "tt"  # task timeout: 'auto' | 'none' | ms
    AUTO_TT = "auto_tt"  # the auto task timeout in force (ms)
    MAXF = "maxf"  # max failures of a task
    MAXA = "maxa"  # max attempts of a task
    SHUFFLE = "shuffle"  # 1: each pass visits the tasks in a seeded permutation; m: mixed
    #: a mixed job's sources (JSON: sources, n, w, on_exhausted; docs/mixing.md)
    MIX = "mix"
    #: a mixed job's stored sequence ends before this slot (pass * n + positions stored:
    #: charged a page ahead, lib/mix.lua); MIXD: the slot the cursor reached when it last
    #: went back or to another pass (between, the cursor says it; lib/mixslot.lua)
    MIXH = "mixh"
    MIXD = "mixd"
    #: on_exhausted=stop: the slot a mixed pass ends before when its charge reached the stop
    #: (pass * n + its length; any other value: the pass is n slots, lib/meta.lua tasks_n)
    MIXE = "mixe"
    #: an open stream source of a mixed job: that job's name (its producers append to the
    #: mixed job with --feed, not to the source: append.lua refuses, docs/mixing.md)
    FEEDS = "feeds"
    SEED = "seed"  # the permutation's seed (mod 65521)
    SEED_FULL = "seed_full"  # the seed as given
    ADVANCE = "advance"  # 1: the next pass starts by itself
    PAUSED = "paused"  # 1: paused (no new leases; pause / resume)
    MCLOCK = "mclock"  # 1: the job runs on the manual clock (tests)
    CURSOR = "cursor"  # position in the pass's order
    NDONE = "ndone"  # tasks acked in this pass attempt
    NLEASED = "nleased"  # leases held
    NRESERVED = "nreserved"  # of which reserved (prefetched, not started)
    OFFSET = "offset"  # silence offset (ms): JNOW = NOW - offset
    SEEN = "seen"  # the job clock at the last call (ms)
    DUE = "due"  # no worker or task deadline is below it (JNOW ms): reclaim's hint
    GEN = "gen"  # broadcast generation
    EVMAX = "evmax"  # approximate MAXLEN of the events stream
    LAST_TOKEN = "last_token"  # the last lease token granted
    FSEQ = "fseq"  # sequence of the front's scores
    ACKED_JOB = "acked_job"  # acks of the job (the auto timeout is recomputed every 20)
    PSTART = "pstart"  # when the pass attempt started (ms)
    CREATED = "created"  # when the job was created (ms)
    LAST_ACK = "last_ack"  # when the last ack came (ms)
    LAST_PASS_MS = "last_pass_ms"  # how long the last finished pass took (ms)
    C_LEASED = "c_leased"
    C_ACKED = "c_acked"
    C_FAILED = "c_failed"
    C_RELEASED = "c_released"
    C_EXP_WL = "c_exp_wl"  # expired: worker lost
    C_EXP_TT = "c_exp_tt"  # expired: task timeout
    C_STALE = "c_stale"
    C_DEAD = "c_dead"
    C_STOLEN = "c_stolen"
    C_REVOKED = "c_revoked"
    C_FORGED = "c_forged"  # writes with a lease's token (or a worker's name), not its secret
    P_STALE = "p_stale"
    P_SKIPPED = "p_skipped"
    P_RESETS = "p_resets"
    P_MAXLATE = "p_maxlate"  # largest re-dispatch lateness (ms)
    P_LEASED = "p_leased"
    P_EXPIRED = "p_expired"
    P_RESUMED = "p_resumed"  # leases granted past sample 0 (a task resumed from its progress)
    P_RESUMED_S = "p_resumed_s"  # samples those leases skipped (their starts, summed)
    P_REREAD = "p_reread"  # samples reported by holders after their lease ended (re-read)
    CK_SEQ = "ck_seq"  # sequence of checkpoints
    CK_OPEN = "ck_open"  # the checkpoint being written ('' = none)
    SUM_SEQ = "sum_seq"  # sequence of pass summaries (passidx scores)
    RW_OPEN = "rw_open"  # the checkpoint a rewind in progress goes back to ('' = none)
    RW_EPOCH = "rw_epoch"  # grows on every rewind start: fences a superseded rewind's pages
    RW_LAST = "rw_last"  # the checkpoint of the last rewind that completed
    RW_ACKS = "rw_acks"  # acked_job when that rewind completed (repeat detection)
    RW_PLAN = "rw_plan"  # the rewind's pages per step (page,dead,todo,walk,mark)
    RW_STEP = "rw_step"  # the rewind's pages done so far, in the plan's order
    RW_KEY = "rw_key"  # the restore key of the last rewind begun ('' = none given)
    BACKUP_K = "backup_k"  # backup leases: after k x the median task time (0 = off)
    C_BACKUPS = "c_backups"  # backup leases granted
    DUR_MED = "dur_med"  # the job's median task time (us), a streaming estimate
    P_BACKUPS = "p_backups"  # backup leases and split pieces granted this pass attempt
    PN = "pn"  # tasks in the pass's own order (its start's tasks); appended ones come after it
    STREAM = "stream"  # '' not a stream | open (the pass does not end) | sealed
    MAX_BACKLOG = "max_backlog"  # an append past it (tasks not done) is refused (0 = none)
    #: A job made before KEY appended: its appends' counts (readers add appended's), never
    #: written any more (APPENDED_FIELDS)
    C_APPENDED = "c_appended"
    C_APPEND_DUP = "c_append_dup"
    SRC_SEQ = "src_seq"
    TRIM_W = "trim_w"  # a stream's watermark: tasks below it are finished and trimmed (trim.lua)
    ASIDE_AT = "aside_at"  # the task of `aside` trim looked at last (it goes on after it)
    SPLIT = "split_tails"  # tail splitting: '0' off, else on (lib/split.lua)
    #: worker incarnations registered as range readers (lib/workers.lua reads_of 'r' or
    #: 's') and not removed yet: with none, a whole-task reader takes a head piece whole
    RANGERS = "rangers"
    #: the order of a task's samples: '' or absent the chunks' order, 'shuffled' a
    #: permutation fixed by the job's seed, the pass and the task (taskq.data.sample_order;
    #: applied by the readers, never by a script: register hands it to the trainers)
    SORDER = "sorder"
    C_SPLITS = "c_splits"  # tasks split (a piece granted to an idle trainer)
    #: The round the pass attempt's pieces (lib/pieces.lua) are recorded under when it is
    #: not the current one: set by the job's completion (its new round fences the leases,
    #: while the completed attempt's pieces stand for a retry that reopens it); '' or
    #: absent: the current round. Cleared by a pass start, a reset and a rewind.
    SROUND = "sround"
    #: The histograms' sums (ms; the hist hash keeps only their buckets, a count being the
    #: buckets' sum): written with the meta the call writes anyway, not one HINCRBY per
    #: ack. A job created before them also has ``dur:sum`` / ``late:sum`` in ``hist``, frozen
    #: there; readers add the two (stats.histogram).
    DUR_SUM = "dur_sum"
    LATE_SUM = "late_sum"
    #: The size of the waiting set (ZADD / ZREM answer what they changed): a worker that got
    #: tasks leaves the set only when the set is not empty (absent in a job created before
    #: the field: counted once, then kept).
    NWAITING = "nwaiting"
    #: The training loops' data wait (inputwait.py, sent with the heartbeats; written by
    #: the heartbeat script): ``iw`` the job's totals "n,wait_us,step_us,<bucket counts>",
    #: ``iw_win`` the current and previous 60 s windows "start_ms,<the same>|<previous>",
    #: ``iw_worst`` the (at most 3) trainers waiting most over their last minute
    #: "worker|ppm|at_ms|..." (ppm of their loop time).
    IW = "iw"
    IW_WIN = "iw_win"
    IW_WORST = "iw_worst"
    #: 80 bytes of padding, longer than Redis's hash-max-listpack-value (64 by default): the
    #: meta hash stays in the hashtable encoding, where each of a call's ~30 field reads is
    #: O(1) instead of a scan of the listpack's ~60 fields (bench/HISTORY.md)
    ENC = "enc"


#: ``MetaField``'s attributes: Lua's ``F.NAME`` -> the field's name.
META_FIELDS: dict[str, str] = {
    name: value for name, value in vars(MetaField).items() if name.isupper()
}


def prefix() -> str:
    """The key prefix, from ``TASKQ_PREFIX`` (default ``taskq``)."""
    return os.environ.get("TASKQ_PREFIX", DEFAULT_PREFIX)


def valid_job_name(name: str) -> bool:
    """True when ``name`` matches ``[A-Za-z0-9._-]{1,64}``."""
    return isinstance(name, str) and bool(JOB_NAME_RE.match(name))


class JobKeys:
    """All key strings of one job, computed once.

    Args:
        job: the job name (validated by the caller).
        key_prefix: overrides ``TASKQ_PREFIX``.
    """

    def __init__(self, job: str, key_prefix: str | None = None) -> None:
        self.job = job
        self.prefix = key_prefix or prefix()
        self.base = f"{self.prefix}:{{{job}}}"
        self.all: list[str] = [f"{self.base}:{name}" for name in JOB_KEYS]
        #: the KEYS of a job script (``SCRIPT_KEYS``)
        self.script: list[str] = [f"{self.base}:{name}" for name in SCRIPT_KEYS]
        #: the same, encoded once (redis-py passes bytes through without encoding them)
        self.script_bytes: list[bytes] = [k.encode() for k in self.script]
        for name, key in zip(JOB_KEYS, self.all, strict=True):
            setattr(self, name, key)

    def mixseq_block(self, pass_no: int, block: int) -> str:
        """Block ``block`` of pass ``pass_no``'s stored sequence (``MIXSEQ_BLOCK`` positions
        from ``block * MIXSEQ_BLOCK``), a mixed job's."""
        return f"{self.base}:mixseq{pass_no % MIXSEQ_KEEP}.{block}"

    def staging_chunks(self, incarnation: str) -> str:
        """The staging hash a create writes before the flip makes it live."""
        return f"{self.base}:staging:{incarnation}"

    def staging_sizes(self, incarnation: str) -> str:
        """The staging string of a mixed job's tasks' sizes (``mixsz``) a create writes
        before the flip when its weights count samples."""
        return f"{self.base}:staging:{incarnation}:sz"

    def __getattr__(self, name: str) -> str:  # for mypy: attributes set in __init__
        raise AttributeError(name)


def jobs_index(key_prefix: str | None = None) -> str:
    """The set of job names (outside the jobs' slots; repairable from the meta keys)."""
    return f"{key_prefix or prefix()}:jobs"


def meta_pattern(key_prefix: str | None = None) -> str:
    """A SCAN pattern matching every job's meta hash (used to repair the index)."""
    return f"{key_prefix or prefix()}:{{*}}:meta"


def job_from_meta_key(key: str, key_prefix: str | None = None) -> str | None:
    """The job name inside a meta key, or None when the key is not one of ours."""
    p = re.escape(key_prefix or prefix())
    m = re.match(rf"^{p}:\{{([A-Za-z0-9._-]{{1,64}})\}}:meta$", key)
    return m.group(1) if m else None


#: Characters a Redis glob gives a meaning to (escaped in ACL key patterns).
_GLOB_SPECIAL_RE = re.compile(r"([*?\[\]\\])")


def _glob_escape(text: str) -> str:
    return _GLOB_SPECIAL_RE.sub(r"\\\1", text)


def acl_key_patterns(
    job: str | None, names: tuple[str, ...] | None = None, key_prefix: str | None = None
) -> list[str]:
    """Redis glob patterns (for ACL ``~pattern`` rules) of one job's keys, or every job's.

    Args:
        job: the job; None for every job (``{*}``: a job name holds no ``{``, ``}`` or
            ``:``, so the tag cannot reach into another key's).
        names: the keys of ``JOB_KEYS`` (or families of ``KEY_FAMILIES``) to match; None
            for every key of the job (the staging hashes of a create too).
        key_prefix: overrides ``TASKQ_PREFIX``.

    Returns:
        The patterns, in ``JOB_KEYS`` order, then the families' (one ``...:*`` pattern
        when ``names`` is None).

    Raises:
        ValueError: a name that is neither in ``JOB_KEYS`` nor in ``KEY_FAMILIES``.
    """
    tag = "{*}" if job is None else "{" + _glob_escape(job) + "}"
    base = f"{_glob_escape(key_prefix or prefix())}:{tag}"
    if names is None:
        return [f"{base}:*"]
    unknown = set(names) - set(JOB_KEYS) - set(KEY_FAMILIES)
    if unknown:
        raise ValueError(f"not job keys: {sorted(unknown)}")
    return [f"{base}:{name}" for name in JOB_KEYS if name in names] + [
        f"{base}:{glob}" for name, glob in KEY_FAMILIES.items() if name in names
    ]


def acl_jobs_index_pattern(key_prefix: str | None = None) -> str:
    """The jobs index as an ACL key pattern (glob characters of the prefix escaped)."""
    return _glob_escape(jobs_index(key_prefix))


# -- sharded jobs (taskq/admin/jobs.py, shardset.py) -------------------------------------------------------
#: Longest name a sharded job may have: its shards are ``NAME.s<k>[.<t>]`` (<= 64).
MAX_SHARDED_NAME = 52


def shard_name(job: str, index: int, attempt: int = 0) -> str:
    """The name of shard ``index`` of sharded job ``job``: ``job.s<index>``, or
    ``job.s<index>.<attempt>`` when placement had to try another hash tag (the shard's
    name is its hash tag, so its slot and master follow from it)."""
    return f"{job}.s{index}" if attempt == 0 else f"{job}.s{index}.{attempt}"


def shard_set_key(job: str, key_prefix: str | None = None) -> str:
    """The hash recording a sharded job's shard set (its shards' names, sizes, how it
    advances). Under the tag ``{job}``, so one job's ACL patterns cover it; no plain job
    of that name exists beside it."""
    return f"{key_prefix or prefix()}:{{{job}}}:shards"


def barrier_key(job: str, key_prefix: str | None = None) -> str:
    """A sharded job's barrier lock (a string, ``SET NX PX``): held by the barrier step
    while it moves the shards' passes, and by a checkpoint or rewind while it takes or
    restores its cut, so that the passes cannot move under it. Under the tag ``{job}``,
    beside the shard-set record."""
    return f"{key_prefix or prefix()}:{{{job}}}:barrier"


def shard_sets_index(key_prefix: str | None = None) -> str:
    """The set of sharded job names (outside every slot, like the jobs index)."""
    return f"{key_prefix or prefix()}:shardsets"


def acl_shard_sets_pattern(key_prefix: str | None = None) -> str:
    """The sharded jobs' index as an ACL key pattern (an exporter of every job reads it
    to show a sharded job as one)."""
    return _glob_escape(shard_sets_index(key_prefix))
