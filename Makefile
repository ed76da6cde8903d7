# The README's two commands live here: `make demo` and `make test` (which also builds the
# wheel and imports every module from it in a fresh venv: scripts/check-wheel.sh).
.PHONY: demo test test-valkey test-frameworks lint bench clean

# The subset `make test` also runs against Valkey 8 (~2 min): the engine, the trainer, the
# reaper, the cluster and the Redis chaos scenarios (one seed of the random schedule).
VALKEY_TESTS = tests/test_engine.py tests/test_trainer.py tests/test_reaper.py \
	tests/test_cluster.py tests/test_chaos_redis.py
VALKEY_SELECT = not 1234 and not 99001

# taskq alone (no torch, no extras): the demo needs nothing more
demo:
	@scripts/bootstrap.sh --demo
	@.venv/bin/taskq demo

test:
	@scripts/bootstrap.sh --with-prometheus --with-valkey
	@.venv/bin/ruff check taskq cli tests bench
	@.venv/bin/ruff format --check taskq cli tests bench
	@.venv/bin/mypy -p taskq
	@.venv/bin/mypy cli
	@scripts/check-wheel.sh
	@$(MAKE) --no-print-directory test-valkey
	@$(MAKE) --no-print-directory test-frameworks
	@echo "taskq: the whole suite on redis-server (2 pytest-xdist workers, each its own server)"
	@scripts/run-tests.sh -n 2 --dist worksteal --durations=10 --ignore=tests/test_frameworks.py

# Lightning, accelerate and the HF Trainer over taskq.torch.DataLoader, on CPU (~70 s):
# docs/frameworks.md. The frameworks extra is installed by scripts/bootstrap.sh.
test-frameworks:
	@scripts/bootstrap.sh
	@echo "taskq: the training frameworks' loops (Lightning, accelerate, transformers)"
	@scripts/run-tests.sh -q tests/test_frameworks.py

test-valkey:
	@scripts/bootstrap.sh --with-valkey
	@echo "taskq: the Valkey subset on $$(valkey-server --version)"
	@TASKQ_TEST_SERVER=valkey-server scripts/run-tests.sh -q $(VALKEY_TESTS) -k '$(VALKEY_SELECT)'

bench:
	@scripts/bootstrap.sh
	@.venv/bin/python -m pip install -q -e '.[dev,bench,fast]'
	@.venv/bin/python bench/run.py --quick

lint:
	@.venv/bin/ruff check taskq cli tests bench
	@.venv/bin/ruff format --check taskq cli tests bench
	@.venv/bin/mypy -p taskq
	@.venv/bin/mypy cli

clean:
	rm -rf .venv build *.egg-info .pytest_cache .mypy_cache .ruff_cache
