"""Demo smoke test: generate files, run the DAGs through Airflow (`airflow dags test`, SQLite, a fresh
AIRFLOW_HOME, the tasks' jobs on the pipeline service), check every layer and the report exist, then open the
reports inside the Airflow UI: a running API server, Airflow's login, headless chromium."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from tests.support import (
    BIN,
    ROOT,
    AirflowCli,
    airflow_home,
    aws_connection,
    chromium,
    customers_project,
    first_run_reaches_gold,
    free_port,
    pipeline_service,
    s3_environment,
    s3_server,
    service_airflow_env,
    silver_table,
    stop_process_groups,
    subprocess_env,
    upload_landing,
)

# screenshots of the browser test: kept as test artifacts, outside git (see .gitignore)
ARTIFACTS = Path(os.environ.get("CDC_TEST_ARTIFACTS", ROOT / "test-artifacts"))


@contextmanager
def api_server(env: dict[str, str], home: Path) -> Iterator[tuple[str, str]]:
    """The Airflow UI as `make ui` starts it (`python -m cdc_airflow.ui`) on a free loopback port: its address and the
    admin's password, read from the line it prints before the server starts (and from the file that line names)."""
    port = free_port()
    log = (home / "api-server.log").open("w")
    server = subprocess.Popen([str(BIN / "python"), "-m", "cdc_airflow.ui", "--port", str(port)],
                              cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert server.poll() is None, (home / "api-server.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"{base}/api/v2/monitor/health", timeout=5):
                    break
            except (urllib.error.URLError, ConnectionError):
                assert time.monotonic() < deadline, "API server did not start: " + (home / "api-server.log").read_text()[-3000:]
                time.sleep(1)
        printed = (home / "api-server.log").read_text().splitlines()[0]
        passwords = home / "ui-passwords.json"
        password = json.loads(passwords.read_text())["admin"]
        assert printed == f"Airflow UI: {base}/  user admin, password {password} ({passwords}); Ctrl-C stops it"
        assert passwords.stat().st_mode & 0o777 == 0o600
        yield base, password
    finally:
        stop_process_groups([server], grace_s=5)
        log.close()


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        return None


def _get(url: str, **headers: str) -> tuple[int, str, dict[str, str]]:
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(urllib.request.Request(url, headers=headers), timeout=30) as r:
            return r.status, r.read().decode(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), dict(e.headers)


def check_reports_behind_airflow_auth(base: str, password: str) -> None:
    for page in ("", "status"):  # the reports and the status page rendered per request alike
        status, _, _ = _get(f"{base}/cdc-reports/{page}", Accept="application/json")
        assert status == 401, page
    status, _, headers = _get(f"{base}/cdc-reports/", Accept="text/html")
    assert status == 307 and "/auth/login" in headers["location"]
    login = urllib.request.Request(f"{base}/auth/token", data=json.dumps({"username": "admin", "password": password})
                                   .encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(login, timeout=30) as r:
        token = json.loads(r.read())["access_token"]
    status, page, headers = _get(f"{base}/cdc-reports/", Authorization=f"Bearer {token}")
    assert status == 200 and "CDC pipeline runs" in page
    # served from Airflow's origin: no inline code runs, scripts only from the vendored files, nothing is fetched or
    # posted (cdc_reports)
    scripts_only = f"default-src 'none'; script-src {base}/cdc-reports/data_docs/_assets/; "
    assert headers["content-security-policy"].startswith(scripts_only)
    assert "connect-src 'none'" in headers["content-security-policy"] and headers["x-content-type-options"] == "nosniff"
    # the silver pass's Data Docs (a single table's small batch is a pass of one): the folder is sent to its
    # trailing slash (the page's relative links), then served
    status, _, headers = _get(f"{base}/cdc-reports/data_docs/silver-pass", Authorization=f"Bearer {token}")
    assert (status, headers["location"]) == (307, "/cdc-reports/data_docs/silver-pass/")
    status, page, headers = _get(f"{base}/cdc-reports/data_docs/silver-pass/", Authorization=f"Bearer {token}")
    assert status == 200 and headers["content-type"].startswith("text/html") and "Great Expectations" in page
    assert headers["content-security-policy"].startswith(scripts_only)
    # the reports are <root>/lake/reports, the UI's passwords <root>/airflow/ui-passwords.json
    for escape in ("..%2f..%2fairflow%2fui-passwords.json", "%2e%2e/%2e%2e/airflow/ui-passwords.json",
                   "runs/..%2f..%2f..%2fairflow/ui-passwords.json"):
        status, body, _ = _get(f"{base}/cdc-reports/{escape}", Authorization=f"Bearer {token}")
        assert (status, password in body) == (404, False), escape


def browse_reports_in_the_airflow_ui(base: str, password: str, screenshot: Path, bronze_run: str, lake: Path,
                                     silver_rows: int) -> str:
    """Log in through Airflow's login page, open the plugin's menu entry and return the report's text; then
    a table's trend page, a DAG run's "Data quality" tab and the Data Docs, and scripts planted in the lake."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    driver = chromium()
    try:
        wait = WebDriverWait(driver, 90)
        driver.get(f"{base}/plugin/cdc-reports")
        wait.until(EC.presence_of_element_located((By.NAME, "username"))).send_keys("admin")
        driver.find_element(By.NAME, "password").send_keys(password)
        driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        wait.until(EC.frame_to_be_available_and_switch_to_it((By.TAG_NAME, "iframe")))
        wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, "table tr td a")))
        text = driver.find_element(By.TAG_NAME, "body").text
        driver.switch_to.default_content()
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(screenshot))
        check_status_page(driver, base, screenshot.with_name("status.png"), silver_rows)
        check_trend_charts(driver, base, screenshot.with_name("table-trends.png"))
        check_dag_run_tab(driver, base, bronze_run, screenshot.with_name("dag-run-data-quality-tab.png"))
        check_data_docs_render_offline(driver, base, screenshot.with_name("data-docs-offline.png"))
        check_scripts_planted_in_the_lake_do_not_run(driver, base, lake)
        return text
    finally:
        driver.quit()


# a lag as the pages print it: seconds or minutes for sample files dated now, never hours, days or years
RECENT_LAG = re.compile(r"^\d+\.\d (s|min)$")


def check_status_page(driver, base: str, screenshot: Path, silver_rows: int) -> None:
    """Browse → CDC status: every table and layer with its rows, a lag in seconds or minutes (the sample files are
    dated to end when they were made), the last verdict and how long ago the last success was."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(driver, 60)
    driver.get(f"{base}/plugin/cdc-status")
    wait.until(EC.frame_to_be_available_and_switch_to_it((By.TAG_NAME, "iframe")))
    wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, "table tr td")))
    rows = [[cell.text for cell in row.find_elements(By.TAG_NAME, "td")]
            for row in driver.find_elements(By.CSS_SELECTOR, "table tr") if row.find_elements(By.TAG_NAME, "td")]
    heading = driver.find_element(By.TAG_NAME, "h1").text
    driver.switch_to.default_content()
    driver.save_screenshot(str(screenshot))
    assert heading == "Where every table stands"
    assert [(r[0], r[1], r[2], r[4]) for r in rows] == [("customers", "bronze", "100", "passed"),
                                                      ("customers", "silver", str(silver_rows), "passed"),
                                                      ("customers_by_state", "gold", rows[2][2], "passed")], rows
    for row in rows:
        assert RECENT_LAG.match(row[3]), row
        assert re.match(r"^\d+\.\d (s|min) ago$", row[5]), row


def check_trend_charts(driver, base: str, screenshot: Path) -> None:
    """The table's trend page draws its three charts (lag, rows per run, quarantined share) as lines over the demo's
    two runs, each point labelled with its value: the lag in seconds or minutes."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(f"{base}/cdc-reports/tables/customers.html")
    WebDriverWait(driver, 60).until(EC.presence_of_element_located((By.CSS_SELECTOR, "svg.chart")))
    charts = driver.find_elements(By.CSS_SELECTOR, "svg.chart")
    assert [c.get_attribute("aria-label") for c in charts] == [
        "Lag: the run's time less the source commit time of the newest change it held", "Rows per run",
        "Quarantined share of the batch"]
    assert all(c.size["width"] > 600 and c.size["height"] > 150 for c in charts)  # laid out, not collapsed
    assert len(charts[1].find_elements(By.CSS_SELECTOR, "polyline.series")) == 4
    lag_line = charts[0].find_element(By.CSS_SELECTOR, "polyline.series").get_attribute("points").split()
    assert len(lag_line) == 2, lag_line  # a line through both runs, not a dot
    lags = [label.text for label in charts[0].find_elements(By.CSS_SELECTOR, "text.point")]
    assert len(lags) == 2 and all(RECENT_LAG.match(lag) for lag in lags), lags
    inserted = charts[1].find_elements(By.CSS_SELECTOR, "text.point")
    assert len(inserted) == 8 and all(label.is_displayed() for label in inserted)  # 4 series x 2 runs
    driver.save_screenshot(str(screenshot))


def check_dag_run_tab(driver, base: str, run_id: str, screenshot: Path) -> None:
    """The DAG run page of `cdc_bronze` has a "Data quality" tab that opens that run's report."""
    from urllib.parse import quote

    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(driver, 60)
    driver.get(f"{base}/dags/cdc_bronze/runs/{quote(run_id, safe='')}/plugin/cdc-run-report")
    wait.until(EC.frame_to_be_available_and_switch_to_it((By.TAG_NAME, "iframe")))
    wait.until(EC.presence_of_element_located((By.TAG_NAME, "h1")))
    heading = driver.find_element(By.TAG_NAME, "h1").text
    driver.switch_to.default_content()
    driver.save_screenshot(str(screenshot))
    assert heading.startswith(f"Run {run_id}"), heading


def check_data_docs_render_offline(driver, base: str, screenshot: Path) -> None:
    """The silver pass's Data Docs, as the plugin serves them, load every style, script and image from the plugin
    (this machine has no internet: a CDN link would leave the page unstyled, its tables and charts dead)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(f"{base}/cdc-reports/data_docs/silver-pass/index.html")
    WebDriverWait(driver, 60).until(EC.presence_of_element_located((By.CSS_SELECTOR, "table")))
    loaded = driver.execute_script(
        "return {resources: performance.getEntriesByType('resource').map(e => e.name),"
        " jquery: typeof window.jQuery, table: typeof (window.jQuery && jQuery.fn.bootstrapTable),"
        " vega: typeof window.vegaEmbed, bootstrap: typeof (window.jQuery && jQuery.fn.modal),"
        " navbar: getComputedStyle(document.querySelector('nav.navbar') || document.body).display,"
        " logo: [...document.images].map(i => [i.src, i.naturalWidth]),"
        " rows: document.querySelectorAll('table tbody tr[data-index]').length}")  # drawn by GX's page script
    driver.save_screenshot(str(screenshot))
    assert loaded["resources"] and all(r.startswith(base) for r in loaded["resources"]), loaded["resources"]
    assert (loaded["jquery"], loaded["table"], loaded["vega"], loaded["bootstrap"]) == (
        "function", "function", "function", "function"), loaded
    assert loaded["logo"] and all(width > 0 for _, width in loaded["logo"]), loaded["logo"]
    assert loaded["rows"] > 0, loaded  # GX's page scripts ran, from files: no inline code runs under the policy
    assert "newsletter" not in driver.page_source


PLANTED = """<html><body><p>planted</p><script src="planted.js"></script><script src="data_docs/silver-pass/planted.js">
</script><script src="data_docs/_assets/cdc/planted.js"></script><script src="data_docs/_assets/../silver-pass/planted.js">
</script><script>document.title = "ran: inline"</script></body></html>"""


def check_scripts_planted_in_the_lake_do_not_run(driver, base: str, lake: Path) -> None:
    """Whoever can write to the lake cannot run code in Airflow's origin: a page and scripts written into the
    reports, even where the vendored files' copy lies, run nothing, and the Data Docs keep running the package's own
    scripts (the plugin serves the vendored files from the package, and its policy runs scripts from nowhere else)."""
    reports = lake / "reports"
    (reports / "planted.html").write_text(PLANTED)
    for folder in (reports, reports / "data_docs" / "silver-pass", reports / "data_docs" / "_assets" / "cdc"):
        (folder / "planted.js").write_text(f'document.title = "ran: {folder.name}";')
    handlers = reports / "data_docs" / "_assets" / "cdc" / "handlers.js"
    handlers.write_text('document.title = "ran: the lake\'s handlers.js";')
    driver.get(f"{base}/cdc-reports/planted.html")
    assert "planted" in driver.find_element("tag name", "body").text
    assert driver.execute_script("return document.title") == ""  # set by any of them that ran
    driver.get(f"{base}/cdc-reports/data_docs/silver-pass/index.html")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, 60).until(EC.presence_of_element_located((By.CSS_SELECTOR, "table tbody tr[data-index]")))
    assert not driver.execute_script("return document.title").startswith("ran:")


@dataclass
class Demo:
    airflow: AirflowCli
    env: dict[str, str]
    root: Path
    lake: Path
    silver: list[dict]


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Iterator[Demo]:
    """Files landing in a bucket (a local S3 server) taken to silver and gold through the layer DAGs (`airflow dags
    test`, the tasks' jobs on the pipeline service) as `make demo` lands them: the snapshot, dated to end now, then
    the changes. The module's tests go on from the two runs."""
    from spark_jobs.generate import Options, generate
    from spark_jobs.registry import load_registry

    root = tmp_path_factory.mktemp("demo")
    config = customers_project(root)
    landing, lake = "s3://landing/cdc", root / "lake"
    tables = load_registry(str(config)).select(None)
    opts = Options(rows=50, changes=50, batches=1, ends_ms=int(time.time() * 1000))
    snapshot = generate(tables, root / "sink", replace(opts, phases=frozenset({0})))[0]
    generated = generate(tables, root / "changes", replace(opts, phases=frozenset({1})))
    # the service serves this deployment, with its own S3 credentials; Airflow reaches it through its connection
    deployment = {"CDC_CONFIG": str(config), "CDC_LANDING_URI": landing, "CDC_LAKE_URI": str(lake)}
    with ExitStack() as stack:
        s3_endpoint = stack.enter_context(s3_server(root / "moto.log"))
        upload_landing(s3_endpoint, root / "sink", landing)
        service = stack.enter_context(pipeline_service(subprocess_env(**deployment, **s3_environment(s3_endpoint)),
                                                       root / "service.log"))
        env = subprocess_env(
            **service_airflow_env(service),
            AIRFLOW_HOME=str(root / "airflow"), AIRFLOW__CORE__DAGS_FOLDER=str(ROOT / "dags"),
            AIRFLOW__CORE__LOAD_EXAMPLES="False", AIRFLOW__CORE__PLUGINS_FOLDER=str(ROOT / "plugins"),
            AIRFLOW_CONN_SPARK_DEFAULT='{"conn_type": "spark", "host": "local[1]"}',
            AIRFLOW_CONN_AWS_DEFAULT=aws_connection(s3_endpoint),
            CDC_CONFIG=str(config), CDC_LANDING_URI=landing, CDC_LAKE_URI=str(lake),
            CDC_SENSOR_TIMEOUT="3", CDC_SENSOR_POKE_INTERVAL="1",
            # OpenLineage's file transport: each event a JSON line, as a test transport would capture them
            AIRFLOW__OPENLINEAGE__TRANSPORT=json.dumps({"type": "file", "log_file_path": str(root / "lineage.jsonl"),
                                                        "append": True}),
            AIRFLOW__OPENLINEAGE__NAMESPACE="cdc-test")
        airflow = AirflowCli(env, root / "dags-test.log")
        airflow_home(root / "airflow")  # `airflow db migrate`'s database
        pools = airflow.sh(str(BIN / "python"), "-m", "cdc_airflow.pools")  # the writer pools, as the README sets them up
        assert "1 writer pools of one slot: cdc_gold_customers_by_state" in pools.stdout
        first_run_reaches_gold(airflow, config, lake, snapshot.snapshot_rows, bronze_rows=50)
        upload_landing(s3_endpoint, root / "changes", landing)
        log, _, _ = airflow.dag_runs(("cdc_bronze",), ("cdc_silver",), ("cdc_gold_customers_by_state",))
        assert "table=customers: 2 landing file(s) for bronze" in log
        silver = silver_table(str(lake / "silver" / "customers"))
        assert {(r["custkey"],): {c: r[c] for c in r if not c.startswith("_")} for r in silver} == \
            generated[0].final_rows
        yield Demo(airflow, env, root, lake, silver)


def test_each_layer_task_names_what_it_read_and_the_delta_table_it_wrote_in_its_lineage(demo):
    lineage_names_the_delta_tables(demo.root / "lineage.jsonl", demo.lake)


def test_the_reports_are_in_the_airflow_ui_behind_its_login(demo):
    """The latest run's verdicts, the trend charts, a DAG run's tab and the Data Docs, in headless chromium."""
    with api_server(demo.env, demo.root / "airflow") as (base, password):
        check_reports_behind_airflow_auth(base, password)
        bronze_run = next(p.parent.name for p in (demo.lake / "reports" / "runs").glob("*/customers.bronze.json"))
        text = browse_reports_in_the_airflow_ui(base, password, ARTIFACTS / "airflow-ui-cdc-reports.png", bronze_run,
                                                demo.lake, len(demo.silver))
    latest = text.split("CDC pipeline runs", 1)[1].splitlines()
    assert [line for line in latest if "gold/customers_by_state" in line][0].split()[2] == "passed"
    assert "silver/customers: passed" in text and "bronze/customers: passed" in text


def test_replays_leave_the_tables_unchanged_and_a_backfill_plans_a_run_per_interval(demo):
    """`cdc_replay` rebuild and reprocess, cdc_maintenance, a replay with a bad param; a backfill's plan."""
    replays_leave_silver_unchanged(demo.airflow, demo.lake, demo.silver)
    backfills_plan_a_run_per_interval(demo.airflow)


def lineage_names_the_delta_tables(events_file: Path, lake: Path) -> None:
    """Each layer task's OpenLineage events: what it read and the Delta table it wrote, as datasets."""
    events = [json.loads(line) for line in events_file.read_text().splitlines() if line.strip()]
    done = {e["job"]["name"]: e for e in events if e["eventType"] == "COMPLETE" and "." in e["job"]["name"]}

    def datasets(job: str, side: str) -> list[tuple[str, str]]:
        return [(d["namespace"], d["name"]) for d in done[job][side]]

    # bronze's pass: what each table it advanced read and wrote (the demo lands one table)
    assert datasets("cdc_bronze.bronze_ingest", "inputs") == [("s3://landing", "cdc/topics/burst.burst_bank.customers")]
    assert datasets("cdc_bronze.bronze_ingest", "outputs") == [("file", f"{lake}/bronze/customers")]
    assert datasets("cdc_silver.silver_merge", "inputs") == [("file", f"{lake}/bronze/customers")]
    assert datasets("cdc_silver.silver_merge", "outputs") == [("file", f"{lake}/silver/customers")]
    assert datasets("cdc_gold_customers_by_state.gold_refresh_customers_by_state", "inputs") == [
        ("file", f"{lake}/silver/customers")]
    assert datasets("cdc_gold_customers_by_state.gold_refresh_customers_by_state", "outputs") == [
        ("file", f"{lake}/gold/customers_by_state")]
    # silver's columns, each traced to the fields of the change events (bronze's envelope) it is made from
    bronze = ("file", f"{lake}/bronze/customers")
    silver_columns = {column: [(f["namespace"], f["name"], f["field"]) for f in traced["inputFields"]] for column, traced
                      in done["cdc_silver.silver_merge"]["outputs"][0]["facets"]["columnLineage"]["fields"].items()}
    assert set(silver_columns) == set(silver_table(f"{lake}/silver/customers")[0])
    assert silver_columns["state"] == [(*bronze, "after.state"), (*bronze, "before.state")]
    assert (silver_columns["_op"], silver_columns["_seq"]) == ([(*bronze, "op")], [(*bronze, "source")])
    # the model's columns, each traced to the silver columns its SQL computes it from
    output = done["cdc_gold_customers_by_state.gold_refresh_customers_by_state"]["outputs"][0]
    silver = ("file", f"{lake}/silver/customers")
    assert {column: [(f["namespace"], f["name"], f["field"]) for f in traced["inputFields"]]
            for column, traced in output["facets"]["columnLineage"]["fields"].items()} == {
        "state": [(*silver, "state")], "customers": [], "avg_fico": [(*silver, "fico")],
        "first_registration": [(*silver, "registration_date")]}
    assert "<h2>Column lineage</h2>" in (lake / "reports" / "tables" / "customers_by_state.html").read_text()
    assert {e["job"]["namespace"] for e in events} == {"cdc-test"}


def maintenance_keeps_the_rows(log: str, lake: Path, silver: list[dict]) -> None:
    """cdc_maintenance through Airflow (delta-rs: plain processes, no JVM): bronze's appends and silver's
    commits compacted, the rows as they were, each table's counts in the run's report."""
    from spark_jobs.delta.reads import row_count

    assert "maintain customers bronze: files " in log and "maintain customers_by_state gold: files 1 -> 1" in log
    assert silver_table(str(lake / "silver" / "customers")) == silver
    assert row_count(str(lake / "bronze" / "customers")) == 100
    run = next((lake / "reports" / "runs").glob("*/customers.maintenance.json")).parent
    assert sorted(p.name for p in run.glob("*.maintenance.json")) == [
        "customers.maintenance.json", "customers_by_state.maintenance.json"]


def replays_leave_silver_unchanged(airflow: AirflowCli, lake: Path, silver: list[dict]) -> None:
    from spark_jobs.delta.reads import row_count

    # a second run finds nothing new: the deferred sensor gives up after its timeout and skips the run
    silver_log = sorted((lake / "silver" / "customers" / "_delta_log").glob("*.json"))
    # replays: rebuild writes a new silver version with the same rows; reprocess re-reads every landing
    # file and leaves bronze's row count and silver's rows as they were
    # (gold's refresh at the end of a replay is the same task cdc_gold_* ran above: marked done here, for time)
    skip_gold = ("--mark-success-pattern", "gold_refresh_.*")
    again, _ = airflow.dag_runs(("cdc_bronze",), ("cdc_replay", "-c", json.dumps({"tables": ["customers"], "mode": "rebuild"}),
                                                  *skip_gold))
    assert "Pausing task as DEFERRED" in again and "[DAG TEST] running trigger in line" in again
    assert "reason='no landing files to ingest in any of 1 table(s)'" in again
    assert row_count(str(lake / "bronze" / "customers")) == 100

    assert silver_table(str(lake / "silver" / "customers")) == silver
    assert len(sorted((lake / "silver" / "customers" / "_delta_log").glob("*.json"))) == len(silver_log) + 1
    assert row_count(str(lake / "bronze" / "customers")) == 100
    # then, in the same Airflow process: reprocess, maintenance, and a replay with a bad param, which fails before
    # any task runs, naming the param
    reprocess, maintenance, bad = airflow.dag_runs(
        ("cdc_replay", "-c", json.dumps({"tables": ["customers"], "mode": "reprocess"}), *skip_gold), ("cdc_maintenance",),
        ("cdc_replay", "-c", json.dumps({"mode": "replace"})), last_fails=True)
    assert "mode=reprocess lines=108 events=100" in reprocess
    assert row_count(str(lake / "bronze" / "customers")) == 100
    assert silver_table(str(lake / "silver" / "customers")) == silver
    maintenance_keeps_the_rows(maintenance, lake, silver)
    assert "Invalid input for param mode: 'replace' is not one of ['reprocess', 'rebuild']" in bad


def backfills_plan_a_run_per_interval(airflow: AirflowCli) -> None:
    # a backfill over a range gets one run per 15-minute data interval (each takes its interval's files)
    plan = airflow.sh(str(BIN / "airflow"), "backfill", "create", "--dag-id", "cdc_bronze", "--from-date",
                      "2026-11-01T00:00:00", "--to-date", "2026-11-01T00:30:00", "--dry-run").stdout
    planned = re.findall(r"^\| (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\+00:00) ", plan.split("Runs to be attempted:", 1)[1],
                         re.MULTILINE)  # Airflow 3.3 prints the runs as a table
    assert planned == ["2026-11-01 00:00:00+00:00", "2026-11-01 00:15:00+00:00", "2026-11-01 00:30:00+00:00"]
