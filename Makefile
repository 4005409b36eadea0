# One command sets up and runs the main job, one sets up and runs the tests.
PY ?= python3
VENV := .venv
STAMP := $(VENV)/.installed
# The real Hermes Agent the hermes-api lane is tested against, in its own environment: its pins
# (openai 2, pydantic 2.13, websockets 15, cryptography 46) conflict with ours. aiohttp: its api_server.
HERMES_VENV := .venv-hermes
HERMES_PIN := hermes-agent==0.19.0 aiohttp==3.14.5
HERMES_STAMP := $(HERMES_VENV)/.installed-0.19.0

.PHONY: run test setup system-deps lint bench clean

run: setup
	$(VENV)/bin/switchboard doctor || true
	$(VENV)/bin/switchboard start

test: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/python -m pytest

# Every bench runs in turn; the first one that exits non-zero stops `make bench` with its name. Each
# records its goals (bench/goals.py); the run ends with the table of them: figure, goal, met or not.
BENCHES := receive call_latency file_input_memory discord_call calls_per_core vad_batch archive listener_calls resume
GOALS := $(VENV)/bench-goals.jsonl
bench: setup
	@set -e; rm -f $(GOALS); for b in $(BENCHES); do \
		echo "== bench/$$b.py"; \
		BENCH_SUMMARY=$(GOALS) $(VENV)/bin/python bench/$$b.py || { status=$$?; \
			$(VENV)/bin/python bench/goals.py $(GOALS) $(BENCHES); \
			echo "make bench: bench/$$b.py FAILED (exit $$status)" >&2; exit $$status; }; \
	done; \
	$(VENV)/bin/python bench/goals.py $(GOALS) $(BENCHES)

# libopus0: the Opus codec discord.py loads; libportaudio2: microphone/speaker for `talk`;
# espeak-ng: real speech for the tests; postgresql: the throwaway server the tests run the store's
# PostgreSQL half on (tests/support/postgres.py; without it that half is skipped, and said so). apt is
# skipped entirely when all are present, and waits (up to 2 minutes) for another process's apt/dpkg lock
# instead of failing at once. Its output (dpkg prints progress whatever -qq says) is kept and shown only
# when it fails.
APT := apt-get -o DPkg::Lock::Timeout=120 -qq
POSTGRES_SERVERS ?= /usr/lib/postgresql/*/bin/postgres
system-deps:
	@missing=""; \
	ldconfig -p 2>/dev/null | grep -q 'libopus.so.0' || missing="$$missing libopus0"; \
	ldconfig -p 2>/dev/null | grep -q 'libportaudio.so.2' || missing="$$missing libportaudio2"; \
	command -v espeak-ng >/dev/null 2>&1 || missing="$$missing espeak-ng"; \
	set -- $(POSTGRES_SERVERS); [ -e "$$1" ] || missing="$$missing postgresql"; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then \
		echo "missing system packages:$$missing (install them; set-up only installs them as root with apt-get)"; \
		exit 0; \
	fi; \
	echo "installing$$missing"; export DEBIAN_FRONTEND=noninteractive; \
	retry() { for try in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24; do \
		output=$$("$$@" 2>&1) && return 0; echo "apt is busy or failed (try $$try of 24); retrying in 5 s"; sleep 5; \
	done; echo "$$output" >&2; return 1; }; \
	retry $(APT) update && retry $(APT) install -y $$missing

# setuptools' boxed "Editable installation." notice reads like an error; every other warning still shows.
QUIET_SETUPTOOLS := ignore:Editable installation
$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	PYTHONWARNINGS='$(QUIET_SETUPTOOLS)' $(VENV)/bin/pip install --quiet -e '.[dev,audio]'
	touch $(STAMP)

$(HERMES_STAMP):
	rm -rf $(HERMES_VENV)
	$(PY) -m venv $(HERMES_VENV)
	$(HERMES_VENV)/bin/pip install --quiet $(HERMES_PIN)
	touch $(HERMES_STAMP)

setup: system-deps $(STAMP) $(HERMES_STAMP)

clean:
	rm -rf $(VENV) $(HERMES_VENV) .pytest_cache .ruff_cache
