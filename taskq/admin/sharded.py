"""A sharded job's names as trainer/ imports them: its handle is the one ``Job``
(jobs.py: the verbs and their ``ROUTES``), its state combined by shardset.py.

Data flow: trainer/sharded.py -> sharded.py -> jobs.py, shardset.py.
"""

from taskq.admin.jobs import ShardedJob as ShardedJob
from taskq.admin.shardset import combine as combine

__all__ = ["ShardedJob", "combine"]
