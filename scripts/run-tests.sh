#!/usr/bin/env bash
# Run the test suite; pytest's "no tests collected" (exit 5) is a failure here.
set -uo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m pytest "$@"
rc=$?
if [[ $rc == 5 ]]; then
    echo "taskq: pytest collected no tests" >&2
    exit 1
fi
exit $rc
