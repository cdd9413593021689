# Two commands on a fresh machine: `make demo` and `make test` (both create .venv if missing).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: install demo test lint proto bench fuzz clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[all]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Two worker processes, one per core (the brief's machine and CI): most tests are
# single-threaded Python and tracing. worksteal: an idle worker takes queued tests from the
# busy one, so the long msrun / training tests do not end the run on one core (2,996 tests:
# 11:27 with the default split, 9:47 with worksteal, back to back on a quiet machine). 3,362
# tests: 13:57 before tests/conftest.py kept the garbage collector off long-lived objects, 9:25
# after it and the shared fixtures (`once`), quiet, 2026-12-08; -n 3 gained under 3 %.
# The fuzz figures table prints only without -n (make fuzz).
test: lint
	$(PY) -m pytest -n 2 --dist worksteal

# Regenerate amct_bridge/records/_pb from proto/*.proto (tests fail when they disagree).
proto: $(STAMP)
	$(PY) proto/generate.py

# Property-based fuzzing campaign (tests/fuzz, docs/errors.md "Fuzzing"): about 16 minutes (10 for records, sidecars, configs, exporters and Keras graphs, 6 for .espdl files);
# FUZZ_SCALE=0.5 halves it. Ends with the cases run per target and the failures.
fuzz: $(STAMP)
	HYPOTHESIS_PROFILE=long $(PY) -m pytest tests/fuzz -q -p no:cacheprovider

bench: $(STAMP)
	for f in benchmarks/bench_*.py; do echo "== $$f"; $(PY) $$f || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
