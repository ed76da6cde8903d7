#!/usr/bin/env bash
# Build the wheel and import every module of it from a fresh virtualenv, not the editable
# install the suite uses (which hides a package missing from the wheel). The fresh venv
# sees the dependencies of .venv through a .pth line (nothing is downloaded) but not its
# editable taskq: a .pth line only adds a directory, whose own .pth files are not run.
# Usage: scripts/check-wheel.sh   (from `make test`; a few seconds)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# from a copy of what the wheel is built from: a build/ left in the tree would add stale
# packages (setuptools warns that taskq/engine/lua is importable: package data; shown on a failure)
mkdir "$tmp/src"
cp -r pyproject.toml setup.py README.md taskq cli "$tmp/src/"
find "$tmp/src" -name __pycache__ -prune -exec rm -rf {} +
if ! .venv/bin/python -m pip wheel -q --no-deps --no-build-isolation -w "$tmp/dist" "$tmp/src" \
        >"$tmp/build.log" 2>&1; then
    cat "$tmp/build.log" >&2
    exit 1
fi
wheel=$(ls "$tmp"/dist/taskq-*.whl)
.venv/bin/python -m venv --without-pip "$tmp/venv"
site=$("$tmp/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
deps=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$deps" >"$site/zz-taskq-deps.pth"
.venv/bin/python -m pip --python "$tmp/venv/bin/python" install -q --no-deps --no-index \
    "$wheel" >/dev/null
cd "$tmp"  # not the source tree: nothing may come from it
"$tmp/venv/bin/python" - "$root" <<'PY'
import importlib
import os
import pkgutil
import sys

import taskq

root = os.path.realpath(sys.argv[1])
if os.path.realpath(taskq.__file__).startswith(root + os.sep):
    sys.exit(f"taskq was imported from the source tree ({taskq.__file__}), not the wheel")
names = ["taskq"] + [m.name for m in pkgutil.walk_packages(taskq.__path__, "taskq.")]
failed = []
for name in names:
    try:
        importlib.import_module(name)
    except Exception as e:  # every module must import from the wheel
        failed.append(f"{name}: {type(e).__name__}: {e}")
needed = {"taskq.torch", "taskq.torchdata.loader", "taskq.data", "taskq.cli.main"}
missing = needed - set(names)
if failed or missing:
    sys.exit("taskq: the wheel is broken:\n  " + "\n  ".join(failed + sorted(missing)))
lua = os.path.join(os.path.dirname(taskq.__file__), "engine", "lua")
if not os.path.isfile(os.path.join(lua, "ack.lua")) or not os.listdir(os.path.join(lua, "lib")):
    sys.exit(f"taskq: the wheel lacks the Lua files ({lua})")
print(f"taskq: the wheel installs and imports all {len(names)} modules")
PY
"$tmp/venv/bin/taskq" --help >/dev/null
