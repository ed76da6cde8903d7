"""Checkpoints of a ``taskq.torch.DataLoader``: ``state_dict()`` and ``load_state_dict()``.

``state_dict`` has the feeder thread (the only one that calls the trainer) ack what the
loop took, send the progress it recorded and call ``Client.checkpoint``; the returned
``taskq.checkpoints.state_of`` dict goes into the model's checkpoint. ``load_state_dict``
in a restarted trainer calls ``taskq.checkpoints.restore`` with a key naming the restart,
so the job is rewound once however many trainers load the same state (docs/resume.md).

Data flow: training loop -> loader.py -> resume.py -> feeder.py (trainer.py) or
client.py -> checkpoints.py -> Redis.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .. import checkpoints, errors
from .dataset import TaskDataset

if TYPE_CHECKING:
    from .loader import DataLoader

log = logging.getLogger("taskq.torch")


def restart_key() -> str:
    """torchrun's name for this restart of the trainers, "" outside torchrun.

    Returns:
        ``f"{TORCHELASTIC_RUN_ID}:{TORCHELASTIC_RESTART_COUNT}"`` when the run id is set.
    """
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if not run_id:
        return ""
    return f"{run_id}:{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def state_dict(loader: DataLoader, ckpt: str | None = None) -> dict[str, Any]:
    """Checkpoint the job's position and name it.

    What the loop took so far counts (the batch just handed out included): its tasks are
    acked and the progress sent first (with ``acks="commit"``: committed), then ``Client.checkpoint`` records the pass, the
    done set and every unfinished task's progress. Other trainers' progress counts as of
    their last heartbeat: data-parallel ranks call ``loader.sync()`` before the one that
    checkpoints calls this (docs/torch.md).

    Args:
        loader: the loader.
        ckpt: the checkpoint's id (default: a new time-ordered one).

    Returns:
        ``taskq.checkpoints.state_of(job, record)``: ``{"job", "checkpoint",
        "incarnation", "pass", "done"}``, JSON-able.

    Raises:
        InvalidInput, JobNotFound, JobCancelled, ConnectionLost.
    """
    ds: TaskDataset = loader.dataset  # type: ignore[assignment]
    if loader.acks == "commit":
        loader.commit()  # the checkpoint is where the loop's position is committed
    cur = loader._current
    record: dict[str, Any] | None = None
    if cur is not None and not cur.ended and cur.feeder.is_alive():
        cur._settle()
        try:
            record = cur.feeder.call(lambda trainer: trainer.client.checkpoint(ds.job, ckpt=ckpt))
        except errors.TaskqError as e:
            if cur.feeder.is_alive():
                raise
            # the iteration ended meanwhile: its acks and progress were sent at its end
            log.debug("the iteration ended during state_dict: %s", e)
    if record is None:
        with _client(ds) as client:
            record = client.checkpoint(ds.job, ckpt=ckpt)
    return checkpoints.state_of(ds.job, record)


def load_state_dict(loader: DataLoader, state: dict[str, Any], key: str | None = None) -> bool:
    """Put the job back to the checkpoint ``state`` names, once per restart: every
    restarted trainer calls it (whatever their number and their DataLoader workers');
    the first one rewinds the job, the others find it there. A running iteration of the
    loader is ended first (the rewind revokes its leases anyway).

    Args:
        loader: the loader.
        state: what ``state_dict()`` returned.
        key: what names this restart of the trainers; default ``restart_key()`` (under
            torchrun ``f"{TORCHELASTIC_RUN_ID}:{TORCHELASTIC_RESTART_COUNT}"``, else "":
            then a trainer loading the state after others acked work rewinds again).

    Returns:
        True when this call rewound the job.

    Raises:
        InvalidInput: not a loader state, or one of an earlier incarnation of the job.
        JobNotFound, JobCancelled, ConnectionLost.
    """
    if key is None:
        key = restart_key()
    loader._end_current()
    loader._done_pass = None  # the next iteration asks the job which pass it is in
    ds: TaskDataset = loader.dataset  # type: ignore[assignment]
    with _client(ds) as client:
        return checkpoints.restore(client, state, key=key)


@contextlib.contextmanager
def _client(ds: TaskDataset) -> Iterator[Any]:
    """The dataset's client, or one of our own closed afterwards."""
    if ds.client is not None:
        yield ds.client
        return
    from ..client import Client

    client = Client(ds.url)
    try:
        yield client
    finally:
        client.redis.close()
