"""``taskq dev cluster`` through the installed entry point: a local 3-master cluster in one
command, a sharded job through it spread over the masters, and Ctrl-C stopping every
node."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
import redis
from support import ENTRY_POINT, wait_until

import taskq


@pytest.mark.slow
def test_dev_cluster_serves_a_sharded_job_and_ctrl_c_stops_every_node(tmp_path: Path) -> None:
    """The first line printed is the URL to export; a job made with ``--shards 3`` through
    it has one shard on each master and a trainer completes it, every task acked once;
    SIGINT (Ctrl-C) ends the command with exit 0 and no node answers any more."""
    out, err = tmp_path / "out", tmp_path / "err"
    with open(out, "w") as o, open(err, "w") as e:
        proc = subprocess.Popen(
            [ENTRY_POINT, "dev", "cluster"], stdout=o, stderr=e, cwd=tmp_path, text=True
        )
    try:
        assert wait_until(lambda: "\n" in out.read_text(), timeout=60, interval=0.1), (
            err.read_text()
        )
        line = out.read_text().splitlines()[0]
        assert line.startswith("export TASKQ_REDIS_URL=redis+cluster://127.0.0.1:"), line
        url = line.partition("=")[2]
        ports = [int(p) for p in err.read_text().split("ports ")[1].split(";")[0].split(", ")]
        assert len(ports) == 3

        data = tmp_path / "data"
        data.mkdir()
        for f in range(6):
            (data / f"part-{f}.jsonl").write_text("".join(f'{{"x": {i}}}\n' for i in range(5)))
        env = dict(os.environ, TASKQ_REDIS_URL=url)
        created = subprocess.run(
            [
                ENTRY_POINT,
                "job",
                "create",
                "web",
                "--files",
                str(data / "*.jsonl"),
                "--shards",
                "3",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert created.returncode == 0, created.stderr
        client = taskq.connect(url)
        status = client.job("web").status()
        assert sorted(int(m.rpartition(":")[2]) for m in status.masters) == sorted(ports)
        with taskq.Trainer("web", url=url) as trainer:
            for _task in trainer:
                pass
        audit = client.audit("web")
        assert audit["ok"], audit["checks"]
        assert [p["done"] for p in audit["passes"]] == [6]
        assert client.job("web").status().state == "completed"

        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0, err.read_text()
        assert "the local cluster is stopped" in err.read_text()
        for port in ports:
            with pytest.raises(redis.exceptions.ConnectionError):
                redis.Redis(host="127.0.0.1", port=port, socket_timeout=1).ping()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
