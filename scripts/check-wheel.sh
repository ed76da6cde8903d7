#!/usr/bin/env bash
# Two checks of what a user installs, each in a fresh virtualenv, not the editable install
# the suite uses (which hides a package missing from the wheel):
# 1. the wheel built and every module of it imported; this venv sees the dependencies of
#    .venv through a .pth line (nothing is downloaded) but not its editable taskq: a .pth
#    line only adds a directory, whose own .pth files are not run;
# 2. README.md's install line, as written, run in a copy of the checkout by a new venv's
#    own pip (the distribution taskq-ml with its extras), then `import taskq`,
#    `taskq.torch` and a short `taskq demo` from that venv. torch is pinned to the build
#    the suite uses (scripts/test-constraints.txt through PIP_CONSTRAINT: the line itself
#    is not changed), which pip takes from this machine's disk or its cache.
# Usage: scripts/check-wheel.sh   (from `make test`; 1-2 minutes, mostly installing torch)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# from a copy of what the wheel is built from: a build/ left in the tree would add stale
# packages
mkdir "$tmp/src"
cp -r pyproject.toml setup.py README.md taskq cli "$tmp/src/"
find "$tmp/src" -name __pycache__ -prune -exec rm -rf {} +
if ! .venv/bin/python -m pip wheel -q --no-deps --no-build-isolation -w "$tmp/dist" "$tmp/src" \
        >"$tmp/build.log" 2>&1; then
    cat "$tmp/build.log" >&2
    exit 1
fi
wheel=$(ls "$tmp"/dist/taskq_ml-*.whl)
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

# 2. README.md's install line, in the Install section's code block
line=$(awk '/^## Install/{s=1} s&&/^```$/{n++; next} s&&n==1&&/^pip install /{print; exit}' \
    "$root/README.md")
if [[ -z $line ]]; then
    echo "taskq: no pip install line in README.md's Install section" >&2
    exit 1
fi
cmd=${line%%#*}
cmd=${cmd%"${cmd##*[![:space:]]}"}  # the comment and the spaces before it
"$root/.venv/bin/python" -m venv "$tmp/user"
if ! (cd "$tmp/src" && PATH="$tmp/user/bin:$PATH" PIP_CONSTRAINT="$root/scripts/test-constraints.txt" \
        PIP_DISABLE_PIP_VERSION_CHECK=1 bash -c "$cmd") >"$tmp/install.log" 2>&1; then
    tail -n 30 "$tmp/install.log" >&2
    echo "taskq: README.md's install line failed in a fresh venv: $cmd" >&2
    exit 1
fi
"$tmp/user/bin/python" - "$root" <<'PY'
import os
import sys

import taskq

if os.path.realpath(taskq.__file__).startswith(os.path.realpath(sys.argv[1]) + os.sep):
    sys.exit(f"taskq was imported from the source tree ({taskq.__file__})")
assert "torch" not in sys.modules, "import taskq imported torch"
taskq.torch.DataLoader  # noqa: B018 - the lazy attribute, after a plain `import taskq`
PY
"$tmp/user/bin/taskq" demo --tasks 12 --passes 2 --trainers 2 --step 0.02 >"$tmp/demo.log" 2>&1 || {
    cat "$tmp/demo.log" >&2
    echo "taskq: the demo failed in the venv made by README.md's install line" >&2
    exit 1
}
echo "taskq: README.md's install line ($cmd) installs taskq-ml; taskq, taskq.torch and the demo run"
