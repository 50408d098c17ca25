# Two commands a newcomer needs: `make demo` (set up + run the main experiment) and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: venv demo test lint typecheck bench mutation clean

$(BIN)/kvsim: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,calibrate]'
	@touch $(BIN)/kvsim

venv: $(BIN)/kvsim

demo: venv
	$(BIN)/kvsim run configs/quickstart.yaml

lint: venv
	$(BIN)/ruff check sim policies workloads calibrate tests benchmarks tools
	$(BIN)/ruff format --check sim policies workloads calibrate tests benchmarks tools

typecheck: venv
	$(BIN)/mypy policies sim workloads calibrate

test: lint typecheck
	TQDM_DISABLE=1 MPLBACKEND=Agg $(BIN)/pytest -n 2

bench: venv
	$(BIN)/python -m benchmarks

# Mutation testing (not part of `make test`): mutmut, config in pyproject.toml [tool.mutmut]. One
# process at low priority; results are cached in mutants/, so a second run only tests what changed.
# A subset: make mutation MUTANTS='sim.capacity* sim.metrics*'
MUTANTS ?=
mutation: venv
	$(BIN)/pip install -q -e '.[mutation]'
	TQDM_DISABLE=1 MPLBACKEND=Agg nice -n 19 $(BIN)/mutmut run --max-children 1 $(MUTANTS)
	$(BIN)/python tools/mutation_scores.py --survivors

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache mutants
