# Two commands a newcomer needs: `make demo` (set up + run the main experiment) and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: venv demo test lint typecheck bench clean

$(BIN)/kvsim: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,calibrate]'
	@touch $(BIN)/kvsim

venv: $(BIN)/kvsim

demo: venv
	$(BIN)/kvsim run configs/quickstart.yaml

lint: venv
	$(BIN)/ruff check sim policies workloads calibrate tests benchmarks
	$(BIN)/ruff format --check sim policies workloads calibrate tests benchmarks

typecheck: venv
	$(BIN)/mypy policies sim workloads calibrate

test: lint typecheck
	TQDM_DISABLE=1 MPLBACKEND=Agg $(BIN)/pytest -n 2

bench: venv
	$(BIN)/python -m benchmarks

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
