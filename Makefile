# The README's two commands live here: `make demo` and `make test`.
.PHONY: demo test lint bench clean

demo:
	@scripts/bootstrap.sh
	@.venv/bin/taskq demo

test:
	@scripts/bootstrap.sh --with-prometheus
	@.venv/bin/ruff check taskq cli tests bench
	@.venv/bin/mypy -p taskq
	@.venv/bin/mypy cli
	@scripts/run-tests.sh

bench:
	@scripts/bootstrap.sh
	@.venv/bin/python -m pip install -q -e '.[dev,bench]'
	@.venv/bin/python bench/run.py --quick

lint:
	@.venv/bin/ruff check taskq cli tests bench
	@.venv/bin/ruff format --check taskq cli tests bench
	@.venv/bin/mypy -p taskq
	@.venv/bin/mypy cli

clean:
	rm -rf .venv build *.egg-info .pytest_cache .mypy_cache .ruff_cache
