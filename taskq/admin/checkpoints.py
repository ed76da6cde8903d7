"""Checkpoints of a job's position, and rewinding a job to one.

A checkpoint is one consistent cut of a job, taken in one call (``checkpoint.lua``
``begin``): its pass, round and cursor, the done set and the dead set (their bitmaps,
copied at once: N / 8 bytes each), the progress of its unfinished tasks (a COPY of the
progress hash into a scratch hash), the counters. It is never refused for what the job
is doing (a pass starting or ending, trainers leasing and acking): the calls after the
cut only page the scratch hash into the checkpoint and seal it. A rewind
(``rewind.lua``) restores the cut and derives the rest: the tasks given out before the
cut's cursor and neither done nor dead then go to the front, the cursor gives the others.
It runs in bounded steps fenced by a rewind epoch: a rewind superseded by another stops at
its next call, and repeating a rewind finishes a half-done one. Semantics: docs/design.md
("Progress, checkpoints, rewind") and docs/resume.md.

Data flow: the job handle (jobs.py: checkpoint / rewind / checkpoints) -> checkpoints.py -> engine/transport.py
(checkpoint.lua, rewind.lua) -> Redis; the torch loader's state_dict names a checkpoint.
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

from redis.client import NEVER_DECODE

from taskq import errors
from taskq.admin import stats
from taskq.engine.connection import Connection, translate
from taskq.engine.contract import POLICY_MAX, Code
from taskq.keys import valid_job_name

DEFAULT_KEEP = 20


def new_id() -> str:
    """A checkpoint id: the UTC time to the millisecond, then 4 random hex digits."""
    ms = int(time.time() * 1000)
    return (
        time.strftime("%Y%m%dT%H%M%S", time.gmtime(ms / 1000))
        + f".{ms % 1000:03d}-"
        + secrets.token_hex(2)
    )


def _check(job: str, ckpt: str) -> None:
    if not valid_job_name(ckpt):
        raise errors.InvalidInput(
            f"job {job!r}: bad checkpoint id {ckpt!r}: use 1-64 of A-Z a-z 0-9 . _ -"
        )


def checkpoint(
    conn: Connection,
    job: str,
    keep: int = DEFAULT_KEEP,
    ckpt: str | None = None,
    policy: bytes | None = None,
) -> dict[str, Any]:
    """Record ``job``'s position under a new checkpoint id.

    The position is one cut, taken in one call at any moment of a pass (its start, its
    end, while trainers lease and ack); the calls after it only copy what it took.

    Args:
        conn: the connection (a ``taskq.Client`` is one too).
        job: the job name.
        keep: how many sealed checkpoints of the job to keep (the oldest go), 1-1000.
        ckpt: the id to use (default: a new time-ordered one); an id already sealed is
            returned as it is.
        policy: an opaque blob of up to ``POLICY_MAX`` (64 KiB) bytes kept with the
            checkpoint, e.g. an online mixing policy's state (docs/mixing.md); read back
            by ``policy_of``.

    Returns:
        The checkpoint's record (``checkpoints()`` lists the same dicts).

    Raises:
        InvalidInput: bad keep or id. JobNotFound, JobCancelled. TaskqError: a rewind is
            in progress, or a newer checkpoint of the job started meanwhile.
    """
    if not isinstance(keep, int) or isinstance(keep, bool) or not 1 <= keep <= 1000:
        raise errors.InvalidInput(f"keep must be an integer 1-1000, got {keep!r}")
    if policy is not None and (not isinstance(policy, bytes) or len(policy) > POLICY_MAX):
        raise errors.InvalidInput(
            f"job {job!r}: policy must be bytes, at most {POLICY_MAX} of them, got "
            f"{type(policy).__name__}{f' of {len(policy)}' if isinstance(policy, bytes) else ''}"
        )
    ckpt = ckpt or new_id()
    _check(job, ckpt)
    reply = conn.run(job, "checkpoint", ["", ckpt, "begin", keep, *([policy] if policy else [])])
    code = int(reply[0])
    if code == Code.LOCKED:
        raise errors.TaskqError(f"job {job!r}: a rewind is in progress; checkpoint after it")
    if code == Code.DUP:
        return get(conn, job, ckpt)
    k, cursor = 0, "0"
    while True:
        r = _step(conn, job, ckpt, "checkpoint", ["prog", k, cursor])
        cursor = r[1].decode() if isinstance(r[1], bytes) else str(r[1])
        k += 1
        if cursor == "0":
            break
    _step(conn, job, ckpt, "checkpoint", ["seal", keep])
    return get(conn, job, ckpt)


def _step(conn: Connection, job: str, ckpt: str, verb: str, step: list[Any]) -> Any:
    reply = conn.run(job, verb, ["", ckpt, *step])
    code = int(reply[0])
    if code == Code.STALE:
        what = "checkpoint" if verb == "checkpoint" else "rewind"
        raise errors.TaskqError(f"job {job!r}: {what} {ckpt} was superseded by a newer one")
    if code != Code.OK:
        raise errors.TaskqError(f"job {job!r}: {verb} {ckpt} {step[0]}: code {code}")
    return reply


def _decode(raw: Any) -> dict[str, Any]:
    rec: dict[str, Any] = json.loads(raw)
    if "n" in rec:
        rec["tasks"] = rec["n"]  # the append position: the tasks the job had at the cut
    scratch = ("todo_done", "ppages", "pages", "xpages", "cursor", "pstart", "sum_seq", "n", "pn")
    for k in scratch:
        rec.pop(k, None)
    return rec


def get(conn: Connection, job: str, ckpt: str) -> dict[str, Any]:
    """One sealed checkpoint's record.

    Raises:
        InvalidInput: no sealed checkpoint ``ckpt`` (never made, unfinished, or dropped).
        JobNotFound: no such job.
    """
    _check(job, ckpt)
    keys = conn.keys(job)
    with translate(conn.url, keys, conn.redis):
        exists, raw = conn.redis.exists(keys.meta), conn.redis.hget(keys.ckpt, ckpt)
    if not exists:
        raise errors.JobNotFound(f"job {job!r} not found (deleted or replaced)")
    if raw is None or json.loads(raw).get("state") != "sealed":
        raise errors.InvalidInput(
            f"job {job!r}: no checkpoint {ckpt!r} (see `taskq job checkpoints {job}`)"
        )
    return _decode(raw)


def policy_of(conn: Connection, job: str, ckpt: str) -> bytes | None:
    """The policy blob sealed checkpoint ``ckpt`` carries (``checkpoint(policy=...)``),
    or None.

    Raises:
        InvalidInput: no sealed checkpoint ``ckpt``. JobNotFound.
    """
    rec = get(conn, job, ckpt)
    if not rec.get("policy"):
        return None
    keys = conn.keys(job)
    with translate(conn.url, keys, conn.redis):
        raw = conn.redis.execute_command(
            "HGET", keys.ckpt, f"{ckpt}:policy", **{NEVER_DECODE: True}
        )
    return None if raw is None else bytes(raw)


def listing(conn: Connection, job: str) -> list[dict[str, Any]]:
    """The job's sealed checkpoints, oldest first (at most ``keep`` of them).

    Raises:
        JobNotFound: no such job.
    """
    keys = conn.keys(job)
    with translate(conn.url, keys, conn.redis):
        pipe = conn.redis.pipeline(transaction=False)
        pipe.exists(keys.meta)
        pipe.zrange(keys.ckpts, 0, -1)
        exists, ids = pipe.execute()
        if not exists:
            raise errors.JobNotFound(f"job {job!r} not found (deleted or replaced)")
        raws = conn.redis.hmget(keys.ckpt, ids) if ids else []
    return [_decode(r) for r in raws if r is not None]


def rewind(
    conn: Connection, job: str, ckpt: str | dict[str, Any], once: bool = False, key: str = ""
) -> bool:
    """Put ``job`` back to checkpoint ``ckpt``.

    The checkpoint's cut comes back (its pass and cursor, done set, dead set) and the rest
    is derived from it: every live task not done then and given out before its cursor goes
    to the front with its progress, tasks dead then are dead again and tasks live then
    live again (with their failure counts cleared). Every lease held now is revoked (late
    acks are stale); the attempt running now and the passes ended after the checkpoint
    are undone, their summaries kept, marked ``rewound``. Works on a completed job;
    repeating it is safe.

    Args:
        conn: the connection (a ``taskq.Client`` is one too).
        job: the job name.
        ckpt: a sealed checkpoint of the job: its id, or the record ``checkpoint()``
            returned.
        once: do nothing when the last completed rewind of the job went to ``ckpt`` and
            (with ``key``) was made under the same key, or (without) no task was acked
            since: what restarted trainers loading one state ask for.
        key: with ``once``, what identifies one restart of the trainers (torchrun:
            ``f"{TORCHELASTIC_RUN_ID}:{TORCHELASTIC_RESTART_COUNT}"``), up to 200 chars.

    Returns:
        True when the job was rewound, False when ``once`` found it already there.

    Raises:
        InvalidInput: no such checkpoint. JobNotFound, JobCancelled. TaskqError: another
            rewind took over meanwhile (it finishes the job's rewind).
    """
    if isinstance(ckpt, dict):
        ckpt = ckpt.get("id")  # type: ignore[assignment]
    if not isinstance(ckpt, str):
        raise errors.InvalidInput(
            f"job {job!r}: rewind takes a checkpoint id or the record checkpoint() returned, "
            f"got {ckpt!r}"
        )
    if not isinstance(key, str) or len(key) > 200:
        raise errors.InvalidInput(f"rewind key must be a string of at most 200 chars, got {key!r}")
    get(conn, job, ckpt)  # a readable error for an unknown id
    reply = conn.run(job, "rewind", ["", ckpt, "begin", int(once), key])
    code = int(reply[0])
    if code == Code.DUP:
        return False
    if code != Code.OK:
        raise errors.TaskqError(f"job {job!r}: rewind {ckpt}: code {code}")
    epoch = int(reply[1])
    # the plan's steps in its order: the done and dead pages, the progress pages, the
    # walk that puts what was unfinished at the cut in the front, the summaries' marks
    for step, pages in zip(_REWIND_STEPS, reply[2:7], strict=True):
        for k in range(int(pages)):
            _step(conn, job, ckpt, "rewind", [step, k, epoch])
    _step(conn, job, ckpt, "rewind", ["seal", 0, epoch])
    return True


_REWIND_STEPS = ("page", "dead", "todo", "walk", "mark")


def state_of(job: str, record: dict[str, Any]) -> dict[str, Any]:
    """The small dict a data loader's ``state_dict()`` returns for a checkpoint.

    Args:
        job: the job name.
        record: what ``checkpoint()`` returned.

    Returns:
        ``{"job", "checkpoint", "incarnation", "pass", "done"}`` (JSON-able; ``restore``
        reads it back).
    """
    return {
        "job": job,
        "checkpoint": record["id"],
        "incarnation": record.get("incarnation"),
        "pass": record["pass"],
        "done": record["done"],
    }


def restore(conn: Connection, state: dict[str, Any], key: str = "") -> bool:
    """Rewind the job a loader state names to its checkpoint, once: what every restarted
    trainer (and DataLoader worker) loading the same state calls; the first one rewinds,
    the others find the job already there (``rewind(..., once=True)``).

    Args:
        conn: the connection (a ``taskq.Client`` is one too).
        state: a dict made by ``state_of``.
        key: what identifies this restart of the trainers (see ``rewind``); without it, a
            trainer that loads the state after another one already acked work rewinds
            again.

    Returns:
        True when this call rewound the job, False when it was already there.

    Raises:
        InvalidInput: not such a dict, or a state of another incarnation of the job (it
            was created again since: its checkpoints are gone).
        JobNotFound, JobCancelled.
    """
    if (
        not isinstance(state, dict)
        or not isinstance(state.get("job"), str)
        or not isinstance(state.get("checkpoint"), str)
    ):
        raise errors.InvalidInput(f"not a taskq loader state: {state!r}")
    job, ckpt = state["job"], state["checkpoint"]
    inc = state.get("incarnation")
    if inc and _incarnation(conn, job) != inc:
        raise errors.InvalidInput(
            f"job {job!r}: the state names checkpoint {ckpt} of an earlier incarnation of the "
            f"job (it was created again since); its position cannot be restored"
        )
    return rewind(conn, job, ckpt, once=True, key=key)


def _incarnation(conn: Connection, job: str) -> str:
    with translate(conn.url, conn.keys(job), conn.redis):
        return str(stats.snapshot(conn, job, summaries=0).incarnation)
