"""Connecting to Redis: URLs, retries, password masking, error translation, and the
``Connection`` every caller runs the engine's verbs through.

Everything that talks to Redis goes through a connection made here (or a caller's own
redis-py client, checked here first), and every Redis exception crosses into taskq's
hierarchy at ``translate`` (``ConnectionLost`` names the URL with its password masked).
``Connection`` is the engine's link: the redis-py client, the key prefix, the function
library on it, the job keys, and ``run`` (one verb's call with its codes raised).

Data flow: admin/client.py (``Client``), trainer/core.py, the job handles, ops/ ->
``Connection`` -> engine/transport.py -> Redis.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Container, Iterator, Sequence
from typing import Any
from urllib.parse import SplitResult, parse_qsl, unquote, urlsplit, urlunsplit

import redis
from redis.backoff import ExponentialBackoff
from redis.cluster import PRIMARY, ClusterNode, RedisCluster
from redis.retry import Retry

from taskq import errors
from taskq.engine.contract import Code, raise_for
from taskq.engine.transport import Scripts
from taskq.keys import JobKeys, prefix, valid_job_name

DEFAULT_URL = "redis://127.0.0.1:6379/0"


_SECRET_QUERY_RE = re.compile(r"([?&](?:password|sentinel_password|ssl_password)=)[^&#]*", re.I)


def mask_url(url: str) -> str:
    """The URL with any password replaced by ``***``.

    The user info ends at the *last* ``@`` of the authority, so a password holding an
    unescaped ``@``, ``/`` or ``:`` is masked whole; ``password=`` query arguments too.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        return _SECRET_QUERY_RE.sub(r"\1***", url)
    end = len(rest)
    for stop in "?#":
        pos = rest.find(stop)
        if pos != -1:
            end = min(end, pos)
    authority, tail = rest[:end], rest[end:]
    userinfo, at, hosts = authority.rpartition("@")
    if at:
        user, colon, _ = userinfo.partition(":")
        authority = f"{user}:***@{hosts}" if colon else authority
    return f"{scheme}://{authority}" + _SECRET_QUERY_RE.sub(r"\1***", tail)


def trainer_conn_name(incarnation: str) -> str:
    """The name a trainer gives its heartbeat connection (CLIENT SETNAME).

    The reaper counts a connection id as a worker's only once it has seen it under this
    name (connwatch.py): after a Redis restart an old id may name someone else's
    connection. Names show in ``CLIENT LIST`` for operators too.

    Args:
        incarnation: the worker incarnation (random hex).

    Returns:
        ``taskq-trainer-<incarnation>``.
    """
    return f"taskq-trainer-{incarnation}"


def name_connection(redis_client: Any, incarnation: str) -> str:
    """Name the connection a trainer's heartbeats go out on and return its CLIENT ID.

    A single-threaded client reuses one pooled connection, so the heartbeat sent right
    after this goes out on the connection named here; the worker record keeps the id for
    the reaper (connwatch.py). Both commands go in one round trip.

    Args:
        redis_client: the heartbeat's redis-py client.
        incarnation: the worker incarnation (the connection's name is made from it).

    Returns:
        The connection's id, or '' where it cannot be had (a cluster client, a proxy or a
        service that refuses CLIENT): the reaper then leaves this worker to its ttl.

    Raises:
        redis.exceptions.ConnectionError: Redis unreachable.
    """
    if not isinstance(redis_client, redis.Redis):
        return ""
    pipe = redis_client.pipeline(transaction=False)
    pipe.client_setname(trainer_conn_name(incarnation))
    pipe.client_id()
    try:
        _, cid = pipe.execute()
    except redis.exceptions.ResponseError:
        return ""
    return str(cid)


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
        url: ``redis://``, ``rediss://`` (TLS: ``?ssl_ca_certs=...&ssl_certfile=...&
            ssl_keyfile=...``), ``unix://``, ``redis+cluster://host:port[,host:port]``
            (``rediss+cluster://`` with TLS) or
            ``redis+sentinel://host:port[,host:port]/service_name[/db]``. A password
            in the URL wins over ``TASKQ_REDIS_PASSWORD``.
        retries: connection-error retries per command (0 disables).
        socket_timeout: seconds before a command times out (blocking reads add theirs).
        cluster: force (or forbid) the cluster client regardless of the scheme.

    Returns:
        (client, the masked URL for messages).

    Raises:
        InvalidInput: the URL cannot be parsed.
        ConnectionLost: a cluster URL whose nodes cannot be reached (its slot map is read
            at once).
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
        if scheme in ("redis+cluster", "rediss+cluster") or (
            cluster and scheme in ("redis", "rediss")
        ):
            try:
                return _cluster(url, parts, common), masked
            except redis.exceptions.RedisClusterException as e:
                # the cluster client reads the slot map when it is made: a cluster that
                # is down (a master paused, failing over) is as transient as a lost link
                raise errors.ConnectionLost(f"cannot reach the cluster at {masked}: {e}") from e
        if cluster:
            raise errors.InvalidInput(f"cluster=True needs a redis:// or rediss:// URL: {masked}")
        if scheme == "redis+sentinel":
            return _sentinel(parts, common, socket_timeout, masked), masked
        if scheme not in ("redis", "rediss", "unix"):
            raise errors.InvalidInput(f"unsupported Redis URL scheme {scheme!r} in {masked}")
        return redis.Redis.from_url(url, **common), masked
    except (ValueError, IndexError) as e:
        if isinstance(e, errors.InvalidInput):
            raise
        raise errors.InvalidInput(f"bad Redis URL {masked}: {e}") from e


def check_given_client(redis_client: Any) -> None:
    """Refuse a redis-py client that taskq cannot read replies from, before any call.

    taskq reads every reply as str (protocol.py, stats.py): a client built without
    ``decode_responses=True`` (redis-py's default) hands back bytes, which would surface
    only later, as a puzzling "not a taskq job" or "job not found". The
    setting is read from the client's encoder (``redis.Redis``, a Sentinel master, and
    ``RedisCluster`` all have one), so nothing is sent to Redis here.

    Args:
        redis_client: the client given to ``Client(redis_client=...)``.

    Raises:
        InvalidInput: an asyncio client, an object that is not a redis-py client, or one
            whose replies are bytes.
    """
    kind = type(redis_client).__name__
    if type(redis_client).__module__.startswith("redis.asyncio"):
        raise errors.InvalidInput(
            f"redis_client is an asyncio {kind}: taskq calls Redis synchronously; give a "
            "redis.Redis (or RedisCluster, or a Sentinel master_for client) built with "
            "decode_responses=True, or pass url= instead"
        )
    get_encoder = getattr(redis_client, "get_encoder", None)
    if get_encoder is None:
        raise errors.InvalidInput(
            f"redis_client is a {kind}, not a redis-py client: give a redis.Redis (or "
            "RedisCluster, or a Sentinel master_for client) built with "
            "decode_responses=True, or pass url= instead"
        )
    if not getattr(get_encoder(), "decode_responses", False):
        raise errors.InvalidInput(
            f"redis_client (a {kind}) returns bytes: taskq reads replies as str; build it "
            "with decode_responses=True, or pass url= and let taskq make its own"
        )


def _hosts(netloc: str) -> list[tuple[str, int]]:
    """``host:port[,host:port...]`` after the user info (which ends at the last ``@``)."""
    out = []
    for item in netloc.rpartition("@")[2].split(","):
        host, _, port = item.strip().rpartition(":")
        out.append((host.strip("[]") or "127.0.0.1", int(port)))
    if not out:
        raise ValueError("no host:port")
    return out


class _Cluster(RedisCluster):
    """redis-py's cluster client, riding out a slot migration as it rides out a failover.

    While a slot migrates (``redis-cli --cluster reshard`` / ``rebalance``, or
    ``CLUSTER SETSLOT`` + ``MIGRATE`` by hand), a call naming several keys of a job is
    answered ``TRYAGAIN`` by both nodes until its keys are on one side, and a key already
    moved is answered ``ASK`` with the importing node. redis-py follows both but gives up
    after 16 tries in about 0.4 s (``ClusterError('TTL exhausted.')``), and cannot follow
    an ``ASK`` to a master that holds no slot yet (a new node getting its first one):
    ``CLUSTER SLOTS``, its map of the cluster, does not list such a master.
    """

    # A bare ClusterError is the TTL exhausted by TRYAGAIN / ASK / MOVED replies: retried
    # like a connection error (the client's Retry: its count, its backoff) instead of
    # raised; what still fails after that is ``ConnectionLost`` (``translate``), which a
    # trainer retries up to its reconnect_timeout and the reaper for as long as it runs.
    # (redis-py types the tuple as its own four classes: hence the ignore)
    ERRORS_ALLOW_RETRY = (  # type: ignore[assignment]
        *RedisCluster.ERRORS_ALLOW_RETRY,
        redis.exceptions.ClusterError,
    )

    def get_node(
        self, host: str | None = None, port: int | None = None, node_name: str | None = None
    ) -> ClusterNode | None:
        """The node at ``host:port`` (or named ``node_name``); a master not yet known when
        asked by address, which is how an ``ASK`` redirect is followed.

        The master is added to the client's nodes as a ``MOVED`` redirect adds one
        (``NodesManager.move_slot``), so the function library is loaded on it too
        (engine/transport.py); the next refresh of the slot map keeps it or drops it.
        """
        node = super().get_node(host, port, node_name)
        if node is None and host and port:
            node = ClusterNode(host, port, PRIMARY)
            node = self.nodes_manager.nodes_cache.setdefault(node.name, node)
        return node


def _cluster(url: str, parts: SplitResult, common: dict[str, Any]) -> Any:
    """A RedisCluster from ``redis+cluster://[user:pw@]host:port[,host:port...][?...]``.

    Every host given is a startup node; the cluster tells the client about the rest.
    """
    tls = parts.scheme.startswith("rediss")
    hosts = _hosts(parts.netloc)
    userinfo, at, _ = parts.netloc.rpartition("@")
    first = f"{userinfo}{at}{hosts[0][0]}:{hosts[0][1]}"
    plain = urlunsplit(("rediss" if tls else "redis", first, parts.path, parts.query, ""))
    kw = dict(common)
    kw.pop("retry_on_error")  # the cluster client retries on its own terms
    if len(hosts) > 1:
        kw["startup_nodes"] = [ClusterNode(h, p) for h, p in hosts[1:]]
    return _Cluster.from_url(plain, **kw)


def _sentinel(
    parts: SplitResult, common: dict[str, Any], socket_timeout: float, masked: str
) -> Any:
    """The master of ``redis+sentinel://[user:pw@]host:port[,...]/service[/db][?...]``.

    The user and password are the data nodes' (also ``TASKQ_REDIS_PASSWORD``); the
    sentinels' own, if they have any, come from ``sentinel_username`` /
    ``sentinel_password`` query arguments.
    """
    from redis.sentinel import Sentinel

    hosts = _hosts(parts.netloc)
    path = [p for p in parts.path.split("/") if p]
    if not path:
        raise errors.InvalidInput(f"{masked}: sentinel URL needs /service_name")
    db = int(path[1]) if len(path) > 1 else 0
    query = dict(parse_qsl(parts.query))
    kw = dict(common)
    if parts.password:
        kw["password"] = unquote(parts.password)
    if parts.username:
        kw["username"] = unquote(parts.username)
    sentinel_kwargs: dict[str, Any] = {"socket_timeout": min(socket_timeout, 5.0)}
    for name in ("username", "password"):
        if query.get(f"sentinel_{name}"):
            sentinel_kwargs[name] = query[f"sentinel_{name}"]
    sentinel = Sentinel(hosts, socket_timeout=socket_timeout, sentinel_kwargs=sentinel_kwargs)
    return sentinel.master_for(path[0], db=db, **kw)


#: How an ACL refusal reads when it happens inside a script (Redis 7.0 and later).
_ACL_REFUSALS = (
    "NOPERM",
    "user executing the script can't",
    "ACL failure in script",
    "no permissions to",
)


#: What redis-py raises, to catch where a call is translated only when it fails (its
#: cluster client's own errors are not ``RedisError``\ s).
REDIS_ERRORS = (redis.exceptions.RedisError, redis.exceptions.RedisClusterException)

#: A slot migrating: TRYAGAIN, ASK or MOVED raised as they are (and a bare
#: ``ClusterError``: redis-py's TTL ran out on them).
_MIGRATING = (redis.exceptions.TryAgainError, redis.exceptions.AskError)

#: Redis cannot serve the call now but will: unreachable, loading, failing over, or a
#: cluster down (CLUSTERDOWN), not yet covering the slot in the client's map, or moving it.
_TRANSIENT = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ClusterError,
    *_MIGRATING,
    redis.exceptions.SlotNotCoveredError,
    # a refresh of the slot map that reached no node (newer redis-py; before, a
    # RedisClusterException)
    getattr(redis.exceptions, "RedisClusterUnreachableError", redis.exceptions.ConnectionError),
)


def _said(e: BaseException) -> str:
    """An exception's text, or its type's name when it has none."""
    return str(e) or type(e).__name__


@contextlib.contextmanager
def translate(
    masked_url: str, job_keys: JobKeys | None = None, redis_client: Any = None
) -> Iterator[None]:
    """Turn redis-py exceptions into taskq errors (one readable line each).

    Args:
        masked_url: the URL to name (password already masked).
        job_keys: the job the call was about; with ``redis_client``, a ``WRONGTYPE``
            reply is traced to the key that holds foreign data (``CorruptData``).
        redis_client: the connection to probe key types with.

    Raises:
        ConnectionLost: Redis unreachable, loading, or a cluster mid-failover or with a slot
            migrating (transient).
        RedisOutOfMemory: Redis is full (``maxmemory`` with ``noeviction``; transient, a
            kind of ``ConnectionLost``).
        TaskqError: credentials or ACL refused, a read-only replica, another error of the
            cluster client.
        CorruptData: a key of the job holds a type taskq never writes there.
    """
    try:
        yield
    except redis.exceptions.AuthenticationError as e:
        raise errors.TaskqError(
            f"Redis at {masked_url} refused the credentials (check the user and "
            f"password in the URL or TASKQ_REDIS_PASSWORD): {e}"
        ) from e
    except _TRANSIENT as e:
        if isinstance(e, _MIGRATING) or type(e) is redis.exceptions.ClusterError:
            raise errors.ConnectionLost(
                f"Redis Cluster at {masked_url}: the call's slot is moving between masters "
                f"({_said(e)}; a move stuck half-way shows in `redis-cli --cluster check`)"
            ) from e
        raise errors.ConnectionLost(f"cannot reach Redis at {masked_url}: {_said(e)}") from e
    except redis.exceptions.RedisClusterException as e:
        raise errors.TaskqError(f"Redis Cluster at {masked_url}: {_said(e)}") from e
    except redis.exceptions.NoPermissionError as e:
        raise errors.TaskqError(
            f"Redis at {masked_url} refused by ACL (this user may not do that): {e}"
        ) from e
    except redis.exceptions.OutOfMemoryError as e:
        raise _out_of_memory(masked_url, str(e)) from e
    except redis.exceptions.ReadOnlyError as e:
        raise errors.TaskqError(
            f"Redis at {masked_url} is a read-only replica (point the URL at the master, "
            f"or use redis+sentinel://): {e}"
        ) from e
    except redis.exceptions.ResponseError as e:
        msg = str(e)
        if any(mark in msg for mark in _ACL_REFUSALS):
            raise errors.TaskqError(
                f"Redis at {masked_url} refused by ACL (this user may not do that): {msg}"
            ) from e
        if msg.startswith("OOM") or "OOM command not allowed" in msg:
            raise _out_of_memory(masked_url, msg) from e
        if "WRONGTYPE" in msg:
            raise errors.CorruptData(_wrong_type_message(job_keys, redis_client, msg)) from e
        raise


def _out_of_memory(masked_url: str, msg: str) -> errors.RedisOutOfMemory:
    """One line naming the server and the way out (Redis's own text last)."""
    return errors.RedisOutOfMemory(
        f"Redis at {masked_url} is out of memory (maxmemory reached, noeviction): delete "
        f"finished jobs or raise maxmemory ({msg.splitlines()[0] if msg else 'OOM'})"
    )


def _wrong_type_message(job_keys: JobKeys | None, redis_client: Any, msg: str) -> str:
    """Name the key(s) behind a WRONGTYPE reply when the job is known."""
    if job_keys is not None and redis_client is not None:
        from taskq.integrity import wrong_type_keys

        try:
            bad = wrong_type_keys(redis_client, job_keys)
        except redis.exceptions.RedisError:
            bad = []
        if bad:
            return (
                "; ".join(
                    f"{key} holds a {actual}, taskq writes a {expected} there"
                    for key, actual, expected in bad
                )
                + " (not written by taskq: remove it or use another TASKQ_PREFIX)"
            )
    where = f"a key of job {job_keys.job!r}" if job_keys is not None else "a key"
    return f"{where} holds a type taskq does not write: {msg}"


class Connection:
    """The engine's link: one redis-py client and what every verb's call needs.

    Args:
        url: Redis URL; ``TASKQ_REDIS_URL`` or ``redis://127.0.0.1:6379/0`` by default.
        redis_client: an already configured redis-py client to use instead (checked by
            ``check_given_client``); ``url``, ``cluster``, ``retries`` and
            ``socket_timeout`` are then ignored.
        key_prefix: overrides ``TASKQ_PREFIX``.
        cluster: force the cluster client.
        retries: connection retries per command (bounded, exponential backoff).
        socket_timeout: seconds before a Redis call gives up on its answer.
        allow_eviction: creating a job on a Redis that may evict keys is allowed.

    Raises:
        InvalidInput: a bad URL or given client. ConnectionLost: a cluster unreachable.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        redis_client: Any = None,
        key_prefix: str | None = None,
        cluster: bool | None = None,
        retries: int = 6,
        socket_timeout: float = 10.0,
        allow_eviction: bool = False,
    ) -> None:
        self.allow_eviction = allow_eviction
        self.redis: Any
        if redis_client is not None:
            check_given_client(redis_client)
            self.redis = redis_client
            self.url = "<given client>"
        else:
            self.redis, self.url = make_redis(
                url, retries=retries, socket_timeout=socket_timeout, cluster=cluster
            )
        self.prefix = key_prefix or prefix()
        self.scripts = Scripts(self.redis)
        self._keys: dict[str, JobKeys] = {}

    def keys(self, job: str) -> JobKeys:
        """The keys of ``job`` (kept per job).

        Raises:
            InvalidInput: a bad job name.
        """
        if job not in self._keys:
            if not valid_job_name(job):
                raise errors.InvalidInput(f"bad job name {job!r}: use 1-64 of A-Z a-z 0-9 . _ -")
            self._keys[job] = JobKeys(job, self.prefix)
        return self._keys[job]

    def run(
        self,
        job: str,
        verb: str,
        args: Sequence[Any],
        extra_keys: Sequence[str] = (),
        passthrough: Container[int] = (),
    ) -> Any:
        """Run one verb's script on ``job``; negative codes raise their error, except
        those in ``passthrough``, which the caller handles from the reply.

        Raises:
            TaskqError: the code's error (engine/contract.py). ConnectionLost.
        """
        job_keys = self._keys.get(job) or self.keys(job)
        # the job's own key list as it is (the constant part of the call is packed once
        # per verb and key list, engine/transport.py), a new one only with extra keys
        keys: list[Any] = (
            job_keys.script_bytes
            if not extra_keys
            else job_keys.script_bytes + [k.encode() for k in extra_keys]
        )
        try:
            reply = self.scripts.call(verb, keys, args if isinstance(args, list) else list(args))
        except REDIS_ERRORS as e:
            # translated only when it happens: the context manager's enter and exit cost
            # a few µs on every call of a trainer's hot path (bench/HISTORY.md)
            with translate(self.url, job_keys, self.redis):
                raise e
        except UnicodeEncodeError as e:  # packed before anything is sent: nothing went out
            raise errors.InvalidInput(
                f"job {job!r}: {verb}: an argument is not UTF-8 text ({e.reason} at "
                f"{e.start}: a lone surrogate); nothing sent"
            ) from e
        code = int(reply[0])
        if code < 0 and code not in passthrough:
            raise_for(
                code,
                job,
                reply[1]
                if code == Code.INVALID and len(reply) > 1 and isinstance(reply[1], str)
                else "",
            )
        return reply

    def ping(self) -> None:
        """Raise ``ConnectionLost`` unless Redis answers."""
        with translate(self.url):
            self.redis.ping()
