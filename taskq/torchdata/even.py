"""Even steps: every rank of a ``torch.distributed`` job steps the same number of times.

DDP needs every rank to run the same number of steps: a rank whose pass ends first would
leave the others waiting in backward's allreduce for ever. taskq gives each rank the
tasks it leases, so the ranks' batch counts differ. With ``DataLoader(even_steps=True)``
each ``next()`` first asks every rank, in one small allreduce, whether it has a batch:

- all have one: each yields its own;
- none has: the iteration ends on every rank at the same call;
- a rank's loader raised: it raises, and every other rank raises ``TaskqError`` at the
  same call instead of waiting for it in the next collective;
- some have: those yield theirs, and each rank that is out repeats its last batch,
  marked ``loader.batch_is_padding`` (a pass's samples are still taken once in the job's
  records; a loop that multiplies a padding batch's loss by 0 trains nothing twice, as a
  rank joined under ``torch.distributed.algorithms.Join`` shadows the others).

A rank out before it yielded any batch (a tiny pass) gets one from the lowest rank
that has one (``broadcast_object_list``). The allreduce runs on the default process group
when its backend is gloo, else on a gloo group the loader makes once (every rank makes it
in the same ``iter(loader)``: a collective call).

Data flow: iteration.py (each ``next()``) -> even.py -> torch.distributed (the ranks).
"""

from __future__ import annotations

from typing import Any, NamedTuple


class Verdict(NamedTuple):
    """What the ranks said at one call."""

    #: no rank has a batch: the iteration ends everywhere
    all_out: bool
    #: a rank's loader raised at this call: every rank raises (none waits for it)
    failed: bool
    #: a rank out with nothing to repeat gets this rank's batch (None: no such rank)
    pad_source: int | None


class EvenSteps:
    """The ranks' agreement, one allreduce per ``next()``; owns the process group it
    uses and this rank's batch to repeat."""

    def __init__(self) -> None:
        self._group: Any = None
        self._made = False
        #: the batch this rank repeats when it is out (its last real one)
        self.pad: Any = None

    @staticmethod
    def _dist() -> Any:
        try:
            import torch.distributed as dist
        except ImportError:  # pragma: no cover - torch without distributed
            return None
        if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() < 2:
            return None
        return dist

    def start(self) -> bool:
        """At ``iter(loader)`` on every rank: make the gloo group if the default one is
        not gloo. False outside a process group of two ranks or more (nothing to agree)."""
        dist = self._dist()
        if dist is None:
            return False
        if not self._made:
            self._made = True
            if dist.get_backend() != "gloo":
                self._group = dist.new_group(backend="gloo")
        return True

    def agree(self, have: bool, failed: bool = False) -> Verdict:
        """Tell the others whether this rank has a batch (or failed); learn whether any
        has (or failed)."""
        import torch

        dist = self._dist()
        rank, world = dist.get_rank(), dist.get_world_size()
        need = not have and not failed and self.pad is None
        # one MIN over: -have (any has one), -need (any needs one), the lowest rank that
        # has one, -failed (any failed)
        said = torch.tensor([-int(have), -int(need), rank if have else world, -int(failed)])
        dist.all_reduce(said, op=dist.ReduceOp.MIN, group=self._group)
        anyone, needs, source, fails = (int(x) for x in said)
        if fails < 0:
            return Verdict(False, True, None)
        if anyone == 0:
            return Verdict(True, False, None)
        return Verdict(False, False, source if needs < 0 else None)

    def close(self) -> None:
        """Destroy the gloo group made here (``loader.close()``): a group left to the
        interpreter's exit may abort the process while its threads hold tensors."""
        dist = self._dist()
        if self._group is not None and dist is not None:
            dist.destroy_process_group(self._group)
        self._group, self._made, self.pad = None, False, None

    def share(self, batch: Any, source: int) -> Any:
        """Every rank: the batch of rank ``source``, for those out with none to repeat."""
        dist = self._dist()
        box = [batch if dist.get_rank() == source else None]
        dist.broadcast_object_list(box, src=source, group=self._group)
        return box[0]
