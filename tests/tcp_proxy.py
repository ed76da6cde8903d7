"""A small TCP proxy on loopback for partition tests: 127.0.0.1:port -> 127.0.0.1:upstream.

The chaos tests point some trainers at the proxy and the reaper (and others) straight at
Redis, then ``cut()`` the proxy: nothing is forwarded in either direction and nothing is
closed, so clients behind it see timeouts (a network partition), not resets. ``restore()``
forwards again: by default the bytes held during the cut are delivered late, as TCP would
after a partition heals (so late commands reach Redis after the server moved on);
``restore(deliver=False)`` instead closes every connection that lived through the cut.

Only loopback, only threads of the test process; ``stop()`` ends them all.
"""

from __future__ import annotations

import select
import socket
import threading
from types import TracebackType

_POLL_S = 0.05


class _Pair:
    """One client connection and its upstream connection."""

    def __init__(self, client: socket.socket) -> None:
        self.client = client
        self.upstream: socket.socket | None = None
        self.closed = threading.Event()

    def close(self) -> None:
        self.closed.set()
        for s in (self.client, self.upstream):
            if s is None:
                continue
            # shutdown first: a forked child holding a copy of the fd must not keep the
            # connection open
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                s.close()
            except OSError:
                pass


class TcpProxy:
    """Forward 127.0.0.1:``port`` to 127.0.0.1:``upstream_port`` until ``stop()``.

    Args:
        upstream_port: the port of the server on 127.0.0.1 (a redis-server).

    Attributes:
        port: the proxy's own port (a free one); ``url`` gives a Redis URL for it.
    """

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self.port = int(self._listener.getsockname()[1])
        self._forwarding = threading.Event()
        self._forwarding.set()
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._pairs: list[_Pair] = []
        self._threads: list[threading.Thread] = []
        self.cuts = 0
        self.connections = 0
        self._spawn(self._accept_loop, "tcp-proxy-accept")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def is_cut(self) -> bool:
        return not self._forwarding.is_set()

    # -- control ------------------------------------------------------------------------
    def cut(self) -> None:
        """Stop forwarding: every byte in either direction is held, nothing is closed."""
        with self._lock:
            self.cuts += 1
            self._forwarding.clear()

    def restore(self, deliver: bool = True) -> None:
        """Forward again.

        Args:
            deliver: deliver what was held during the cut (late); False closes every
                connection that was open during the cut instead (its bytes are dropped).
        """
        with self._lock:
            if not deliver:
                for pair in self._pairs:
                    pair.close()
                self._pairs = []
            self._forwarding.set()

    def stop(self) -> None:
        """Close the listener and every connection; join the threads. Idempotent."""
        self._stopped.set()
        self._forwarding.set()
        try:
            self._listener.close()
        except OSError:
            pass
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            pair.close()
        for t in list(self._threads):
            t.join(5.0)

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- the threads --------------------------------------------------------------------
    def _spawn(self, target, name: str, *args) -> None:  # type: ignore[no-untyped-def]
        t = threading.Thread(target=target, args=args, name=name, daemon=True)
        with self._lock:
            self._threads = [x for x in self._threads if x.is_alive()]
            self._threads.append(t)
        t.start()

    def _gate(self, pair: _Pair) -> bool:
        """Wait while cut; False once the pair or the proxy is closed."""
        while not self._forwarding.wait(_POLL_S):
            if self._stopped.is_set() or pair.closed.is_set():
                return False
        return not (self._stopped.is_set() or pair.closed.is_set())

    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            try:
                ready, _, _ = select.select([self._listener], [], [], _POLL_S)
                if not ready:
                    continue
                conn, _ = self._listener.accept()
            except (OSError, ValueError):
                return
            pair = _Pair(conn)
            with self._lock:
                if self._stopped.is_set():
                    conn.close()
                    return
                self._pairs.append(pair)
                self.connections += 1
            self._spawn(self._connect_and_pump, "tcp-proxy-conn", pair)

    def _connect_and_pump(self, pair: _Pair) -> None:
        # a connection accepted during a cut reaches nothing until the cut ends
        if not self._gate(pair):
            pair.close()
            return
        try:
            pair.upstream = socket.create_connection(("127.0.0.1", self.upstream_port), 5.0)
            pair.upstream.settimeout(None)
        except OSError:
            pair.close()
            return
        self._spawn(self._pump, "tcp-proxy-up", pair, pair.client, pair.upstream)
        self._pump(pair, pair.upstream, pair.client)

    def _pump(self, pair: _Pair, src: socket.socket, dst: socket.socket) -> None:
        try:
            while not pair.closed.is_set():
                # hold: while cut, read nothing more (what was read waits at the gate)
                if not self._gate(pair):
                    break
                ready, _, _ = select.select([src], [], [], _POLL_S)
                if not ready:
                    continue
                data = src.recv(65536)
                if not data:
                    break
                if not self._gate(pair):
                    break
                dst.sendall(data)
        except (OSError, ValueError):
            pass
        pair.close()
        with self._lock:
            if pair in self._pairs:
                self._pairs.remove(pair)
