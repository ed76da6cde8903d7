#!/usr/bin/env bash
# Prepare a fresh machine for the README's two commands: a virtualenv with taskq
# installed (editable, with the dev, data and torch extras) and a redis-server binary on PATH.
# Usage: scripts/bootstrap.sh [--with-prometheus]
set -euo pipefail
cd "$(dirname "$0")/.."

need_pkgs=()
command -v redis-server >/dev/null 2>&1 || need_pkgs+=(redis-server)
if [[ "${1:-}" == "--with-prometheus" ]]; then
    command -v promtool >/dev/null 2>&1 || need_pkgs+=(prometheus)
fi
if ((${#need_pkgs[@]})); then
    if command -v apt-get >/dev/null 2>&1 && [[ $(id -u) == 0 ]]; then
        echo "taskq: installing ${need_pkgs[*]} with apt-get" >&2
        apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
        # Debian starts the packaged services; taskq starts its own servers on free ports.
        (service redis-server stop || true; service prometheus stop || true) >/dev/null 2>&1
    else
        echo "taskq: ${need_pkgs[*]} missing; install with: sudo apt-get install -y ${need_pkgs[*]}" >&2
        exit 1
    fi
fi

PY=${PYTHON:-python3}
if [[ ! -x .venv/bin/python ]]; then
    "$PY" -m venv .venv
fi
stamp=.venv/.taskq-installed
if [[ ! -f $stamp || pyproject.toml -nt $stamp ]]; then
    echo "taskq: installing into .venv (log: .venv/pip.log)" >&2
    if ! { .venv/bin/python -m pip install --upgrade pip &&
           .venv/bin/python -m pip install -e '.[dev,data,torch]' -c scripts/test-constraints.txt; } >.venv/pip.log 2>&1; then
        tail -n 30 .venv/pip.log >&2
        echo "taskq: pip install failed; see .venv/pip.log" >&2
        exit 1
    fi
    touch "$stamp"
fi
