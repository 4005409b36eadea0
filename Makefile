# One command sets up and runs the main job, one sets up and runs the tests.
PY ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: run test setup system-deps lint bench clean

run: setup
	$(VENV)/bin/switchboard doctor

test: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/python -m pytest

bench: setup
	$(VENV)/bin/python bench/receive.py

system-deps:
	@if ! ldconfig -p 2>/dev/null | grep -q 'libopus.so.0'; then \
		echo "installing libopus0 (Opus codec used by discord.py)"; \
		apt-get update && apt-get install -y libopus0; \
	fi

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[dev]'
	touch $(STAMP)

setup: system-deps $(STAMP)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
