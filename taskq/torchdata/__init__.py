"""The PyTorch data path, imported as ``taskq.torch``: ``dataset.py`` (readers in the
DataLoader workers), ``feeder.py`` (the one thread that talks to Redis) with its
``ledger.py`` (what the iteration holds) and ``readahead.py`` (the readers' queue and the
reserve), ``loader.py`` and ``iteration.py`` (the DataLoader and its acking iterator, which
replaces dead workers), ``resume.py`` (checkpoints, restart keys), ``signals.py``
(SIGTERM) and ``frameworks.py`` (the training framework calling the loader, found, not
configured). See docs/torch.md.
"""
