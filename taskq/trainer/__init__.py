"""The trainer: the public ``Trainer`` and the parts it is built from."""

from taskq.trainer.core import Trainer

__all__ = ["Trainer"]
