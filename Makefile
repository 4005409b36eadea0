# One command sets up and runs the main job, one sets up and runs the tests.
PY ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: run test setup system-deps lint bench clean

run: setup
	$(VENV)/bin/switchboard doctor || true
	$(VENV)/bin/switchboard talk

test: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/python -m pytest

bench: setup
	$(VENV)/bin/python bench/receive.py
	$(VENV)/bin/python bench/call_latency.py

# libopus0: the Opus codec discord.py loads; libportaudio2: microphone/speaker for `talk`.
system-deps:
	@missing=""; \
	ldconfig -p 2>/dev/null | grep -q 'libopus.so.0' || missing="$$missing libopus0"; \
	ldconfig -p 2>/dev/null | grep -q 'libportaudio.so.2' || missing="$$missing libportaudio2"; \
	if [ -n "$$missing" ]; then \
		echo "installing$$missing"; \
		apt-get update && apt-get install -y $$missing; \
	fi

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[dev,audio]'
	touch $(STAMP)

setup: system-deps $(STAMP)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
