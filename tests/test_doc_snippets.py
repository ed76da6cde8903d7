"""Every ```python block of README.md and docs/*.md runs as written, against the suite's
real redis-server, each in a fresh interpreter under a key prefix of its own.

A block runs after a short prelude that stands in for what its page says the reader has:
``import taskq``, ``url`` / ``URL`` (also ``TASKQ_REDIS_URL``), ``client``, data files
(``files``, and their ``chunks`` from ``taskq.data.build_chunks``: Parquet rows with
``text``, ``label``, ``f``, ``i``) and the reader's own functions (``train_on``,
``train_step``, ``step``, ``tokenize``, ...), which do nothing. An HTML comment on the line
before a block says what else it needs:

- ``<!-- snippet: job=NAME -->``: a job NAME over those files exists;
- ``<!-- snippet: trainer=NAME -->``: that job, and ``trainer = taskq.Trainer(NAME)``
  (closed after the block): for a block that is a loop's body;
- ``<!-- snippet: skip: WHY -->``: deliberately partial (a training script's ``model``, a
  process group): not run, and WHY must say where it is tested instead.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
DIRECTIVE = re.compile(r"<!-- snippet: (.*) -->")

PRELUDE = """
import os
import taskq

url = URL = os.environ["TASKQ_REDIS_URL"]
client = taskq.connect()
files = sorted(os.path.join(os.environ["SNIPPET_DATA"], f)
               for f in os.listdir(os.environ["SNIPPET_DATA"]))
chunks = taskq.data.build_chunks(os.path.join(os.environ["SNIPPET_DATA"], "*.parquet"))


def _nothing(*args, **kwargs):
    return None


train_on = train_step = step = train = evaluate = checkpoint = _nothing
tokenize = lambda sample: sample  # noqa: E731
good_enough = lambda: True  # noqa: E731
"""


@dataclass
class Block:
    page: str
    line: int
    code: str
    jobs: list[str] = field(default_factory=list)
    trainer: str | None = None
    skip: str | None = None

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line}"


def blocks() -> list[Block]:
    """Every python block of the pages, with its directives."""
    found = []
    for path in PAGES:
        text = path.read_text().splitlines()
        for n, line in enumerate(text):
            if line.strip() != "```python":
                continue
            end = next(i for i in range(n + 1, len(text)) if text[i].strip() == "```")
            block = Block(str(path.relative_to(ROOT)), n + 1, "\n".join(text[n + 1 : end]))
            m = DIRECTIVE.fullmatch(text[n - 1].strip()) if n else None
            if m:
                words = m.group(1)
                if words.startswith("skip:"):
                    block.skip = words[len("skip:") :].strip()
                else:
                    for word in words.split():
                        key, _, value = word.partition("=")
                        if key == "job":
                            block.jobs.append(value)
                        elif key == "trainer":
                            block.jobs.append(value)
                            block.trainer = value
                        else:
                            raise AssertionError(f"{block.name}: unknown directive {word!r}")
            found.append(block)
    return found


def test_every_block_is_run_or_says_why_not() -> None:
    every = blocks()
    assert len(every) >= 15, [b.name for b in every]
    for b in every:
        if b.skip is not None:
            assert len(b.skip) > 20 and "test" in b.skip, f"{b.name}: say why, and where tested"
    assert sum(b.skip is None for b in every) >= 10


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("snippet-data")
    for f in range(5):  # 10 chunks: enough for docs/sharding.md's 8 shards
        rows = [{"text": f"row {f}-{i}", "label": i % 2, "f": f, "i": i} for i in range(8)]
        pq.write_table(pa.Table.from_pylist(rows), root / f"part-{f}.parquet", row_group_size=4)
    return root


@pytest.mark.parametrize("block", [b for b in blocks() if b.skip is None], ids=lambda b: b.name)
def test_snippet_runs(block: Block, url: str, data_dir: Path, tmp_path: Path) -> None:
    setup = "".join(
        f"client.create_job({job!r}, chunks, worker_ttl=2.0, heartbeat_interval=0.3)\n"
        for job in block.jobs
    )
    if block.trainer:
        setup += f"trainer = taskq.Trainer({block.trainer!r})\n"
    code = PRELUDE + setup + f"# {block.name}\n" + textwrap.dedent(block.code) + "\n"
    if block.trainer:
        code += "trainer.close()\n"
    script = tmp_path / "snippet.py"
    script.write_text(code)
    env = dict(
        os.environ,
        TASKQ_REDIS_URL=url,
        TASKQ_PREFIX=f"snip-{uuid.uuid4().hex[:8]}",
        SNIPPET_DATA=str(data_dir),
    )
    r = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert r.returncode == 0, f"{block.name} failed:\n{r.stderr[-3000:]}"
