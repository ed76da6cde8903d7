"""The training framework a ``taskq.torch.DataLoader`` runs under: detected, not configured.

A framework's loop decides what the loader must know to count a batch as taken at the
right time: Lightning's ``fit`` fetches one batch ahead of the step it runs and asks every
rank for the loader's ``state_dict()`` at a checkpoint; DDP over several ranks needs every
rank to step as often as the others (``even_steps``), and a rank out of data then steps on
a repeat of its last batch that must train nothing. Set by hand, each is a flag a user can
forget, losing or repeating a batch without a word. So ``iter(loader)``,
``loader.state_dict()`` and ``len(loader)`` look up their call stack for the framework's
own object (only classes of modules already imported are looked for; nothing is imported
here):

===================  ==========================  =================  ==================
setting              Lightning ``Trainer.fit``    transformers'      accelerate's
                                                  ``Trainer.train``  ``prepare(loader)``
===================  ==========================  =================  ==================
``ahead``            1 (0 with a                  0                  0
                     ``training_step`` taking
                     ``dataloader_iter``)
``collective``       world > 1                    world > 1          world > 1
                                                                     (``save_state``)
``even_steps``       world > 1                    world > 1          world > 1, unless
                                                                     ``pass_end="local"``
                                                                     (torch's ``Join``)
``pass_end``         "local" if world > 1         "local" if         "local" if
                                                  world > 1          world > 1
padding batch        loss x 0 (``training_step``  loss x 0           loss x 0
                     wrapped)                     (``compute_loss``) (``backward``)
SIGTERM              the loader's handler         the loader's       the loader's
                     (``leave_on_sigterm()``)
checkpoint           Lightning asks               the loader's       ``save_state`` /
                     ``state_dict()``             callback           ``load_state`` ask
===================  ==========================  =================  ==================

transformers' ``Trainer`` is hooked where it first asks the loader anything
(``len(loader)`` as ``train()`` begins, or ``iter()``): a callback keeps the loader's
state in the ``TrainerState`` at every step the Trainer saves, so it is written in the
checkpoint's trainer_state.json with the Trainer's own; ``get_resumed_dataloader`` hands
the loader on rather than skipping batches; the first ``iter()`` of
``train(resume_from_checkpoint=)`` loads the state the checkpoint holds, and refuses one
that holds none or one of another step (``resume``).

accelerate's ``Accelerator`` is found when its ``prepare`` asks the loader whether it is
prepared (loader.py ``_is_accelerate_prepared``); its loop is the user's, so whether a
padding batch's loss went through its ``backward`` (or the loop read ``loss_weight``) is
checked at the step after the first (iteration.py). With none found and a
``torch.distributed`` group of several ranks (a DDP loop of the user's), nothing can be
inferred: ``iter()`` refuses unless ``even_steps`` or ``pass_end`` says how the ranks
step. A value given to the loader that contradicts what the framework needs is refused
at ``iter()`` with one line naming it (``InvalidInput``); so is a setup whose padding
cannot be weighted here (Lightning's manual optimization, the HF Trainer's gradient
accumulation, over several ranks) unless ``even_steps=True`` says the loop weighs it
itself.

Data flow: loader.py (``iter()``, ``state_dict()``, ``len()``) -> frameworks.py -> the
framework's trainer object (read), its loss function (wrapped once); the HF Trainer's
callbacks -> frameworks.py -> loader.py (``state_dict()``, ``load_state_dict()``).
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
import weakref
from typing import Any, NamedTuple

from .. import errors
from . import signals

#: the loader's state in transformers' ``TrainerState`` (a checkpoint's trainer_state.json)
TRAINER_STATE_KEY = "taskq.torch.DataLoader"
#: frames looked at above the caller (a framework's trainer sits ~10 deep above iter())
_DEPTH = 64
#: (module, class name, kind): the frameworks' objects looked for on the stack
_OWNERS = (
    ("lightning.pytorch.trainer.trainer", "Trainer", "lightning"),
    ("pytorch_lightning.trainer.trainer", "Trainer", "lightning"),
    ("transformers.trainer", "Trainer", "transformers"),
    ("accelerate.accelerator", "Accelerator", "accelerate"),
)
_NAMES = {
    "lightning": "Lightning's Trainer.fit",
    "transformers": "transformers' Trainer",
    "accelerate": "accelerate's Accelerator",
}


class Framework(NamedTuple):
    """A framework's object found on the stack."""

    #: "lightning", "transformers" or "accelerate"
    kind: str
    #: its trainer (Lightning's, transformers') or its Accelerator
    owner: Any
    #: processes of the run (``torch.distributed``'s world)
    world: int

    @property
    def name(self) -> str:
        return _NAMES[self.kind]


class Settings(NamedTuple):
    """What the loader does in one iteration."""

    ahead: int
    even_steps: bool
    pass_end: str
    #: the framework weighs a padding batch's loss by ``loader.loss_weight`` itself
    weighs_padding: bool


def detect() -> Framework | None:
    """The framework whose object calls us, if any (the caller's stack, ``_DEPTH`` frames)."""
    owners = []
    for module, attr, kind in _OWNERS:
        cls = getattr(sys.modules.get(module), attr, None)
        if isinstance(cls, type):
            owners.append((cls, kind))
    if not owners:
        return None
    frame = inspect.currentframe()
    try:
        for _ in range(_DEPTH):
            if frame is None:
                return None
            me = frame.f_locals.get("self")
            for cls, kind in owners:
                if me is not None and isinstance(me, cls):
                    return Framework(kind, me, _world(kind, me))
            frame = frame.f_back
    finally:
        del frame  # a frame held in a local keeps the whole stack alive
    return None


def ranks() -> int:
    """The ranks of the default ``torch.distributed`` process group (1: none)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return 1
    return int(dist.get_world_size())


def _world(kind: str, owner: Any) -> int:
    if kind == "lightning":
        return int(owner.world_size)
    if kind == "transformers":
        return int(owner.args.world_size)
    return int(owner.num_processes)


def settle(given: dict[str, Any], fw: Framework | None, world: int = 1) -> Settings:
    """The iteration's settings from those given (None: not given), the framework and
    ``world``, the ranks of the ``torch.distributed`` group when none is found.

    Raises:
        InvalidInput: a given value the framework contradicts, padding that cannot be
            weighted here, or a loop of several ranks that says nothing of how its
            ranks step (one line naming the setting).
    """
    ahead, even, pass_end = given["ahead"], given["even_steps"], given["pass_end"]
    if fw is None:
        if world > 1 and even is None and pass_end is None:
            raise errors.InvalidInput(
                f"taskq.torch.DataLoader on {world} torch.distributed ranks in a loop of "
                "your own: each rank gets the batches it leases, so under DDP the rank "
                "with more waits in backward for ever; pass even_steps=True (and multiply "
                'the loss by loader.loss_weight), pass_end="local" under torch\'s Join, or '
                'pass_end="global" if the ranks do not step together'
            )
        world = 1
    else:
        world = fw.world
        if fw.kind == "accelerate" and pass_end == "local" and not even:
            world = 1  # the user's loop keeps the ranks' steps aligned (torch's Join)
    need_ahead = _ahead_of(fw)
    if fw is not None and need_ahead is not None and ahead is not None and ahead != need_ahead:
        raise errors.InvalidInput(
            f"taskq.torch.DataLoader(ahead={ahead}) under {fw.name}, whose loop fetches "
            f"{need_ahead} batch(es) ahead of the step it runs: a checkpoint would count a "
            f"batch never trained (or the reverse); leave ahead unset, taskq sets it"
        )
    if ahead is None:
        ahead = need_ahead or 0
    weighs = False
    if world > 1:
        assert fw is not None
        for name, value, bad in (
            ("even_steps", even, False),
            ("pass_end", pass_end, "global"),
            ("collective", given["collective"], False),
        ):
            if value is not None and value == bad:
                raise errors.InvalidInput(
                    f"taskq.torch.DataLoader({name}={bad!r}) under {fw.name} on {world} "
                    f"ranks: DDP needs every rank to step as often as the others (and a "
                    f"checkpoint every rank's steps); leave {name} unset, taskq sets it"
                )
        can = _can_weigh(fw)
        # accelerate's backward is the loop's to call: whether it did is checked at the
        # step after the first, as for a loop of the user's (iteration.py)
        weighs = can and fw.kind != "accelerate"
        if not can and even is None:
            raise errors.InvalidInput(
                f"{fw.name} on {world} ranks {_why_not(fw)}: taskq.torch cannot weight a "
                "padding batch's loss by 0 for it; multiply the loss by loader.loss_weight "
                "and pass even_steps=True"
            )
        even = True
    even = bool(even)
    if even and pass_end == "global":
        raise errors.InvalidInput(
            'even_steps needs pass_end="local": a rank waiting for the pass to end '
            "everywhere cannot step beside the others"
        )
    if ahead and pass_end == "global":
        # the pass cannot end everywhere before the loop steps on the batch it holds
        # ahead, which it does only once this iteration has given it the next one
        raise errors.InvalidInput(
            f'ahead={ahead} needs pass_end="local": a loop waiting for the pass to end '
            "everywhere would wait for its own last batch"
        )
    return Settings(ahead, even, pass_end or ("local" if even or ahead else "global"), weighs)


def collective(given: bool | None) -> bool:
    """``state_dict()``: whether it is a collective call. Given, or True when a framework
    calls it from every rank of several (Lightning's checkpoint, accelerate's
    ``save_state``, a transformers' Trainer callback)."""
    if given is not None:
        return given
    fw = detect()
    return fw is not None and fw.world > 1


def install(fw: Framework | None, settings: Settings, loader: Any) -> None:
    """What the framework needs beside the settings, once per framework object: the
    loader's SIGTERM handler (Lightning's own, under DDP, broadcasts from inside the
    handler and can leave the ranks waiting on each other: docs/frameworks.md) and the
    loss of a padding batch x 0."""
    if fw is None:
        return
    if fw.kind == "accelerate" and settings.even_steps:
        _wrap_loss_in(fw.owner, "backward", loader)
        return
    if fw.kind == "lightning" and threading.current_thread() is threading.main_thread():
        signals.leave_on_sigterm()
    if fw.kind == "transformers":
        _hook_trainer(fw.owner, loader)
    if settings.weighs_padding:
        if fw.kind == "lightning":
            _wrap(fw.owner.lightning_module, "training_step", loader)
        elif fw.kind == "transformers":
            _wrap(fw.owner, "compute_loss", loader)


def _ahead_of(fw: Framework | None) -> int | None:
    """Batches the framework's loop fetches before it steps on one (None: its loop is
    the user's)."""
    if fw is None or fw.kind == "accelerate":
        return None
    if fw.kind == "lightning":
        step = fw.owner.lightning_module.training_step
        # training_step(dataloader_iter): the step fetches its own batches, none ahead
        return 0 if "dataloader_iter" in inspect.signature(step).parameters else 1
    return 0  # transformers: a step's batches are fetched just before it


def _can_weigh(fw: Framework) -> bool:
    if fw.kind == "lightning":
        return bool(fw.owner.lightning_module.automatic_optimization)
    if fw.kind == "transformers":
        # accumulation fetches several batches before their steps: which one is a
        # repeat is not known at each loss
        return int(fw.owner.args.gradient_accumulation_steps) == 1
    # accelerate: the user's loop fetches each batch just before its backward
    return fw.kind == "accelerate"


def _why_not(fw: Framework) -> str:
    if fw.kind == "lightning":
        return "with manual optimization"
    if fw.kind == "transformers":
        return "with gradient_accumulation_steps > 1"
    return "in the user's loop"


def _wrap(owner: Any, method: str, loader: Any) -> None:
    """``owner.method`` returns its loss x ``loader.loss_weight`` (0.0 for a padding
    batch): an instance attribute over the class's method, made once per owner."""
    current = getattr(owner, method)
    if getattr(current, "_taskq_loader", None) is loader:
        return

    @functools.wraps(current)
    def weighted(*args: Any, **kwargs: Any) -> Any:
        out = current(*args, **kwargs)
        weight = loader.loss_weight
        return out if weight == 1.0 else _scaled(out, weight)

    weighted._taskq_loader = loader  # type: ignore[attr-defined]
    setattr(owner, method, weighted)


def _wrap_loss_in(owner: Any, method: str, loader: Any) -> None:
    """``owner.method(loss, ...)`` gets ``loss x loader.loss_weight`` (accelerate's
    ``backward``: 0.0 for a padding batch): an instance attribute over the class's
    method, made once per owner and loader."""
    current = getattr(owner, method)
    if getattr(current, "_taskq_loader", None) is loader:
        return

    @functools.wraps(current)
    def weighted(loss: Any, *args: Any, **kwargs: Any) -> Any:
        weight = loader.loss_weight  # read: the loop's step weighs its padding
        return current(loss if weight == 1.0 else loss * weight, *args, **kwargs)

    weighted._taskq_loader = loader  # type: ignore[attr-defined]
    setattr(owner, method, weighted)


def _scaled(out: Any, weight: float) -> Any:
    """A step's output with its loss x ``weight``: a tensor, ``{"loss": ...}``, a tuple
    ``(loss, outputs)`` (transformers' ``compute_loss``), or None (a skipped step)."""
    if out is None:
        return None
    if isinstance(out, dict):
        return {**out, "loss": out["loss"] * weight}
    if isinstance(out, tuple):
        return (out[0] * weight, *out[1:])
    return out * weight


# transformers' Trainer: the loader's state in its checkpoints, and back on resume


def asked_length(loader: Any) -> None:
    """``len(loader)``: transformers' ``Trainer.train`` asks it first, before a resumed run
    decides to skip the batches it trained (``get_resumed_dataloader``); a Trainer found
    here is hooked then (``_hook_trainer``), in time."""
    fw = detect()
    if fw is not None and fw.kind == "transformers":
        _hook_trainer(fw.owner, loader)


def resume(fw: Framework | None, loader: Any, loaded: bool) -> None:
    """At ``iter()``: the first iteration of a ``Trainer.train(resume_from_checkpoint=)``
    (a new ``TrainerState`` at a step past 0) puts the job back to the loader's state its
    checkpoint holds, unless ``loaded`` (the user's code loaded one since the last
    iteration).

    Raises:
        InvalidInput: the checkpoint holds no loader state, or one of another step (one
            line): the loader cannot tell which batches the model trained.
    """
    if fw is None or fw.kind != "transformers":
        return
    trainer = fw.owner
    hooks = _hook_trainer(trainer, loader)
    state = trainer.state
    if hooks.seen is not None and hooks.seen() is state:
        return  # not the first iteration of this train()
    hooks.seen = weakref.ref(state)
    step = int(state.global_step)
    if step == 0 or loaded:
        return
    kept = (state.stateful_callbacks or {}).get(TRAINER_STATE_KEY)
    if not isinstance(kept, dict):
        raise errors.InvalidInput(
            f"transformers' Trainer resumed from a checkpoint of step {step} that holds no "
            "taskq loader state (saved by an older taskq, or by a path taskq does not see): "
            "the loader cannot tell which batches the model trained; resume from a "
            "checkpoint saved under this taskq, or call loader.load_state_dict(...) with "
            "the state you saved beside it before train()"
        )
    if kept.get("step") != step:
        raise errors.InvalidInput(
            f"transformers' Trainer resumed from a checkpoint of step {step} that holds the "
            f"taskq loader state of step {kept.get('step')} (a save taskq's callback did not "
            "see: it keeps the state at the saves of save_strategy 'steps', 'epoch' and "
            "'best'): the loader cannot tell which batches the model trained; resume from "
            "another checkpoint"
        )
    loader.load_state_dict(kept["loader"])


def _hook_trainer(trainer: Any, loader: Any) -> Any:
    """transformers' Trainer, once per trainer and loader: a callback keeps the loader's
    state in every checkpoint's ``TrainerState`` (taken at the step it saves, a
    collective call over several ranks, written with the Trainer's own state: a
    checkpoint the Trainer can resume from holds it), and ``get_resumed_dataloader``
    hands a taskq loader on as it is (its state says where the pass resumes; skipping
    would rebuild a plain torch loader around the dataset). Returns the callback."""
    cls: Any = _trainer_callback()
    mine = [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, cls)]
    if mine and mine[0].loader is loader:
        return mine[0]
    for cb in mine:
        trainer.callback_handler.remove_callback(cb)
    hooks = cls(loader)
    trainer.add_callback(hooks)
    current = trainer.get_resumed_dataloader
    if not getattr(current, "_taskq_hooked", False):

        @functools.wraps(current)
        def resumed(dataloader: Any, num_batches: int) -> Any:
            # (a taskq.torch.DataLoader: named by its module, which imports this one)
            if type(dataloader).__module__ == f"{__package__}.loader":
                return dataloader
            return current(dataloader, num_batches)

        resumed._taskq_hooked = True  # type: ignore[attr-defined]
        trainer.get_resumed_dataloader = resumed
    return hooks


@functools.cache
def _trainer_callback() -> type:
    """The callback class (transformers is imported: its Trainer was found)."""
    from transformers import TrainerCallback

    class TaskqLoaderState(TrainerCallback):  # type: ignore[misc]
        """The loader's state in the ``TrainerState`` at each step the Trainer saves."""

        def __init__(self, loader: Any) -> None:
            self.loader = loader
            #: the ``TrainerState`` of the train() the loader last iterated under
            self.seen: weakref.ref[Any] | None = None

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self._keep(args, state, control)

        def on_epoch_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self._keep(args, state, control)

        def _keep(self, args: Any, state: Any, control: Any) -> None:
            # the Trainer's own callback decided this step's save (or, for "best", the
            # evaluation that may lead to one) before this one runs; every rank is here
            if control.should_save or (control.should_evaluate and args.save_strategy == "best"):
                kept = {"step": state.global_step, "loader": self.loader.state_dict()}
                state.stateful_callbacks[TRAINER_STATE_KEY] = kept

    return TaskqLoaderState
