# estream developer entry points. `make run` and `make test` do all set-up themselves.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
SPARK_STAMP := $(VENV)/.installed-spark

.PHONY: run test test-quick chaos soak bench bench-quick lint typecheck clean venv spark-deps system-deps

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip setuptools wheel

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

# Debian packages the test suite needs (Java for Spark local mode, iptables for fault tests,
# chromium for the web console's test).
system-deps:
	@bash .ci/system-deps.sh

$(SPARK_STAMP): pyproject.toml | $(STAMP)
	$(BIN)/pip install --quiet -e '.[spark,dev]'
	touch $(SPARK_STAMP)

spark-deps: system-deps $(SPARK_STAMP)

run: $(STAMP)
	$(BIN)/estream up --data-dir ./estream-data

# Two lanes at once (tests/lanes.sh): the real-process tiers, and the pure ones beside them.
test: $(STAMP) spark-deps
	bash tests/lanes.sh --durations=60

test-quick: $(STAMP)
	$(BIN)/python -m pytest tests -m "not slow and not spark"

# The long fault runs (@pytest.mark.slow in tests/chaos, tests/integration and tests/sim), among them the 25-cycle nemesis
# (tests/chaos/test_nemesis.py); it prints its seed: ESTREAM_CHAOS_SEED=N make chaos replays it,
# ESTREAM_NEMESIS_CYCLES=N runs N cycles instead.
chaos: $(STAMP)
	$(BIN)/python -m pytest tests/chaos tests/integration tests/sim -m slow -s

# A cluster under churn for SOAK_S seconds (default an hour): thousands of streams, writer
# sessions, readers, deletes and recreates, retention and the object tier; RSS, descriptors,
# disk, PD CPU and append latency sampled over time (benchmarks/soak.py).
# SOAK_RATE writer sessions start each second, steadily (so the curves compare like with like).
SOAK_S ?= 3600
SOAK_RATE ?= 15
soak: $(STAMP)
	$(BIN)/python -c "import matplotlib" 2>/dev/null || $(BIN)/pip install --quiet -e '.[bench]'
	$(BIN)/python -m benchmarks.soak --duration-s $(SOAK_S) --sessions-per-s $(SOAK_RATE)

# estream beside NATS JetStream, Redis and etcd (benchmarks/compare.py); peers installed by
# benchmarks/setup.sh; figures to benchmarks/RESULTS.md, charts to benchmarks/results/.
bench: $(STAMP)
	bash benchmarks/setup.sh
	$(BIN)/python -m benchmarks.compare --scale full
	$(BIN)/python -m benchmarks.charts

bench-quick: $(STAMP)
	bash benchmarks/setup.sh
	$(BIN)/python -m benchmarks.compare --scale quick --only machine,estream,nats,redis,pd \
		--out benchmarks/results/quick --no-results-md --no-profile
	$(BIN)/python -m benchmarks.charts --input benchmarks/results/quick/compare.json

lint: $(STAMP)
	$(BIN)/ruff check estream pd rangeserver tests benchmarks examples

typecheck: $(SPARK_STAMP)  # mypy reads estream/spark, which imports pyspark
	$(BIN)/mypy

clean:
	rm -rf $(VENV) build *.egg-info
