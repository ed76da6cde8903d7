"""Runs the bench suite and writes bench/results/latest.json and latest.md.

Usage: .venv/bin/python bench/run.py --quick|--full [--only SECTION ...] [--max-wait S]

Sections, in order: ceiling, probe, taskq, resume, steady, rq, bullmq. Each starts its own redis-server(s)
on free loopback ports and stops them (also on Ctrl-C / SIGTERM). Rows of sections not run
are kept from the previous latest.json. Never run in CI.

The taskq section exists when `bench/taskq_rows.py` does. Its interface:

    def run(recorder, quick: bool, redis_port_factory) -> None:
        '''Adds taskq rows with recorder.add(section="taskq", name, value, unit, note).

        recorder: common.Recorder.
        quick: True for the quick suite (keep the section under ~2 minutes), False for full.
        redis_port_factory: a no-argument function that starts a fresh private redis-server
            on 127.0.0.1 and returns (port, stop_fn); call stop_fn() when done (servers
            still running at exit are stopped anyway).
        '''
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
import traceback
from pathlib import Path

import ceiling
import common
import probe

SECTIONS = ("ceiling", "probe", "taskq", "resume", "steady", "rq", "bullmq")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="short rows, 1 trial (default)")
    mode.add_argument("--full", action="store_true", help="longer rows, 3 recovery trials")
    parser.add_argument("--only", nargs="+", choices=SECTIONS, help="run only these sections")
    parser.add_argument(
        "--max-wait",
        type=float,
        default=None,
        help="cap on each peer recovery wait, seconds (default 120 quick, 1200 rq / 600 "
        "bullmq full)",
    )
    args = parser.parse_args(argv)
    quick = not args.full
    common.install_signal_handlers()
    recorder = common.Recorder(mode="quick" if quick else "full")
    selected = args.only or list(SECTIONS)
    started = time.monotonic()
    try:
        for section in SECTIONS:
            if section in selected:
                run_section(section, recorder, quick, args.max_wait)
    except KeyboardInterrupt:
        # A half-run section would replace complete rows, so an interrupted run writes nothing.
        print("interrupted: stopped what the bench started, results not written", file=sys.stderr)
        return 130
    finally:
        common.stop_all_servers()
    if recorder.rows:
        table = recorder.write()
        print()
        print(table)
        print(f"wrote {common.RESULTS_DIR / 'latest.json'} and latest.md")
    print(f"bench finished in {time.monotonic() - started:.0f} s")
    return 0


def run_section(section: str, recorder: common.Recorder, quick: bool, max_wait: float | None):
    """Runs one section; an exception becomes a row saying so, the suite goes on."""
    print(f"== {section}", flush=True)
    try:
        if section == "ceiling":
            ceiling.run(recorder, quick)
        elif section == "probe":
            probe.run(recorder, quick)
        elif section == "taskq":
            if not (Path(__file__).resolve().parent / "taskq_rows.py").exists():
                print("  bench/taskq_rows.py not present yet: skipped", flush=True)
                return
            importlib.import_module("taskq_rows").run(recorder, quick, common.redis_port_factory)
        elif section == "resume":
            import reread

            reread.run(recorder, quick, common.redis_port_factory)
        elif section == "steady":
            import steady

            steady.run(recorder, quick)
        elif section == "rq":
            from peers import rq_bench

            rq_bench.run(recorder, quick, max_wait)
        elif section == "bullmq":
            from peers import bullmq_bench

            bullmq_bench.run(recorder, quick, max_wait)
        else:
            raise ValueError(f"unknown section {section!r}")
    except KeyboardInterrupt:
        raise
    except Exception as error:  # one broken peer must not hide the others
        traceback.print_exc()
        recorder.add(section, "section failed", None, "", f"{type(error).__name__}: {error}")
    finally:
        common.stop_all_servers()


if __name__ == "__main__":
    sys.exit(main())
