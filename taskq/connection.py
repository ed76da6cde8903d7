"""Connecting to Redis: URLs, retries, password masking, and error translation.

Everything that talks to Redis goes through a connection made here, and every Redis
exception crosses into taskq's hierarchy at ``translate`` (``ConnectionLost`` names the
URL with its password masked).

Data flow: connect() -> client.py (admin) / trainer.py / reaper.py / exporter.py.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from . import errors

DEFAULT_URL = "redis://127.0.0.1:6379/0"


def mask_url(url: str) -> str:
    """The URL with any password replaced by ``***``."""
    return re.sub(r"(://[^:/@]*:)[^@/]*@", r"\1***@", url)


def resolve_url(url: str | None) -> str:
    """``url``, else ``TASKQ_REDIS_URL``, else the local default."""
    return url or os.environ.get("TASKQ_REDIS_URL") or DEFAULT_URL


def make_redis(
    url: str | None = None,
    *,
    retries: int = 6,
    socket_timeout: float = 10.0,
    cluster: bool | None = None,
) -> tuple[Any, str]:
    """A redis-py client for ``url`` with bounded retries (exponential backoff, jitter).

    Args:
        url: ``redis://``, ``rediss://``, ``unix://``, ``redis+cluster://`` or
            ``redis+sentinel://host:port[,host:port]/service_name[/db]``.
        retries: connection-error retries per command (0 disables).
        socket_timeout: seconds before a command times out (blocking reads add theirs).
        cluster: force (or forbid) the cluster client regardless of the scheme.

    Returns:
        (client, the masked URL for messages).

    Raises:
        InvalidInput: the URL cannot be parsed.
    """
    url = resolve_url(url)
    masked = mask_url(url)
    retry = Retry(ExponentialBackoff(cap=2.0, base=0.05), retries)
    common: dict[str, Any] = dict(
        decode_responses=True,
        socket_timeout=socket_timeout,
        socket_connect_timeout=min(socket_timeout, 5.0),
        retry=retry,
        retry_on_error=[redis.exceptions.ConnectionError, redis.exceptions.TimeoutError],
    )
    password = os.environ.get("TASKQ_REDIS_PASSWORD")
    parts = urlsplit(url)
    if password and not parts.password:
        common["password"] = password
    scheme = parts.scheme
    try:
        if scheme == "redis+cluster" or (cluster and scheme in ("redis", "rediss")):
            from redis.cluster import RedisCluster

            plain = url.replace("redis+cluster://", "redis://", 1)
            common.pop("retry_on_error")
            return RedisCluster.from_url(plain, **common), masked
        if scheme == "redis+sentinel":
            from redis.sentinel import Sentinel

            hosts = [
                (h.rsplit(":", 1)[0], int(h.rsplit(":", 1)[1]))
                for h in parts.netloc.split("@")[-1].split(",")
            ]
            path = [p for p in parts.path.split("/") if p]
            if not path:
                raise errors.InvalidInput(f"{masked}: sentinel URL needs /service_name")
            db = int(path[1]) if len(path) > 1 else 0
            kw = dict(common)
            if parts.password:
                kw["password"] = parts.password
            if parts.username:
                kw["username"] = parts.username
            sentinel = Sentinel(hosts, socket_timeout=socket_timeout, sentinel_kwargs={})
            return sentinel.master_for(path[0], db=db, **kw), masked
        if scheme not in ("redis", "rediss", "unix"):
            raise errors.InvalidInput(f"unsupported Redis URL scheme {scheme!r} in {masked}")
        return redis.Redis.from_url(url, **common), masked
    except (ValueError, IndexError) as e:
        raise errors.InvalidInput(f"bad Redis URL {masked}: {e}") from e


@contextlib.contextmanager
def translate(masked_url: str) -> Iterator[None]:
    """Turn redis-py exceptions into taskq errors (one readable line each)."""
    try:
        yield
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as e:
        raise errors.ConnectionLost(f"cannot reach Redis at {masked_url}: {e}") from e
    except redis.exceptions.NoPermissionError as e:
        raise errors.TaskqError(f"Redis at {masked_url} refused: {e}") from e
    except redis.exceptions.ResponseError as e:
        msg = str(e)
        if "OOM" in msg:
            raise errors.TaskqError(f"Redis at {masked_url} is out of memory: {msg}") from e
        raise
