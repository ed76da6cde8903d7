"""Calling the library: one packed FCALL per operation on a kept connection.

``Scripts`` packs a call's constant part (FCALL, the function, its KEYS) once per (verb,
keys), sends it on a connection it keeps (redis-py's pool otherwise), loads the library
when the server answers "function not found", and maps a reply's code to an error
(contract.raise_for).

Data flow: admin/ (Client) / trainer/ / ops/ -> transport.py (FCALL) -> Redis.
"""

from __future__ import annotations

import inspect
import os
import threading
from typing import Any

import redis

from taskq import errors
from taskq.engine.library import FUNCTIONS, LIBRARY, SOURCE


def _bulk(arg: Any) -> bytes:
    """One RESP bulk string (redis-py's Encoder rules for the types taskq sends)."""
    t = type(arg)
    if t is int:  # the common case first: ids, tokens, counts (bool is not int here)
        b = b"%d" % arg
    elif t is str:
        b = arg.encode()
    elif isinstance(arg, bytes):
        b = arg
    elif isinstance(arg, str):
        b = arg.encode()
    elif isinstance(arg, (int, float)) and not isinstance(arg, bool):
        b = repr(arg).encode()
    else:
        raise errors.TaskqError(f"cannot send {type(arg).__name__} {arg!r} to Redis")
    return b"$%d\r\n%s\r\n" % (len(b), b)


#: Packed bulk strings of the small ints a call sends most (counts, modes' wants, -1):
#: formatting ~10 ints a call is 7 % of a trainer's instructions per task at 1/call
#: with hiredis (bench/README.md, "Trainer instructions per task").
_INT_BULK: dict[int, bytes] = {i: b"$%d\r\n%d\r\n" % (len(b"%d" % i), i) for i in range(-1, 1024)}

#: The redis-py majors whose connection internals `_exchange` reads (``Connection._sock``,
#: ``Connection._parser`` and the parser's ``read_response()``; the same from 5.0 to 8.x),
#: as pyproject.toml pins them. Another layout must be read before it is trusted.
REDIS_PY_MAJORS = range(5, 9)
if int(redis.__version__.split(".")[0]) not in REDIS_PY_MAJORS:
    raise ImportError(
        f"taskq reads redis-py's connection internals as redis-py "
        f"{REDIS_PY_MAJORS.start}.x-{REDIS_PY_MAJORS.stop - 1}.x lay them out; this is "
        f"redis-py {redis.__version__}: install a redis-py in that range "
        f"(pip install 'redis>={REDIS_PY_MAJORS.start},<{REDIS_PY_MAJORS.stop}')"
    )

#: Packed bulk strings of the short str arguments a trainer repeats on every call (its job
#: incarnation, worker id, incarnation, mode letters, secret), up to this many per Scripts.
_BULK_CACHE_MAX = 256


def _pool_of(redis_client: Any) -> Any:
    """The connection pool to call on directly, or None (a cluster client, one pinned
    connection, a pool that needs a command name): those go through execute_command."""
    if not isinstance(redis_client, redis.Redis) or redis_client.connection is not None:
        return None
    pool = redis_client.connection_pool
    try:
        params = inspect.signature(pool.get_connection).parameters
    except (TypeError, ValueError):
        return None
    name = params.get("command_name")
    if name is not None and name.default is inspect.Parameter.empty:
        return None  # redis-py < 5.3 wants it; the ordinary path serves it
    return pool


def _exchange(conn: Any, body: list[bytes]) -> Any:
    """Send one packed command on the kept connection ``conn`` and read its reply.

    A connected connection is written and read directly (its socket, its parser, which
    handles RESP3 pushes itself): redis-py's ``send_packed_command`` / ``read_response``
    around them (the health check, the error text naming the host) are 4.4-4.9 % of a
    trainer's instructions per task at 1/call with hiredis (bench/README.md, "Trainer
    instructions per task"), so this reads redis-py's private members, for the versions
    REDIS_PY_MAJORS names. Their error handling is kept: any failure closes the
    connection (a reply half read must not be taken for the next one); an OS error
    becomes redis-py's ``ConnectionError``, which the caller retries through
    ``execute_command``; an error reply is raised. A connection not connected yet goes
    through redis-py's own calls, which connect it.

    Raises:
        redis.exceptions.ConnectionError, TimeoutError: the socket failed (closed).
        redis.exceptions.ResponseError: Redis answered an error.
    """
    sock = conn._sock
    if sock is None:
        conn.send_packed_command(body)
        return conn.read_response()
    try:
        sock.sendall(body[0])
        reply = conn._parser.read_response()
    except OSError as e:  # socket.timeout too
        conn.disconnect()
        raise redis.exceptions.ConnectionError(f"taskq: {e}") from e
    except BaseException:
        conn.disconnect()
        raise
    if isinstance(reply, redis.exceptions.ResponseError):
        raise reply
    return reply


class Scripts:
    """The operations, called on one Redis connection (FCALL; the library is loaded on
    first need)."""

    def __init__(self, redis_client: Any) -> None:
        self._redis = redis_client
        # A call's constant part (FCALL, the function, its KEYS: 24 of a trainer's ~30
        # arguments) is packed once per (verb, keys); bench/HISTORY.md measured redis-py's
        # per-command machinery around it (packing every argument, the Retry and event
        # wrappers) as the largest share of a trainer's CPU per task.
        self._pool = _pool_of(redis_client)
        self._packed: dict[tuple[str, tuple[Any, ...]], tuple[int, bytes]] = {}
        self._bulk_str: dict[str, bytes] = {}
        # one connection kept out of the pool for whichever thread calls first (the pool's
        # get/release with its checks and events cost as much as the packing); a second
        # thread meanwhile takes one from the pool. (pid, connection): a forked child
        # leaves its parent's socket alone and takes its own (the check redis-py's pool
        # makes on its own connections).
        self._own: tuple[int, Any] | None = None
        self._own_lock = threading.Lock()
        #: Times the kept connection was dropped (its next call reconnects, under a new
        #: CLIENT ID): a heartbeat names its connection again when this changed.
        self.own_resets = 0

    @property
    def redis(self) -> Any:
        """The redis-py client the operations are called on."""
        return self._redis

    def name_own_connection(self, name: str) -> str | None:
        """Name the connection that this thread's calls go out on and return its CLIENT ID.

        The kept connection of ``call`` is outside the pool, so naming a pooled one would
        record an id no call uses; a closed-connection watch (connwatch.py) must see the
        connection the heartbeats really go out on.

        Args:
            name: the connection's name (CLIENT SETNAME).

        Returns:
            The id; '' where CLIENT is refused (a proxy, a managed service); None when the
            calls do not go out on a kept connection (a cluster client, another thread
            holds it): then a pooled connection is what to name.

        Raises:
            redis.exceptions.ConnectionError: Redis unreachable.
        """
        if self._pool is None or not self._own_lock.acquire(blocking=False):
            return None
        try:
            if self._own is None or self._own[0] != os.getpid():
                self._own = (os.getpid(), self._pool.get_connection())
            conn = self._own[1]
            for attempt in (1, 2):  # a connection a restart closed reconnects once
                replies: list[Any] = []
                try:
                    conn.send_packed_command(
                        conn.pack_commands([("CLIENT", "SETNAME", name), ("CLIENT", "ID")])
                    )
                    for _ in range(2):  # both replies are read, refused or not
                        try:
                            replies.append(conn.read_response())
                        except redis.exceptions.ResponseError:
                            replies.append(None)
                except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                    conn.disconnect()
                    self.own_resets += 1
                    if attempt == 2:
                        raise
                    continue
                break
            return "" if replies[0] is None or replies[1] is None else str(int(replies[1]))
        finally:
            self._own_lock.release()

    def load(self) -> None:
        """Load the library (REPLACE: the same name always holds the same text)."""
        self._redis.function_load(SOURCE, replace=True)

    def call(self, verb: str, keys: list[str] | list[bytes], args: list[Any]) -> Any:
        """Run one operation.

        Args:
            verb: the operation (``lease``, ``ack``, ...).
            keys: its KEYS (checked against the file's N).
            args: its ARGV.

        Returns:
            The function's raw reply (a list whose first element is a ``Code``).
        """
        name, nkeys, read_only = FUNCTIONS[verb]
        if len(keys) != nkeys:
            raise errors.TaskqError(f"{verb}: expects {nkeys} keys, got {len(keys)}")
        command = "FCALL_RO" if read_only else "FCALL"
        try:
            if self._pool is not None:
                return self._call_packed(verb, command, name, keys, args)
            return self._redis.execute_command(command, name, nkeys, *keys, *args)
        except redis.exceptions.ResponseError as e:
            if "Function not found" not in str(e):
                raise
        try:
            self.load()
        except redis.exceptions.NoPermissionError as e:
            raise errors.TaskqError(
                f"the taskq library {LIBRARY} is not loaded on this Redis and this user may "
                f"not load it (FUNCTION LOAD): run one taskq command as the admin user "
                f"(for example `taskq job status JOB`), then retry"
            ) from e
        return self._redis.execute_command(command, name, nkeys, *keys, *args)

    def _call_packed(
        self, verb: str, command: str, name: str, keys: list[str] | list[bytes], args: list[Any]
    ) -> Any:
        """FCALL on a pooled connection with the constant part packed once; a connection
        error goes on through ``execute_command``, whose retry policy is the client's."""
        cache_key = (verb, tuple(keys))
        const = self._packed.get(cache_key)
        if const is None:
            head = [command, name, len(keys), *keys]
            const = (len(head), b"".join(_bulk(a) for a in head))
            self._packed[cache_key] = const
        n, packed = const
        parts = [b"*%d\r\n" % (n + len(args)), packed]
        strs = self._bulk_str
        for a in args:
            if type(a) is int:
                p = _INT_BULK.get(a)
                if p is None:
                    b = b"%d" % a
                    p = b"$%d\r\n%s\r\n" % (len(b), b)
                parts.append(p)
            elif type(a) is str:
                p = strs.get(a)
                if p is None:
                    p = _bulk(a)
                    if len(a) <= 64 and len(strs) < _BULK_CACHE_MAX:
                        strs[a] = p
                parts.append(p)
            else:
                parts.append(_bulk(a))
        body = [b"".join(parts)]
        assert self._pool is not None
        if self._own_lock.acquire(False):  # positional: the keyword form costs 0.2 µs
            try:
                if self._own is None or self._own[0] != os.getpid():
                    self._own = (os.getpid(), self._pool.get_connection())
                conn = self._own[1]
                try:
                    return _exchange(conn, body)
                except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                    conn.disconnect()
                    self.own_resets += 1
            finally:
                self._own_lock.release()
        else:
            conn = self._pool.get_connection()
            try:
                conn.send_packed_command(body)
                return conn.read_response()
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                conn.disconnect()
            finally:
                self._pool.release(conn)
        return self._redis.execute_command(command, name, len(keys), *keys, *args)
