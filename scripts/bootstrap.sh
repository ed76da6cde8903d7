#!/usr/bin/env bash
# Prepare a fresh machine for the README's two commands: a virtualenv with taskq
# installed (editable) and a redis-server binary on PATH.
# Usage: scripts/bootstrap.sh [--demo] [--with-prometheus] [--with-valkey]
#   (default)          taskq with the dev, data, torch and frameworks extras (`make test`)
#   --demo             taskq alone: what `taskq demo` runs (redis-py, click, rich,
#                      prometheus-client); a later run without it adds the extras
#   --with-prometheus  promtool too (the deploy-file tests)
#   --with-valkey      valkey-server and valkey-cli 8 too (`make test` runs a subset on Valkey);
#                      on Debian 12 they come from bookworm-backports, added only if needed.
set -euo pipefail
cd "$(dirname "$0")/.."

with_prometheus=0
with_valkey=0
demo=0
for arg in "$@"; do
    case $arg in
        --demo) demo=1 ;;
        --with-prometheus) with_prometheus=1 ;;
        --with-valkey) with_valkey=1 ;;
        *) echo "taskq: bootstrap: unknown option $arg" >&2; exit 2 ;;
    esac
done

can_apt() { command -v apt-get >/dev/null 2>&1 && [[ $(id -u) == 0 ]]; }

apt_install() {  # apt_install [apt-get options] PACKAGE...
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
    # Debian starts the packaged services; taskq starts its own servers on free ports.
    (service redis-server stop || true; service prometheus stop || true
     service valkey-server stop || true) >/dev/null 2>&1
}

need_pkgs=()
command -v redis-server >/dev/null 2>&1 || need_pkgs+=(redis-server)
if ((with_prometheus)); then
    command -v promtool >/dev/null 2>&1 || need_pkgs+=(prometheus)
fi
if ((${#need_pkgs[@]})); then
    if can_apt; then
        echo "taskq: installing ${need_pkgs[*]} with apt-get" >&2
        apt-get update -qq >/dev/null
        apt_install "${need_pkgs[@]}"
    else
        echo "taskq: ${need_pkgs[*]} missing; install with: sudo apt-get install -y ${need_pkgs[*]}" >&2
        exit 1
    fi
fi

if ((with_valkey)) && ! { command -v valkey-server && command -v valkey-cli; } >/dev/null 2>&1; then
    valkey_missing="taskq: valkey-server and valkey-cli (Valkey 8) are needed: make test runs a subset of the suite on Valkey"
    if ! can_apt; then
        echo "$valkey_missing; install with: sudo apt-get install -y valkey-server valkey-tools" \
             "(Debian 12: from bookworm-backports)" >&2
        exit 1
    fi
    echo "taskq: installing valkey-server valkey-tools with apt-get" >&2
    apt-get update -qq >/dev/null
    target=()
    codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
    if ! apt-cache show valkey-server >/dev/null 2>&1 && [[ $codename == bookworm ]]; then
        echo "taskq: adding bookworm-backports (Valkey 8 is there for Debian 12)" >&2
        cat >/etc/apt/sources.list.d/debian-backports.sources <<'EOF'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
        apt-get update -qq >/dev/null
        target=(-t bookworm-backports)
    fi
    if ! apt_install "${target[@]}" valkey-server valkey-tools ||
       ! command -v valkey-server >/dev/null 2>&1; then
        echo "$valkey_missing, and apt-get could not install them here ($codename)" >&2
        exit 1
    fi
fi

PY=${PYTHON:-python3}
if [[ ! -x .venv/bin/python ]]; then
    "$PY" -m venv .venv
fi
# what is installed: .taskq-installed for the full set, .taskq-installed-demo for taskq alone
full_stamp=.venv/.taskq-installed
demo_stamp=.venv/.taskq-installed-demo
fresh() { [[ -f $1 && ! pyproject.toml -nt $1 ]]; }
if fresh "$full_stamp"; then
    exit 0
elif ((demo)); then
    if fresh "$demo_stamp"; then
        exit 0
    fi
    target=. stamp=$demo_stamp
else
    target='.[dev,data,torch,frameworks]' stamp=$full_stamp
fi
echo "taskq: installing $target into .venv (log: .venv/pip.log)" >&2
# a .venv made when the distribution was still called taskq (PyPI's taskq is another
# project): two editable installs of one package would shadow each other
if .venv/bin/python -m pip show -q taskq >/dev/null 2>&1; then
    .venv/bin/python -m pip uninstall -q -y taskq >/dev/null
fi
if ! { .venv/bin/python -m pip install --upgrade pip &&
       .venv/bin/python -m pip install -e "$target" -c scripts/test-constraints.txt; } >.venv/pip.log 2>&1; then
    tail -n 30 .venv/pip.log >&2
    echo "taskq: pip install failed; see .venv/pip.log" >&2
    exit 1
fi
touch "$stamp"
