"""The PyTorch data path, imported as ``taskq.torch``: ``dataset.py`` (readers in the
DataLoader workers), ``feeder.py`` (the one thread that talks to Redis) with its
``held.py`` (one table of what the iteration holds, keyed by (task, token), with each
task's state) and ``readahead.py`` (the readers' queue and end cells), ``loader.py``
and ``iteration.py`` (the DataLoader and its acking iterator, which replaces dead
workers), ``resume.py`` (checkpoints, restart keys), ``signals.py``
(SIGTERM) and ``frameworks.py`` (the training framework calling the loader, found, not
configured). See docs/torch.md.
"""
