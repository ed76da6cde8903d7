"""Shared by the taskq.torch tests: real JSONL files and a reader over them."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import taskq


def write_jsonl(directory: Path, files: int, lines: int | list[int]) -> list[dict[str, Any]]:
    """``files`` JSONL files of ``{"f": file, "i": line}`` rows; their chunk descriptors."""
    directory.mkdir(parents=True, exist_ok=True)
    chunks = []
    for f in range(files):
        n = lines[f] if isinstance(lines, list) else lines
        path = directory / f"part-{f:04d}.jsonl"
        path.write_text("".join(json.dumps({"f": f, "i": i}) + "\n" for i in range(n)))
        chunks.append({"path": str(path), "n": n})
    return chunks


def jsonl_reader(chunks: list[dict[str, Any]], start: int) -> Iterator[dict[str, int]]:
    """Rows of a task's files, from row ``start`` (module level: picklable for spawn)."""
    k = 0
    for chunk in chunks:
        with open(chunk["path"]) as f:
            for line in f:
                if k >= start:
                    yield json.loads(line)
                k += 1


def make_job(client: taskq.Client, name: str, chunks: list[dict[str, Any]],
             **kw: Any) -> None:
    kw.setdefault("worker_ttl", 2.0)
    kw.setdefault("heartbeat_interval", 0.3)
    client.create_job(name, chunks, **kw)


def rows_of(batch: dict[str, Any]) -> list[tuple[int, int]]:
    """The (file, line) pairs of a default-collated batch."""
    return list(zip(batch["f"].tolist(), batch["i"].tolist(), strict=True))


def per_file(rows: list[tuple[int, int]]) -> Counter[int]:
    return Counter(f for f, _ in rows)
