"""Airflow for real, as a deployment runs it: a throwaway PostgreSQL for its metadata database, its components
(api-server, scheduler, dag-processor, triggerer) as processes with the LocalExecutor, the project's DAGs and
plugins, and its REST API as the admin user. The real-scheduler tests and workload D's scheduler cycle use it."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from tests.support import ROOT, aws_connection, free_port, service_airflow_env, subprocess_env

BIN = Path(sys.executable).parent
PG_BIN = max(Path("/usr/lib/postgresql").glob("*/bin"), default=None, key=lambda p: int(p.parent.name))


def _as_postgres(command: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: as the `postgres` user the Debian package creates, when root."""
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


@contextmanager
def postgres() -> Iterator[str]:
    """A throwaway PostgreSQL cluster on a free loopback port; yields Airflow's SQLAlchemy URL."""
    assert PG_BIN is not None, "PostgreSQL is needed: apt-get install postgresql (.ci/run and make test do)"
    root = Path(tempfile.mkdtemp(prefix="cdc-pg-"))  # outside pytest's 0700 folders: the postgres user reads it
    root.chmod(0o755)
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
    data, port = root / "data", free_port()
    try:
        subprocess.run(_as_postgres([str(PG_BIN / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres",
                                     "--no-sync"]), check=True, capture_output=True)
        subprocess.run(_as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(data), "-l", str(root / "server.log"), "-w",
                                     "-o", f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off", "start"]),
                       check=True, capture_output=True)
        subprocess.run(_as_postgres([str(PG_BIN / "psql"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres",
                                     "-c", "CREATE DATABASE airflow"]), check=True, capture_output=True)
        yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/airflow"
    finally:
        subprocess.run(_as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "fast", "stop"]), capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


class Airflow:
    """Airflow's components as their own processes, and its REST API as the admin user."""

    def __init__(self, env: dict[str, str], home: Path):
        self.env, self.home, self.base, self.token = env, home, env["AIRFLOW__API__BASE_URL"], ""

    @contextmanager
    def running(self) -> Iterator[None]:
        with ExitStack() as stack:
            for component in (["api-server", "-H", "127.0.0.1", "-p", self.base.rsplit(":", 1)[1], "-w", "1"],
                              ["scheduler"], ["dag-processor"], ["triggerer"]):
                stack.enter_context(self._process(component))
            self._wait_for_api()
            yield

    @contextmanager
    def _process(self, args: list[str]) -> Iterator[None]:
        log = (self.home / f"{args[0]}.log").open("w")
        process = subprocess.Popen([str(BIN / "airflow"), *args], cwd=ROOT, env=self.env, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        try:
            yield
        finally:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
            log.close()

    def _wait_for_api(self) -> None:
        deadline = time.monotonic() + 180
        while True:
            try:
                login = urllib.request.Request(f"{self.base}/auth/token", headers={"Content-Type": "application/json"},
                                               data=json.dumps({"username": "admin", "password": "admin"}).encode())
                with urllib.request.urlopen(login, timeout=10) as r:
                    self.token = json.loads(r.read())["access_token"]
                return
            except OSError:
                assert time.monotonic() < deadline, self.logs()
                time.sleep(1)

    def api(self, method: str, path: str, body: dict | None = None, prefix: str = "/api/v2") -> Any:
        """The REST API (the UI's own endpoints with prefix /ui)."""
        request = urllib.request.Request(f"{self.base}{prefix}{path}", method=method,
                                         data=None if body is None else json.dumps(body).encode(),
                                         headers={"Authorization": f"Bearer {self.token}",
                                                  "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as r:
            return json.loads(r.read() or b"{}")

    def runs(self, dag_id: str) -> list[dict]:
        """The DAG's runs; none while the dag-processor has not parsed it yet (a 404)."""
        from urllib.error import HTTPError

        try:
            return self.api("GET", f"/dags/{dag_id}/dagRuns?order_by=start_date&limit=100")["dag_runs"]
        except HTTPError as error:
            if error.code == 404:
                return []
            raise

    def task_instances(self, dag_id: str, run_id: str) -> dict[str, dict]:
        from urllib.parse import quote

        found = self.api("GET", f"/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances")["task_instances"]
        return {t["task_id"]: t for t in found}

    def wait(self, what: str, condition, timeout_s: float = 600, poll_s: float = 2):  # noqa: ANN001
        """`condition()`'s first true value; a REST call that times out (an API server on a loaded machine) is asked
        again at the next poll, until `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                found = condition()
            except TimeoutError:
                found = None
            if found:
                return found
            assert time.monotonic() < deadline, f"timed out waiting for {what}\n{self.logs()}"
            time.sleep(poll_s)

    def finished(self, dag_id: str, run_id: str) -> dict:
        run = self.wait(f"{dag_id} {run_id}", lambda: next(
            (r for r in self.runs(dag_id) if r["dag_run_id"] == run_id and r["state"] in ("success", "failed")), None))
        assert run["state"] == "success", (run, self.task_instances(dag_id, run_id), self.logs())
        return run

    def advanced(self, dag_id: str, since: dt.datetime | None = None) -> set[str]:
        """The tables whose asset the DAG's pass tasks have updated (each event's `table`; `since`: at or after), in
        pages of the API's listing."""
        from urllib.parse import quote

        found: set[str] = set()
        offset = 0
        after = f"&timestamp_gte={quote(since.isoformat())}" if since else ""
        while True:
            page = self.api("GET", f"/assets/events?source_dag_id={dag_id}&limit=100&offset={offset}{after}")["asset_events"]
            found |= {e["extra"].get("table") for e in page if e.get("extra")}
            if len(page) < 100:
                return found
            offset += len(page)

    def unpause(self, dag_id_pattern: str, count: int, timeout_s: float = 600) -> None:
        """Unpauses the DAGs whose ids match the SQL LIKE pattern, once the dag-processor has parsed `count` of them."""
        from urllib.parse import quote

        query = f"/dags?dag_id_pattern={quote(dag_id_pattern)}"
        self.wait(f"{count} DAGs like {dag_id_pattern}", lambda: self.api("GET", f"{query}&limit=1")["total_entries"]
                  >= count, timeout_s)
        self.api("PATCH", query, {"is_paused": False})

    def deferred_sensor(self) -> str | None:
        """The cdc_bronze run whose landing sensor waits deferred, if any."""
        for run in self.runs("cdc_bronze"):
            if self.task_instances("cdc_bronze", run["dag_run_id"]).get("landing_sense", {}).get("state") == "deferred":
                return run["dag_run_id"]
        return None

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-2500:]}" for p in sorted(self.home.glob("*.log")))


def airflow_env(home: Path, database: str, service, s3_endpoint: str | None, deployment: dict[str, str],  # noqa: ANN001
                **extra: str) -> dict[str, str]:
    """Airflow's components on `database` with the LocalExecutor, the project's DAGs and plugins, its tasks
    submitting to `service`, S3 at the local endpoint (if any); the admin user's password is `admin`. Migrated,
    pools made."""
    home.mkdir()
    (home / "passwords.json").write_text(json.dumps({"admin": "admin"}))
    port = free_port()
    settings = dict(
        **service_airflow_env(service),
        AIRFLOW_HOME=str(home), AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=database,
        AIRFLOW__CORE__EXECUTOR="LocalExecutor", AIRFLOW__CORE__DAGS_FOLDER=str(ROOT / "dags"),
        AIRFLOW__CORE__PLUGINS_FOLDER=str(ROOT / "plugins"), AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION="False",
        AIRFLOW__CORE__EXECUTION_API_SERVER_URL=f"http://127.0.0.1:{port}/execution/",
        AIRFLOW__API__BASE_URL=f"http://127.0.0.1:{port}", AIRFLOW__API_AUTH__JWT_SECRET="e2e-secret",
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS="admin:admin",
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE=str(home / "passwords.json"),
        AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL="5", AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC="2",
        AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME="0.25",
        AIRFLOW_CONN_SPARK_DEFAULT='{"conn_type": "spark", "host": "local[1]"}',
        **({"AIRFLOW_CONN_AWS_DEFAULT": aws_connection(s3_endpoint)} if s3_endpoint else {}), **deployment)
    env = subprocess_env(**{**settings, **extra})
    subprocess.run([str(BIN / "airflow"), "db", "migrate"], cwd=ROOT, env=env, check=True, capture_output=True)
    subprocess.run([str(BIN / "python"), "-m", "cdc_airflow.pools"], cwd=ROOT, env=env, check=True, capture_output=True)
    return env

