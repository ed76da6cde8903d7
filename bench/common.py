"""Shared plumbing for the bench suite: private redis-servers, statistics, the result table.

Where it sits: every bench module (ceiling, probe, peers/*, taskq_rows) starts its Redis
through `start_redis()` and reports through a `Recorder`; `run.py` owns the recorder and
writes `bench/results/latest.json` and `latest.md`. Nothing here ever talks to a Redis
it did not start, and nothing targets anything but 127.0.0.1.
"""

from __future__ import annotations

import atexit
import datetime as dt
import json
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import redis

from taskq import devserver

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"
LOOPBACK = devserver.LOOPBACK

# Every server this process started; stopped at exit and on SIGTERM (cleanup is idempotent).
_live_servers: list[RedisServer] = []


class RedisServer(devserver.RedisServer):
    """The package's local server, seen as the bench uses it: raw-bytes clients (rq needs
    them) and ``process`` for psutil."""

    @property
    def process(self) -> subprocess.Popen[bytes]:
        assert self.proc is not None
        return self.proc

    def client(self, **kwargs: object) -> redis.Redis:
        """Returns a redis-py client for this server (extra kwargs go to `redis.Redis`)."""
        kwargs.setdefault("decode_responses", False)
        return super().client(**kwargs)


def start_redis(extra_args: Sequence[str] = ()) -> RedisServer:
    """Starts a private server (`$TASKQ_TEST_SERVER`, default redis-server) on a free
    loopback port in a fresh temp dir.

    Args:
        extra_args: more server arguments, e.g. ("--maxclients", "2000"); no persistence.

    Returns:
        The running server; call `.cleanup()` (or use it as a context manager).

    Raises:
        taskq.TaskqError: the binary is missing or the server did not start (3 ports tried).
    """
    server = RedisServer(extra=extra_args)
    _live_servers.append(server)
    return server


def prioritise(server: devserver.RedisServer, nice: int = 0, fifo: int = 0) -> None:
    """Keeps a neighbour's load from descheduling the server in the middle of a call.

    SLOWLOG counts a call's wall time, so on a machine shared with other jobs it counts
    the time the server waited for a core as well; raised here, what it keeps is the
    calls' own work. Both need root (or CAP_SYS_NICE); the server's main thread, which
    runs every command, is the one raised.

    Args:
        server: a running server this process started.
        nice: its nice value (< 0: ahead of the neighbours, which are still scheduled
            beside it); 0 leaves it.
        fifo: run it under SCHED_FIFO at this priority (1-99): no process of the ordinary
            class preempts it, so it is never descheduled for a neighbour even at a load
            of many times the cores (the kernel's real-time throttling still leaves the
            others 5 % of its core; the server waits in epoll between calls); 0 leaves it.

    Raises:
        PermissionError: not permitted (neither root nor CAP_SYS_NICE).
    """
    assert server.proc is not None
    if nice:
        os.setpriority(os.PRIO_PROCESS, server.proc.pid, nice)
    if fifo:
        os.sched_setscheduler(server.proc.pid, os.SCHED_FIFO, os.sched_param(fifo))


def redis_port_factory() -> tuple[int, Callable[[], None]]:
    """Starts a fresh private redis-server and returns (port, stop_fn)."""
    server = start_redis()
    return server.port, server.cleanup


def stop_all_servers() -> None:
    """Stops every redis-server this process started and has not stopped yet."""
    while _live_servers:
        _live_servers.pop().cleanup()


def _on_sigterm(signum, frame) -> None:
    # Turn SIGTERM into the same unwinding as Ctrl-C, so `finally` blocks stop children.
    raise KeyboardInterrupt


atexit.register(stop_all_servers)


def install_signal_handlers() -> None:
    """Makes SIGTERM and SIGINT unwind as KeyboardInterrupt (call once, in the main process).

    SIGINT is set explicitly because a shell starting the bench in the background leaves it
    ignored, and Python then never raises KeyboardInterrupt.
    """
    signal.signal(signal.SIGTERM, _on_sigterm)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def percentile(values: Sequence[float], pct: float) -> float:
    """Returns the pct-th percentile (0..100) by linear interpolation between closest ranks.

    Raises:
        ValueError: values is empty or pct is outside 0..100.
    """
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= pct <= 100:
        raise ValueError(f"pct must be within 0..100, got {pct}")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * pct / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def command_rate(port: int, window_s: float) -> tuple[float, dict[str, int]]:
    """Measures what a server executes while left alone for `window_s` seconds.

    Used for the idle-cost row: start idle trainers/reapers, then call this.
    The two INFO calls this makes are subtracted.

    Args:
        port: a redis-server on 127.0.0.1 that this bench started.
        window_s: how long to watch.

    Returns:
        (commands per second, {command name: calls during the window}).
    """
    client = redis.Redis(host=LOOPBACK, port=port)
    try:
        before_total = int(client.info("stats")["total_commands_processed"])
        before_cmds = _command_calls(client)
        started = time.monotonic()
        time.sleep(window_s)
        after_cmds = _command_calls(client)
        after_total = int(client.info("stats")["total_commands_processed"])
        elapsed = time.monotonic() - started
    finally:
        client.close()
    # One INFO commandstats and one INFO stats fall inside the window.
    own_calls = 2
    per_command = {
        name: calls - before_cmds.get(name, 0)
        for name, calls in after_cmds.items()
        if calls - before_cmds.get(name, 0) > 0
    }
    if "info" in per_command:
        per_command["info"] -= own_calls
        if per_command["info"] <= 0:
            del per_command["info"]
    return max(after_total - before_total - own_calls, 0) / elapsed, per_command


def _command_calls(client: redis.Redis) -> dict[str, int]:
    stats = client.info("commandstats")
    return {key.removeprefix("cmdstat_"): int(value["calls"]) for key, value in stats.items()}


def machine_info() -> dict[str, str]:
    """Returns nproc, CPU model, kernel, Python, Redis, rq and Node versions where present."""
    cpu_model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {
        "nproc": str(os.cpu_count()),
        "cpu": cpu_model,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "redis": _redis_version(),
        "node": _first_line(["node", "--version"]),
    }
    try:
        import rq

        info["rq"] = rq.__version__
    except ImportError:
        info["rq"] = "not installed"
    return info


def _redis_version() -> str:
    line = _first_line(["redis-server", "--version"])
    for word in line.split():
        if word.startswith("v="):
            return "Redis " + word[2:]
    return line


def _first_line(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "absent"
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr) else ""


class Recorder:
    """Collects result rows and merges them into bench/results/latest.{json,md}.

    A row is {section, name, value, unit, note}. The rows of a section that produced rows in
    this run replace all its stored rows; other sections' rows are kept, so `--only` updates
    in place.
    """

    def __init__(self, results_dir: Path = RESULTS_DIR, mode: str = "quick") -> None:
        self.results_dir = results_dir
        self.mode = mode
        self.rows: list[dict] = []

    def add(
        self,
        section: str,
        name: str,
        value: float | None,
        unit: str,
        note: str = "",
        vs_bullmq: float | None = None,
    ) -> dict:
        """Records one row (value None means "not measured"; say why in note) and prints it.

        vs_bullmq: the row's rate over BullMQ's of the same shape, measured in the same run
        (the table's 'taskq / BullMQ' column).
        """
        row = {"section": section, "name": name, "value": value, "unit": unit, "note": note}
        if vs_bullmq is not None:
            row["vs_bullmq"] = vs_bullmq
        self.rows.append(row)
        ratio = f" ({vs_bullmq:.2f}x BullMQ)" if vs_bullmq is not None else ""
        print(
            f"  [{section}] {name}: {_format_value(value)} {unit}{ratio}  {note}".rstrip(),
            flush=True,
        )
        return row

    def write(self) -> str:
        """Merges this run's rows into latest.json, renders latest.md, returns the table."""
        self.results_dir.mkdir(parents=True, exist_ok=True)
        json_path = self.results_dir / "latest.json"
        stored: list[dict] = []
        if json_path.exists():
            try:
                stored = json.loads(json_path.read_text()).get("rows", [])
            except (ValueError, AttributeError):
                stored = []
        fresh_sections = {row["section"] for row in self.rows}
        merged = [row for row in stored if row.get("section") not in fresh_sections]
        merged += self.rows
        merged.sort(key=lambda row: SECTION_ORDER.get(row["section"], 99))
        document = {
            "written_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "mode": self.mode,
            "machine": machine_info(),
            "rows": merged,
        }
        json_path.write_text(json.dumps(document, indent=2) + "\n")
        table = render_markdown(document)
        (self.results_dir / "latest.md").write_text(table)
        return table


SECTION_ORDER = {"ceiling": 0, "probe": 1, "taskq": 2, "steady": 3, "rq": 4, "bullmq": 5}


def render_markdown(document: dict) -> str:
    """Renders a results document as a markdown header plus one table."""
    machine = document.get("machine", {})
    lines = [
        f"Measured {document.get('written_at', '?')} ({document.get('mode', '?')} mode) on "
        f"{machine.get('nproc', '?')} x {machine.get('cpu', '?')}, {machine.get('redis', '?')}, "
        f"Python {machine.get('python', '?')}, rq {machine.get('rq', '?')}, "
        f"Node {machine.get('node', '?')}.",
        "",
        "| section | name | value | unit | taskq / BullMQ | note |",
        "|---|---|---:|---|---:|---|",
    ]
    for row in document.get("rows", []):
        note = str(row.get("note", "")).replace("|", "/")
        ratio = f"{row['vs_bullmq']:.2f}x" if row.get("vs_bullmq") is not None else ""
        lines.append(
            f"| {row['section']} | {row['name']} | {_format_value(row['value'])} "
            f"| {row['unit']} | {ratio} | {note} |"
        )
    return "\n".join(lines) + "\n"


def _format_value(value: float | None) -> str:
    if value is None:
        return "—"
    if isinstance(value, float) and not value.is_integer() and abs(value) < 100:
        return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"
    return f"{value:,.0f}"


def json_rows_of(
    script: str, args: Sequence[str], code_dir: str = "", timeout: float = 900, **env: str
) -> list[dict]:
    """Run ``script`` with ``args`` in a fresh interpreter (the code of ``code_dir`` first
    on the path when given: a "before" tree) and return the JSON objects it printed, one
    per line.

    Raises:
        RuntimeError: the run exited non-zero (the end of its stderr is in the message).
    """
    full_env = dict(os.environ, **env)
    if code_dir:
        full_env["PYTHONPATH"] = os.pathsep.join([code_dir, full_env.get("PYTHONPATH", "")])
    out = subprocess.run(
        [sys.executable, script, *args],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if out.returncode != 0:
        raise RuntimeError(
            f"{Path(script).name} {' '.join(args)} exited {out.returncode}: {out.stderr[-800:]}"
        )
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
