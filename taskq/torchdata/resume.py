"""Checkpoints of a ``taskq.torch.DataLoader``: ``state_dict()`` and ``load_state_dict()``.

``state_dict`` has the feeder thread (the only one that calls the trainer) ack what the
loop took, send the progress it recorded and call ``Client.checkpoint``; the returned
``taskq.admin.checkpoints.state_of`` dict goes into the model's checkpoint. ``load_state_dict``
in a restarted trainer rewinds the job through its handle (``client.job(name).rewind``,
plain or sharded, ``once`` with a key naming the restart), so the job is rewound once
however many trainers load the same state (docs/resume.md).

Data flow: training loop -> loader.py -> resume.py -> feeder.py (trainer/core.py) or
client.py -> jobs.py (the job) -> checkpoints.py -> Redis.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from taskq import errors
from taskq.admin import checkpoints

from .dataset import TaskDataset

if TYPE_CHECKING:
    from taskq.admin.client import Client

    from .host import ResumeHost

log = logging.getLogger("taskq.torch")


def restart_key() -> str:
    """The key naming this launch of the trainers for ``load_state_dict``: unique per
    launch and the same on every rank of it.

    With a ``torch.distributed`` process group, rank 0 makes one (torchrun's run id and
    restart count, for the reader, and 16 random hex digits, since plain ``torchrun``
    relaunches all have ``TORCHELASTIC_RUN_ID=none`` and ``TORCHELASTIC_RESTART_COUNT=0``)
    and broadcasts it: a collective call, which every rank makes. Outside torchrun and
    without a process group: "" (see ``load_state_dict``).

    Returns:
        The key ("" outside torchrun with no process group).

    Raises:
        InvalidInput: under torchrun with no process group initialized: no key can be
            agreed on (torchrun's own variables are the same on every launch); call
            ``init_process_group`` first or pass ``key=``.
    """
    dist = _dist()
    if dist is not None:
        made = [_new_key() if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(made, src=0)
        return str(made[0])
    if os.environ.get("TORCHELASTIC_RUN_ID") is not None:
        raise errors.InvalidInput(
            "load_state_dict under torchrun needs a key naming this launch, the same on "
            "every rank: call it after torch.distributed.init_process_group (rank 0 then "
            "makes one and broadcasts it), or pass key= (say, your scheduler's id of this "
            "attempt). torchrun's TORCHELASTIC_RUN_ID and TORCHELASTIC_RESTART_COUNT are "
            f"{os.environ.get('TORCHELASTIC_RUN_ID')!r} and "
            f"{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')!r} on every launch without "
            "--rdzv-id, so they cannot tell two launches apart"
        )
    return ""


def _new_key() -> str:
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "")
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return f"{run_id[:100]}:{restart[:20]}:{secrets.token_hex(8)}"


def _dist() -> Any:
    """``torch.distributed`` when a default process group is initialized, else None."""
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch without distributed
        return None
    if not dist.is_available() or not dist.is_initialized():
        return None
    return dist


def state_dict(loader: ResumeHost, ckpt: str | None = None) -> dict[str, Any]:
    """Checkpoint the job's position and name it.

    With ``DataLoader(collective=True)`` and a ``torch.distributed`` process group of
    more than one rank it is a collective call (Lightning, accelerate and the HF Trainer
    ask every rank for its loader's state): every rank sends what its loop took, all
    meet at a barrier, rank 0 checkpoints and every rank returns its state (or raises
    its error), so the checkpoint holds every rank's progress to the step.

    What the loop took so far counts (the batch just handed out included): its tasks are
    acked and the progress sent first (with ``acks="commit"``: committed), then ``Client.checkpoint`` records the pass, the
    done set and every unfinished task's progress. Other trainers' progress counts as of
    their last heartbeat: data-parallel ranks call ``loader.sync()`` before the one that
    checkpoints calls this (docs/torch.md).

    Args:
        loader: the loader.
        ckpt: the checkpoint's id (default: a new time-ordered one).

    Returns:
        ``taskq.admin.checkpoints.state_of(job, record)``: ``{"job", "checkpoint",
        "incarnation", "pass", "done"}``, JSON-able.

    Raises:
        InvalidInput, JobNotFound, JobCancelled, ConnectionLost.
    """
    dist = _dist() if loader.collective else None
    if dist is None or dist.get_world_size() == 1:
        return _own_state(loader, ckpt)
    loader.sync()
    dist.barrier()
    outcome: list[Any] = [None]
    if dist.get_rank() == 0:
        try:
            outcome[0] = _own_state(loader, ckpt)
        except errors.TaskqError as e:
            outcome[0] = e
            dist.broadcast_object_list(outcome, src=0)
            raise
    dist.broadcast_object_list(outcome, src=0)
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return dict(outcome[0])


def _own_state(loader: ResumeHost, ckpt: str | None) -> dict[str, Any]:
    """This loader's checkpoint: what its loop took is sent first."""
    ds: TaskDataset = loader.dataset  # type: ignore[assignment]
    if loader.acks == "commit":
        loader.commit()  # the checkpoint is where the loop's position is committed
    cur = loader.current
    record: dict[str, Any] | None = None
    if cur is not None and not cur.ended and cur.feeder.is_alive():
        cur.settle()
        try:
            feeder = cur.feeder
            record = feeder.call(lambda trainer: feeder.client.job(ds.job).checkpoint(ckpt=ckpt))
        except errors.TaskqError as e:
            if cur.feeder.is_alive():
                raise
            # the iteration ended meanwhile: its acks and progress were sent at its end
            log.debug("the iteration ended during state_dict: %s", e)
    if record is None:
        with client_of(ds) as client:
            record = client.job(ds.job).checkpoint(ckpt=ckpt)
    return checkpoints.state_of(ds.job, record)


def load_state_dict(loader: ResumeHost, state: dict[str, Any], key: str | None = None) -> bool:
    """Put the job back to the checkpoint ``state`` names, once per restart: every
    restarted trainer calls it (whatever their number and their DataLoader workers');
    the first one rewinds the job, the others find it there. A running iteration of the
    loader is ended first (the rewind revokes its leases anyway).

    Args:
        loader: the loader.
        state: what ``state_dict()`` returned.
        key: what names this restart of the trainers; default ``restart_key()``: with
            a process group, one made by rank 0 and broadcast (every rank must call);
            under torchrun without one, refused; else "" (then a trainer loading the
            state after others acked work rewinds again).

    With a ``torch.distributed`` process group it is a collective call: rank 0 makes the
    key and rewinds, every rank returns once it did (raising its error if it failed).

    Returns:
        True when this call rewound the job.

    Raises:
        InvalidInput: not a loader state, or one of an earlier incarnation of the job;
            under torchrun, no key given and no process group to agree on one.
        JobNotFound, JobCancelled, ConnectionLost.
    """
    if key is None:
        key = restart_key()
    loader.end_current(forget_pass=True)  # the next iteration asks the job its pass
    ds: TaskDataset = loader.dataset  # type: ignore[assignment]
    dist = _dist()
    if dist is None:
        with client_of(ds) as client:
            return restore(client, state, key=key)
    # rank 0 rewinds, the others wait for its outcome: no rank reads before the job is
    # rewound (a lease taken before is revoked by the rewind: what the loop took of it
    # would come again), and two ranks' rewinds cannot supersede each other
    outcome: list[Any] = [None]
    if dist.get_rank() == 0:
        try:
            with client_of(ds) as client:
                outcome[0] = restore(client, state, key=key)
        except errors.TaskqError as e:
            outcome[0] = e
            dist.broadcast_object_list(outcome, src=0)
            raise
    dist.broadcast_object_list(outcome, src=0)
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return bool(outcome[0]) and dist.get_rank() == 0


def restore(client: Client, state: dict[str, Any], key: str = "") -> bool:
    """Rewind the job a loader state names to its checkpoint, once, through the job's
    handle (``client.job(name)``: a plain job, or every shard of a sharded one to the
    same cut): the first restarted trainer rewinds, the others find the job there.

    Args:
        client: the admin client.
        state: a dict made by ``state_dict`` (``checkpoints.state_of``).
        key: names this restart of the trainers (``Client.rewind``'s ``key``).

    Returns:
        True when this call rewound the job, False when it was already there.

    Raises:
        InvalidInput: not such a dict, or a state of another incarnation of the job.
        JobNotFound, JobCancelled.
    """
    if (
        not isinstance(state, dict)
        or not isinstance(state.get("job"), str)
        or not isinstance(state.get("checkpoint"), str)
    ):
        raise errors.InvalidInput(f"not a taskq loader state: {state!r}")
    job, ckpt = state["job"], state["checkpoint"]
    handle = client.job(job)
    inc = state.get("incarnation")
    if inc and handle.status(summaries=0).incarnation != inc:
        raise errors.InvalidInput(
            f"job {job!r}: the state names checkpoint {ckpt} of an earlier incarnation of the "
            f"job (it was created again since); its position cannot be restored"
        )
    return handle.rewind(ckpt, once=True, key=key)


@contextlib.contextmanager
def client_of(ds: TaskDataset) -> Iterator[Any]:
    """The dataset's client, or one of our own closed afterwards."""
    if ds.client is not None:
        yield ds.client
        return
    from taskq.admin.client import Client

    client = Client(ds.url)
    try:
        yield client
    finally:
        client.redis.close()
