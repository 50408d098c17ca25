# Two commands a newcomer needs: `make demo` (set up + run the main experiment) and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

# What is installed in the venv, as stamp files: `demo` needs only the base package; `test` (and
# `venv`) also the dev tools and torch. The full install satisfies the base one, so `make demo` after
# `make test` installs nothing; both reinstall only when pyproject.toml changes.
BASE := $(VENV)/.installed-base
FULL := $(VENV)/.installed-dev-calibrate

.PHONY: venv base demo test lint typecheck native docs fuzz fuzz-step-modes fuzz-builds fuzz-bad-input bench mutation planted clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# setuptools prints a boxed warning on every editable install (folders named like the package may
# shadow it: ours are the package); PIP_EDITABLE silences that one warning and nothing else.
PIP_EDITABLE := PYTHONWARNINGS="ignore:Editable installation" $(BIN)/pip install -q -e

$(BASE): pyproject.toml | $(BIN)/python
	$(PIP_EDITABLE) .
	@touch $@

$(FULL): pyproject.toml | $(BIN)/python
	$(PIP_EDITABLE) '.[dev,calibrate]'
	@touch $@ $(BASE)

base: $(BASE)

venv: $(FULL)

demo: $(BASE)
	$(BIN)/kvsim run configs/quickstart.yaml

lint: venv
	$(BIN)/ruff check sim policies token_content workloads calibrate tests benchmarks tools
	$(BIN)/ruff format --check sim policies token_content workloads calibrate tests benchmarks tools
	$(BIN)/lint-imports

typecheck: venv
	$(BIN)/mypy policies sim token_content workloads calibrate benchmarks

# The suite runs twice: on the Python sources, then on the compiled build (the same tests; the few
# that instrument the sources skip), so the compiled engine is held to every exact expectation.
test: lint typecheck
	KVSIM_NATIVE=0 TQDM_DISABLE=1 MPLBACKEND=Agg $(BIN)/pytest -n 2
	$(MAKE) native
	KVSIM_NATIVE=1 TQDM_DISABLE=1 MPLBACKEND=Agg $(BIN)/pytest -n 2

# The compiled build of the engine's hot modules (sim/native): ~2x faster runs, sweeps and plans,
# identical results. Out of the source tree (build/native), used only while it matches the sources.
native: venv
	KVSIM_NATIVE=0 $(BIN)/python -m sim.native.build

# The generated references (the tests fail when they are out of date).
docs: $(BASE)
	$(BIN)/kvsim config-reference > docs/config-reference.md
	$(BIN)/kvsim config-reference --plan > docs/plan-reference.md
	$(BIN)/kvsim output-columns > docs/outputs.md
	for kind in experiment plan sweep; do $(BIN)/kvsim schema $$kind -o docs/schema/$$kind.schema.json; done
	$(BIN)/python -m tools.readme_tables

# Millions of random policy operations, every invariant checked after each (minutes; not in `test`).
fuzz: venv
	$(BIN)/python -m tests.fuzz --ops 1000000 --jobs 2

# Event skipping against single stepping on random whole experiments (failing cases: fuzz-step-modes/).
fuzz-step-modes: venv
	$(BIN)/python -m tests.fuzz_step_modes --cases 2000 --jobs 2 --seed $${SEED:-1}

# Slips in the shipped files (wrong values, misspelt, unknown or missing keys) against the up-front
# checks: each accepted, or refused with a message naming the file or the key (never a traceback).
fuzz-bad-input: venv
	$(BIN)/python -m tests.fuzz_bad_input --cases 10000 --seed $${SEED:-1}

# The same experiments under the compiled build and the sources, which must agree bit for bit.
fuzz-builds: native
	KVSIM_NATIVE=0 $(BIN)/python -m tests.fuzz_step_modes --builds --cases 1000 --jobs 2 --seed $${SEED:-1}

bench: native
	$(BIN)/python -m benchmarks

# Mutation testing (not part of `make test`): mutmut, config in pyproject.toml [tool.mutmut]. One
# process at low priority; results are cached in mutants/, so a second run only tests what changed.
# A subset: make mutation MUTANTS='sim.hardware.capacity* sim.outputs.metrics*'
# Modules whose functions hundreds of tests reach (the engine's): after mutmut's map is built, score
# them with each function's fast covering tests, python tools/mutation_fast.py sim.engine.growth.
MUTANTS ?=
mutation: venv
	$(PIP_EDITABLE) '.[mutation]'
	$(BIN)/python tools/mutation_prepare.py
	TQDM_DISABLE=1 MPLBACKEND=Agg nice -n 19 $(BIN)/mutmut run --max-children 1 $(MUTANTS)
	$(BIN)/python tools/mutation_scores.py --survivors

# Hand-planted bugs (not part of `make test`): tools/planted_bugs.toml's plausible slips, planted one
# at a time in a copy of the tree; prints how many each module's tests catch. A subset: PLANTED=swa-,link-
PLANTED ?=
planted: venv
	nice -n 10 $(BIN)/python tools/planted_bugs.py $(if $(PLANTED),--only $(PLANTED))

# build/native only when it is kvsim's compiled build (it carries the build's manifest).
clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache mutants
	if [ -f build/native/manifest.json ]; then rm -rf build/native; fi
