# The README's two commands live here: `make demo` and `make test` (which also builds the
# wheel and imports every module from it in a fresh venv: scripts/check-wheel.sh).
.PHONY: demo test test-valkey test-frameworks lint bench clean

# The subset `make test` also runs against Valkey 8 (~1 min, 2 pytest-xdist workers): the
# engine, the trainer, the reaper, the cluster, the Redis chaos scenarios (one seed of the random schedule) and the
# producer's credential (its ACL selectors: every write but append's refused by the server).
VALKEY_TESTS = tests/engine/test_engine.py tests/trainer/test_trainer.py tests/ops/test_reaper.py \
	tests/admin/test_cluster.py tests/chaos/test_chaos_redis.py \
	tests/ops/test_tenants.py::test_producer_cannot_make_the_writes_it_must_not \
	tests/ops/test_tenants.py::test_producer_credential_appends_to_its_job_only \
	tests/ops/test_tenants.py::test_producer_rule_allows_every_command_append_can_run
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
	@scripts/run-tests.sh -n 2 --dist worksteal --durations=10 --ignore=tests/frameworks

# Lightning, accelerate and the HF Trainer over taskq.torch.DataLoader, on CPU, in 2
# pytest-xdist workers (~2.5 min; ~3.5 min in one process):
# docs/frameworks.md. The frameworks extra is installed by scripts/bootstrap.sh.
test-frameworks:
	@scripts/bootstrap.sh
	@echo "taskq: the training frameworks' loops (Lightning, accelerate, transformers)"
	@scripts/run-tests.sh -q -n 2 tests/frameworks

test-valkey:
	@scripts/bootstrap.sh --with-valkey
	@echo "taskq: the Valkey subset on $$(valkey-server --version)"
	@TASKQ_TEST_SERVER=valkey-server scripts/run-tests.sh -q -n 2 $(VALKEY_TESTS) -k '$(VALKEY_SELECT)'

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
