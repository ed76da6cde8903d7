"""What a ``DataLoader``'s parts see of it: the loader's narrow interfaces.

An iteration (iteration.py) and the checkpoint functions (resume.py) work on the loader
that made them without importing loader.py: they see the members below only, and change
the loader's state through its methods, never its private fields.

Data flow: loader.py (implements both) -> iteration.py / resume.py (use them).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Protocol

from ..inputwait import InputMeter
from .dataset import Feed
from .feeder import Feeder


class IterationHost(Protocol):
    """The loader as one of its iterations sees it."""

    on_error: str
    pass_end: str
    acks: str
    ahead: int
    input_meter: InputMeter
    counts: Counter[str]
    persistent_workers: bool

    def padding_weighted(self) -> bool:
        """even_steps: a padding batch's loss is weighted (by an integration or the loop)."""

    def iteration_ended(self, state: str | None, done_pass: int | None) -> None:
        """Record why an iteration ended, and the pass it finished (None: not finished)."""

    def drop_workers(self, torch_iter: Any) -> None:
        """Forget ``torch_iter`` as the loader's kept (persistent) worker iterator."""

    def restart_workers(self, iteration_no: int) -> tuple[Feed, Any]:
        """A new task queue for ``iteration_no`` and torch's iterator over new workers."""


class RunningIteration(Protocol):
    """A running iteration as resume.py sees it (``TaskqIter``, iteration.py)."""

    ended: bool
    feeder: Feeder

    def settle(self) -> None:
        """Ack what the loop finished and send how far it got into the rest, now."""


class ResumeHost(Protocol):
    """The loader as ``state_dict`` / ``load_state_dict`` (resume.py) see it."""

    dataset: Any
    acks: str

    @property
    def collective(self) -> bool:
        """Whether ``state_dict()`` is a collective call now."""

    def commit(self) -> int:
        """Commit what the loop took so far."""

    def sync(self) -> None:
        """Send what the loop took so far, now."""

    @property
    def current(self) -> RunningIteration | None:
        """The loader's running iteration, if any."""

    def end_current(self, forget_pass: bool = False) -> None:
        """End the running iteration; ``forget_pass``: the next one asks the job its pass."""
