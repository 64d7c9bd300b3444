# Two commands do all set-up from a fresh clone: `make demo` and `make test` (README).
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(abspath $(VENV))/bin
ROOT := $(abspath .)
# Airflow runs from a project-local home on SQLite; the Spark connection is local[*] (embedded default).
export AIRFLOW_HOME ?= $(ROOT)/.airflow
export AIRFLOW__CORE__DAGS_FOLDER := $(ROOT)/dags
export AIRFLOW__CORE__PLUGINS_FOLDER := $(ROOT)/plugins
export AIRFLOW__CORE__LOAD_EXAMPLES := False
export AIRFLOW_CONN_SPARK_DEFAULT ?= {"conn_type": "spark", "host": "local[*]"}
export PATH := $(BIN):$(PATH)
export CDC_JARS_DIR ?= $(ROOT)/.jars
JARS_DIR := $(CDC_JARS_DIR)
export GX_ANALYTICS_ENABLED := false
export TZ := UTC
# `airflow dags test` waits out reschedule sensors: when nothing new has landed, skip within seconds
demo: export CDC_SENSOR_TIMEOUT ?= 5
demo: export CDC_SENSOR_POKE_INTERVAL ?= 2

# the layer DAGs in the order assets would run them: cdc_bronze, cdc_silver, cdc_gold_<model>...
export LAYER_DAGS := from spark_jobs.registry import load_registry; from spark_jobs.settings import settings; \
r = load_registry(settings().config); \
print(" ".join(["cdc_bronze", "cdc_silver", *("cdc_gold_" + m for m in r.gold)]))

.PHONY: demo ui serve test soak e2e lint bench venv bytecode java jars assets debs clean-demo compose-env

venv: $(VENV)/.installed
# the development lock (the runtime lock plus test and lint tools), then the project itself, editable
# (spark_jobs and plugins/cdc_airflow; `cdc-pipeline`). Installed by uv, pinned here: the same locked versions as pip
# would install, in about two minutes with an empty download cache (50 s with a full one) where pip took over four,
# the largest part of a fresh clone's set-up (measured on CI's machine kind). Compiled to bytecode at install, as pip
# does and uv does not unless asked: where PYTHONDONTWRITEBYTECODE is set (CI's machines set it) no process would ever
# keep what it compiled, and every one compiled every module it imports again: `airflow version` took 6.6 s instead of
# 2.7, `import great_expectations` 12.8 s of CPU instead of 6.5, in each Airflow task, service and CLI process
UV := uv==0.13.9
$(VENV)/.installed: requirements.txt tests/requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check $(UV)
	$(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python -r tests/requirements.txt
	$(BIN)/uv pip install --quiet --python $(BIN)/python --no-build-isolation --no-deps -e .
	touch $@

# the project's own modules as bytecode too (they change, so at each use; a second or two): what the processes a run
# starts import from the clone
bytecode: venv
	@$(BIN)/python -m compileall -q -j 0 spark_jobs plugins dags tests > /dev/null

# the pinned JVM jars (spark_jobs/jvm.py), fetched once from Maven Central into .jars/, offline afterwards
jars: $(JARS_DIR)/.resolved
$(JARS_DIR)/.resolved: spark_jobs/jvm.py | venv java
	$(BIN)/python -m spark_jobs jars
	touch $@

# GX Data Docs' styles and scripts (spark_jobs/quality/docs_assets.py), fetched once from the npm registry
assets: spark_jobs/quality/docs_static/.fetched
spark_jobs/quality/docs_static/.fetched: spark_jobs/quality/docs_assets.py | venv
	$(BIN)/python -m spark_jobs assets
	touch $@

java:
	@major=$$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1); \
	if [ -z "$$major" ] || [ "$$major" -lt 17 ]; then \
	  echo "Java 17 or newer is required for Spark 4 (found: $${major:-none}). Install it, e.g. apt-get install default-jre-headless (Debian)" >&2; \
	  exit 1; fi

# Debian packages the tests use: the reports' browser test drives chromium through its chromedriver; the
# maintenance tests move the clock forward with faketime (VACUUM and retention go by the wall clock); the
# end-to-end test runs Airflow's scheduler on a PostgreSQL it starts (tests/airflow/test_scheduler.py)
DEBS := chromium chromium-driver faketime postgresql
debs:
	@if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ] || [ ! -x /usr/bin/faketime ] || \
	    ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && apt-get install -y -qq --no-install-recommends $(DEBS) >/dev/null; \
	  else echo "The tests need Debian's $(DEBS): sudo apt-get install $(DEBS)" >&2; \
	  exit 1; fi; fi

# The pipeline service (`python -m spark_jobs serve`): one long-lived driver with Spark, Delta and Great
# Expectations loaded once; every Airflow task submits its job to it (docs/operations.md, "The pipeline service").
# `make demo` starts it beside `airflow db migrate` and stops it at the end, failed or not.
# The service authenticates every caller: it writes its address and a secret it made (mode 600) as the Airflow
# connection `cdc_service`, which the tasks use (CDC_SERVICE_CONN_ID).
SERVICE_CONNECTION := $(ROOT)/.service-connection.json
# The sample source lands as a live one would: its snapshot, dated to end now, then (after a first round of runs)
# its changes, so every trend page has two runs to draw and every lag is the seconds since the source's last commit
DEMO_LANDING := generate --landing data/landing --batches 1
demo: venv java jars assets bytecode
	$(BIN)/python -m spark_jobs $(DEMO_LANDING) --phases 0
	@rm -f $(SERVICE_CONNECTION); \
	$(BIN)/python -m spark_jobs serve --port 0 --connection-file $(SERVICE_CONNECTION) > $(AIRFLOW_HOME)-service.log 2>&1 & \
	service=$$!; trap 'kill $$service 2>/dev/null; wait $$service' EXIT; \
	echo "pipeline service starting (pid $$service, log $(AIRFLOW_HOME)-service.log)"; \
	$(BIN)/airflow db migrate > $(AIRFLOW_HOME)-migrate.log 2>&1 || { cat $(AIRFLOW_HOME)-migrate.log; exit 1; }; \
	: "one pool of one slot per gold model: a second refresh of a model waits queued (docs/operations.md)"; \
	$(BIN)/python -m cdc_airflow.pools 2>> $(AIRFLOW_HOME)-migrate.log || exit 1; \
	until [ -s $(SERVICE_CONNECTION) ]; do kill -0 $$service 2>/dev/null || { cat $(AIRFLOW_HOME)-service.log; exit 1; }; \
	  sleep 0.5; done; export CDC_SERVICE_CONN_ID=cdc_service AIRFLOW_CONN_CDC_SERVICE="$$(cat $(SERVICE_CONNECTION))"; \
	echo "pipeline service up: Airflow connection cdc_service from $(SERVICE_CONNECTION)"; \
	: "each layer's DAG in turn (a scheduler would start silver and gold from the assets bronze updates), all in one"; \
	: "Airflow process: a process per DAG would pay Airflow's start 11 times (cdc_airflow/dag_runs.py); the changes"; \
	: "land between the two rounds"; \
	dags=$$($(BIN)/python -c "$$LAYER_DAGS"); \
	$(BIN)/python -m cdc_airflow.dag_runs $$dags "spark_jobs $(DEMO_LANDING) --phases 1" $$dags 2>&1 | \
	  tee $(AIRFLOW_HOME)-dags-test.log | grep --line-buffered '^airflow dags test \|^spark_jobs '; \
	[ "$${PIPESTATUS[0]}" = 0 ] || { tail -50 $(AIRFLOW_HOME)-dags-test.log; exit 1; }
	$(BIN)/python -m spark_jobs status --lake data/lake --require-tables
	@echo "The Airflow UI with these runs, their reports and where every table stands: make ui"

# The Airflow UI on this machine's loopback after `make demo`: its DAG runs, each run's Data quality tab, and under
# Browse the pipeline's status (every table and layer: rows, lag, last verdict) and its reports. The login is the
# demo's own: admin, with a password drawn once into .airflow/ui-passwords.json (mode 600) and printed before
# the server starts (cdc_airflow/ui.py). UI_PORT picks another port; Ctrl-C stops it.
UI_PORT ?= 8080
ui: venv bytecode
	$(BIN)/python -m cdc_airflow.ui --port $(UI_PORT)

# the pipeline service in the foreground, for a scheduler of your own: it writes its Airflow connection (address and
# secret) to .service-connection.json; e.g. AIRFLOW_CONN_CDC_SERVICE="$$(cat .service-connection.json)" and
# CDC_SERVICE_CONN_ID=cdc_service for the Airflow side (docs/operations.md, "The pipeline service")
serve: venv java jars assets bytecode
	$(BIN)/python -m spark_jobs serve --port 8790 --connection-file $(SERVICE_CONNECTION)

# two workers, one per core, each test file on one of them, the longest files first (tests/conftest.py); the slowest
# tests and a junit.xml of every test's time show where each run's time went
test: venv java jars assets debs bytecode
	$(BIN)/pytest -n 2 --dist loadfile --no-loadscope-reorder --junitxml=test-artifacts/junit.xml

# the size claims (tests marked `scale`) at full size: a 200 MB file at the default heap, a 50 MB line, a backlog of
# 5,000 files, a batch of 20,000 events (`make test` proves each against a limit set small); about 4 minutes here.
# Run it before resolving an issue that touches those paths; its figures go in tests/benchmarks/RESULTS.md
soak: venv java jars assets debs bytecode
	$(BIN)/pytest --soak -m scale --durations=0 --junitxml=test-artifacts/soak.xml

# Airflow for real: api-server, scheduler, dag-processor, triggerer and the LocalExecutor on a PostgreSQL the test
# starts, files landing on a local S3 server to gold, a backfill and replays through the REST API (part of `make test`)
e2e: venv java jars assets debs bytecode
	$(BIN)/pytest tests/airflow/test_scheduler.py tests/airflow/test_landing_queue.py

# the pipeline against the single-node floor, every workload of tests/benchmarks (not part of `make test`);
# at scale 1.0 (issue 6's sizes) it takes hours here: e.g. `make bench BENCH_ARGS="--scale 0.1 --runs 2"`
bench: venv java jars assets bytecode
	$(BIN)/python -m tests.benchmarks $(BENCH_ARGS)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/mypy spark_jobs plugins dags

# The compose stack's secrets, which docker-compose.yaml reads from .env and refuses to start without: the S3 keys,
# PostgreSQL's and Airflow's admin passwords and Spark's RPC secret, drawn once (Python's own `secrets`: no venv
# needed) into a new file readable by you only (O_EXCL and O_NOFOLLOW: never written through a link planted in its
# place), never in git or the image. An existing .env is kept; delete it to
# draw new ones (and the volumes, which hold the old ones).
compose-env:
	@if [ -s .env ]; then echo ".env exists: kept"; else \
	  python3 -c 'import os, secrets; t = secrets.token_hex; \
	    text = f"CDC_S3_ACCESS_KEY=cdc-{t(8)}\nCDC_S3_SECRET_KEY={t(24)}\nCDC_POSTGRES_PASSWORD={t(24)}\n"; \
	    text += f"CDC_AIRFLOW_ADMIN_PASSWORD={t(12)}\nCDC_SPARK_SECRET={t(32)}\n"; \
	    text += "# CDC_PUBLISH_ADDRESS=0.0.0.0  # publish the ports beyond loopback (default 127.0.0.1)\n"; \
	    fd = os.open(".env", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600); \
	    os.write(fd, text.encode()); os.close(fd)' 2>/dev/null \
	  && echo ".env: made (mode 600)" || { echo ".env is there but empty or a link: remove it, then run make compose-env" >&2; exit 1; }; fi

clean-demo:
	rm -rf data .airflow .airflow-*.log .service-connection.json
