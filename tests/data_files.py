"""Real data files for the taskq.data tests (pyarrow writes Parquet, tarfile writes tar
shards) and a tiny HTTP server that serves byte ranges, bound to 127.0.0.1."""

from __future__ import annotations

import http.server
import io
import os
import re
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq


def write_parquet(path: Path, rows: int, row_group_size: int, start: int = 0) -> str:
    """A Parquet file of ``rows`` rows ``{"i": n, "s": "row n", "f": n / 2}``."""
    ids = list(range(start, start + rows))
    table = pa.table({"i": ids, "s": [f"row {n}" for n in ids], "f": [n / 2 for n in ids]})
    pq.write_table(table, str(path), row_group_size=row_group_size)
    return str(path)


def write_shard(path: Path, samples: list[dict[str, bytes]], gz: bool = False) -> str:
    """A tar shard in the WebDataset layout: members ``<key>.<ext>`` in sample order."""
    with tarfile.open(str(path), "w:gz" if gz else "w") as tf:
        for sample in samples:
            key = (
                sample["__key__"].decode()
                if isinstance(sample["__key__"], bytes)
                else str(sample["__key__"])
            )
            for ext, data in sample.items():
                if ext == "__key__":
                    continue
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return str(path)


def shard_samples(n: int, first: int = 0) -> list[dict[str, Any]]:
    """``n`` samples with a jpg, a cls and (every third one) a json member."""
    out: list[dict[str, Any]] = []
    for i in range(first, first + n):
        sample: dict[str, Any] = {
            "__key__": f"s{i:05d}",
            "jpg": os.urandom(10 + i % 700),
            "cls": str(i % 10).encode(),
        }
        if i % 3 == 0:
            sample["json"] = b'{"i": %d}' % i
        out.append(sample)
    return out


class RangeServer:
    """Serves the files of one directory over HTTP with ``Range: bytes=a-b`` support
    (206 + Content-Range), HEAD with Content-Length and ``Accept-Ranges: bytes``. Records
    every request's range; stops with ``close()`` (the test fixture) and its thread is a
    daemon, so it never outlives the test process."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, range)
        self.marks: list[str | None] = []  # each request's X-Test header
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                return None

            def _file(self) -> bytes | None:
                path = server.root / self.path.lstrip("/")
                return path.read_bytes() if path.is_file() else None

            def do_HEAD(self) -> None:  # noqa: N802 -- http.server's naming
                server.requests.append(("HEAD", self.path, None))
                server.marks.append(self.headers.get("X-Test"))
                data = self._file()
                if data is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Accept-Ranges", "bytes")
                self.end_headers()

            def do_GET(self) -> None:  # noqa: N802 -- http.server's naming
                wanted = self.headers.get("Range")
                server.requests.append(("GET", self.path, wanted))
                server.marks.append(self.headers.get("X-Test"))
                data = self._file()
                if data is None:
                    self.send_error(404)
                    return
                m = re.fullmatch(r"bytes=(\d+)-(\d*)", wanted or "")
                if not m:
                    self.send_response(200)
                    body = data
                else:
                    lo = int(m.group(1))
                    hi = min(int(m.group(2)) if m.group(2) else len(data) - 1, len(data) - 1)
                    if lo >= len(data):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(data)}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    body = data[lo : hi + 1]
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {lo}-{hi}/{len(data)}")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Accept-Ranges", "bytes")
                self.end_headers()
                self.wfile.write(body)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)

    def ranges(self, name: str) -> list[str | None]:
        """The Range headers of the GETs of ``/name`` so far."""
        return [r for method, path, r in self.requests if method == "GET" and path == f"/{name}"]


def range_server(root: Path) -> Iterator[RangeServer]:
    """A RangeServer for a fixture: yields it, then stops it."""
    server = RangeServer(root)
    try:
        yield server
    finally:
        server.close()
