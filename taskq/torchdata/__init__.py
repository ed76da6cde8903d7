"""The PyTorch data path, imported as ``taskq.torch``: ``dataset.py`` (readers in the
DataLoader workers), ``feeder.py`` (the one thread that talks to Redis) and ``loader.py``
(the DataLoader and its acking iterator). See docs/torch.md.
"""
