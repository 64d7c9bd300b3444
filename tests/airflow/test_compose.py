"""docker-compose.yaml without a Docker engine: each defect a user met is caught in the file itself, and what the
services run (the bucket and sample-landing one-shots, the Airflow init, the pipeline service and its healthcheck,
the Spark healthchecks) runs here, on a local S3 endpoint, a local Airflow home and pyspark's own master and worker
(tests/cluster)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

from spark_jobs.quality.docs_assets import assets_dir
from spark_jobs.service_client import ServiceConnection
from spark_jobs.settings import Settings
from tests.conftest import subprocess_env

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yaml").read_text())
SERVICES = COMPOSE["services"]
AIRFLOW = ["airflow-init", "airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer"]
PINS = dict(line.split("==", 1) for line in (ROOT / "requirements.txt").read_text().splitlines() if "==" in line)
BUILD = SERVICES["spark-master"]["build"]["dockerfile_inline"]
PROJECT = "/opt/project"  # where the image holds the project (its Dockerfile COPYs there)


def base_images() -> list[str]:
    images = [s["image"] for s in SERVICES.values() if "build" not in s]
    for service in SERVICES.values():
        inline = (service.get("build") or {}).get("dockerfile_inline", "")
        images += re.findall(r"^FROM\s+(\S+)", inline, re.MULTILINE)
    return images


def bind_mounts(service: str) -> dict[str, str]:
    """host path -> container path of the service's bind mounts (named volumes left out)."""
    out = {}
    for volume in SERVICES[service].get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("."):
            out[source] = target
    return out


def test_the_deployment_has_every_component():
    assert set(SERVICES) == {"postgres", "s3", "s3-init", "sample-landing", "spark-master", "spark-worker",
                             "pipeline-service", *AIRFLOW}
    assert SERVICES["pipeline-service"]["command"][:4] == ["python", "-m", "spark_jobs", "serve"]
    commands = {name: " ".join(SERVICES[name]["command"]) for name in AIRFLOW[1:]}
    assert commands["airflow-apiserver"] == "airflow api-server"
    assert commands["airflow-dag-processor"] == "airflow dag-processor"
    assert commands["airflow-triggerer"] == "airflow triggerer"


def test_every_image_is_pinned_to_an_exact_version_and_none_is_a_deleted_minio_one():
    for image in base_images():
        name, _, tag = image.rpartition(":")
        assert name and re.search(r"\d+\.\d+", tag), f"not pinned to an exact version: {image}"
        assert not name.startswith("minio/"), f"{image}: the minio repositories were deleted from Docker Hub"


def test_the_s3_server_is_the_maintained_one_that_honours_conditional_writes():
    """RustFS (the lease and delta-rs rely on If-None-Match / If-Match); every S3 client points at it."""
    assert SERVICES["s3"]["image"].startswith("rustfs/rustfs:")
    assert "healthcheck" in SERVICES["s3"]
    for name, service in SERVICES.items():
        env = service.get("environment") or {}
        if "AWS_ENDPOINT_URL" in env:
            assert env["AWS_ENDPOINT_URL"] == "http://s3:9000", name
    conf = (ROOT / "include" / "spark-conf" / "spark-defaults.conf").read_text()
    assert re.search(r"^spark\.hadoop\.fs\.s3a\.endpoint\s+http://s3:9000$", conf, re.MULTILINE)


def test_one_slim_image_runs_airflow_and_spark_with_the_runtime_lock_and_pinned_jars():
    """Airflow's and Spark's Python are one (a driver and its executors on different Pythons fail every Python UDF
    with PYTHON_VERSION_MISMATCH); Spark is pyspark's own, as in the tests' live cluster; the slim image gets the
    runtime lock alone, which holds no test or lint tool."""
    assert {i for i in base_images() if "airflow" in i} == {f"apache/airflow:slim-{PINS['apache-airflow']}-python3.11"}
    images = {name: s["image"] for name, s in SERVICES.items() if "build" in s or s.get("image", "").startswith("cdc")}
    assert len(set(images.values())) == 1, images
    installs = re.findall(r"pip install (.*)", BUILD)
    assert installs[0] == f"--no-cache-dir -r {PROJECT}/requirements.txt", installs  # nothing beside the lock
    assert not {"pytest", "moto", "selenium", "mypy", "ruff", "hypothesis", "duckdb"} & {p.lower() for p in PINS}
    assert "python -m spark_jobs jars" in BUILD and "CDC_JARS_DIR=/opt/cdc-jars" in BUILD  # spark_jobs/jvm.py's list
    for copied in re.findall(r"^\s*COPY --chown=airflow (.+) \S+$", BUILD, re.MULTILINE):
        for path in copied.split():
            assert (ROOT / path).exists(), path  # the build context has it (and .dockerignore lets it through)
    for name in ("spark-master", "spark-worker"):
        assert SERVICES[name]["command"][0] == "spark-class" and SERVICES[name]["entrypoint"] == []


def test_no_mount_hides_what_the_image_built():
    """The image fetches the Data Docs assets into the package and the jars beside it: a bind mount over either
    (./spark_jobs once was) hid them, and every gate failed with a config error on a clone without `make assets`."""
    built = [f"{PROJECT}/{assets_dir().relative_to(ROOT).as_posix()}", "/opt/cdc-jars"]
    for name in SERVICES:
        for source, target in bind_mounts(name).items():
            assert (ROOT / source).is_dir(), (name, source)
            for path in built:
                assert not (path + "/").startswith(target.rstrip("/") + "/"), f"{name}: {source}:{target} hides {path}"


def test_the_build_context_leaves_out_local_state_and_secrets():
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert {".git", ".venv", ".jars", "data", ".airflow", ".service-connection.json", "test-artifacts"} <= ignored
    assert not {"dags", "spark_jobs", "plugins", "include", "requirements.txt", "pyproject.toml", "README.md"} & ignored


def test_the_pipeline_service_is_the_clusters_one_application_and_everything_waits_for_health():
    conf = dict(line.split(None, 1) for line in (ROOT / "include" / "spark-conf" / "spark-defaults.conf").read_text()
                .splitlines() if line.strip() and not line.startswith("#"))
    worker = SERVICES["spark-worker"]["environment"]
    assert int(conf["spark.cores.max"].strip()) <= int(worker["SPARK_WORKER_CORES"])
    executor_gb = int(conf["spark.executor.memory"].strip().removesuffix("g"))
    assert executor_gb <= int(worker["SPARK_WORKER_MEMORY"].removesuffix("g"))
    for name in ("spark-master", "spark-worker", "s3", "postgres", "pipeline-service"):
        assert "healthcheck" in SERVICES[name], name
    assert conditions("pipeline-service") == {
        "s3-init": "service_completed_successfully", "spark-master": "service_healthy",
        "spark-worker": "service_healthy", "airflow-init": "service_completed_successfully"}
    for name in AIRFLOW[1:]:
        assert conditions(name) == {
            "postgres": "service_healthy", "s3-init": "service_completed_successfully",
            "airflow-init": "service_completed_successfully", "pipeline-service": "service_healthy"}, name


def conditions(service: str) -> dict[str, str]:
    return {name: wait["condition"] for name, wait in SERVICES[service]["depends_on"].items()}


def serve_options(command: list[str]) -> dict[str, str]:
    return dict(zip(command[4::2], command[5::2], strict=True))


def test_every_layer_job_goes_to_the_pipeline_service_over_tls_with_the_secret_the_init_made():
    """One execution model from the demo to the cluster: the tasks submit to the service (no spark-submit, no Spark
    connection in Airflow); the service listens beyond loopback only with TLS and a secret, answers only to its
    name, and runs on the cluster with delta-spark (the executors write)."""
    service = SERVICES["pipeline-service"]
    options = serve_options(service["command"])
    assert options["--host"] == "0.0.0.0" and options["--allow-host"] == "pipeline-service"
    assert service["hostname"] == "pipeline-service"
    assert {options["--token-file"], options["--tls-cert"], options["--tls-key"]} == {
        f"/opt/airflow/auth/service.{name}" for name in ("token", "crt", "key")}
    assert "airflow-auth:/opt/airflow/auth:ro" in service["volumes"]
    assert service["environment"]["CDC_SPARK_MASTER"] == "spark://spark-master:7077"
    assert service["environment"]["CDC_DELTA_ENGINE"] == "delta-spark"
    script = init_script()
    assert (f"python -m spark_jobs service-credentials --dir /opt/airflow/auth --host pipeline-service --port "
            f"{options['--port']}") in script
    assert "airflow connections import --overwrite /opt/airflow/auth/service-connections-import.json" in script
    for name in AIRFLOW:
        env = SERVICES[name]["environment"]
        assert env["CDC_SERVICE_CONN_ID"] == "cdc_service", name
        assert "AIRFLOW_CONN_SPARK_DEFAULT" not in env and "CDC_SPARK_REMOTE" not in env, name


def test_airflow_services_share_secrets_the_init_makes_and_none_is_in_the_file():
    for name in AIRFLOW:
        env = SERVICES[name]["environment"]
        assert env["AIRFLOW__CORE__FERNET_KEY_CMD"] == "cat /opt/airflow/auth/fernet.key", name
        assert env["AIRFLOW__API_AUTH__JWT_SECRET_CMD"] == "cat /opt/airflow/auth/jwt.secret", name
        assert "AIRFLOW__API_AUTH__JWT_SECRET" not in env and "AIRFLOW__CORE__FERNET_KEY" not in env
        assert "airflow-auth:/opt/airflow/auth" in SERVICES[name]["volumes"]


def test_the_login_the_readme_gives_is_the_one_the_deployment_sets():
    env = SERVICES["airflow-apiserver"]["environment"]
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"] == "admin:admin"  # user admin, role admin
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"] == "/opt/airflow/auth/passwords.json"
    assert """echo '{"admin": "admin"}' > passwords.json""" in init_script()
    assert "admin / admin" in (ROOT / "README.md").read_text()


def test_airflow_services_get_the_cdc_environment():
    code_reads = {Settings.variable(f.name) for f in fields(Settings)}
    contract = {"CDC_CONFIG", "CDC_LANDING_URI", "CDC_LAKE_URI"}  # docs/architecture.md, "Environment"
    assert contract <= code_reads
    for name in AIRFLOW:
        env = SERVICES[name]["environment"]
        assert contract <= set(env), name
        assert bind_mounts(name) == {"./include": f"{PROJECT}/include"}
        assert env["AIRFLOW__CORE__DAGS_FOLDER"] == f"{PROJECT}/dags"
        assert "PYTHONPATH" not in env  # the project is installed in the image
        assert env["CDC_CONFIG"] == f"{PROJECT}/include/tables.yaml"
        # landing and lake on S3, which the Spark executors read and write themselves
        assert env["CDC_LANDING_URI"].startswith("s3://landing/") and env["CDC_LAKE_URI"].startswith("s3://lake/")
        assert '"endpoint_url": "http://s3:9000"' in env["AIRFLOW_CONN_AWS_DEFAULT"]
    service = SERVICES["pipeline-service"]["environment"]  # the same deployment: registry, landing, lake
    assert {k: service[k] for k in contract} == {k: env[k] for k in contract}
    assert service["SPARK_CONF_DIR"] == f"{PROJECT}/include/spark-conf"
    assert env["AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION"] == "False"  # the sample data moves on `up`
    assert SERVICES["spark-worker"]["environment"]["AWS_ENDPOINT_URL"] == "http://s3:9000"


# --- what the services run, run here ------------------------------------------------------------------------------

def init_script() -> str:
    command = SERVICES["airflow-init"]["command"]
    assert command[:4] == ["bash", "-euo", "pipefail", "-c"], command  # any failing step fails the one-shot
    assert "||" not in command[4].replace("] ||", "")  # no step's failure is turned into success
    return command[4]


def compose_env(service: str, **local: str) -> dict[str, str]:
    """The service's environment for a process here: compose's values, with `local` in place of its addresses."""
    env = {k: str(v) for k, v in (SERVICES[service].get("environment") or {}).items()}
    env = {k: v.replace(f"{PROJECT}/include", str(ROOT / "include")) for k, v in env.items()}
    return subprocess_env(**{**env, **local})


def run_service(service: str, env: dict[str, str], cwd: Path = ROOT) -> subprocess.CompletedProcess:
    command = [sys.executable if part == "python" else part for part in SERVICES[service]["command"]]
    command = [part.replace(f"{PROJECT}/include", str(ROOT / "include")) for part in command]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_the_one_shots_and_the_pipeline_service_bring_the_sample_data_to_gold(s3_endpoint, tmp_path):
    """s3-init makes the buckets (and says so the second time), sample-landing lands the demo's Debezium files in
    the landing bucket; the init's credentials step, the pipeline service as compose starts it (beyond loopback:
    TLS, the secret from its file) and its healthcheck run here, and a job submitted through the connection the
    init made, as the tasks submit theirs, brings the files to gold with delta-spark on S3 (a local master here:
    tests/cluster runs the same service on a standalone cluster)."""
    import boto3

    from spark_jobs.service_client import JobRequest, ServiceConnection, poll, submit
    from tests.support import free_port

    client = boto3.client("s3", endpoint_url=s3_endpoint, aws_access_key_id="test", aws_secret_access_key="test",
                          region_name="us-east-1")
    for bucket in ("landing", "lake"):
        client.delete_bucket(Bucket=bucket)  # the fixture's: the one-shot makes them
    local = {"AWS_ENDPOINT_URL": s3_endpoint, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}
    first = run_service("s3-init", compose_env("s3-init", **local))
    assert first.returncode == 0, first.stderr[-3000:]
    assert first.stdout.splitlines() == ["bucket landing: created", "bucket lake: created"]
    again = run_service("s3-init", compose_env("s3-init", **local))
    assert again.stdout.splitlines() == ["bucket landing: exists", "bucket lake: exists"]

    landed = run_service("sample-landing", compose_env("sample-landing", **local))
    assert landed.returncode == 0, landed.stderr[-3000:]
    keys = [o["Key"] for page in client.get_paginator("list_objects_v2").paginate(Bucket="landing", Prefix="cdc/topics/")
            for o in page.get("Contents", [])]
    assert keys and all(re.fullmatch(r"cdc/topics/[^/]+/partition=\d+/[^/]+\+\d+\+\d{10}\.json(\.gz)?", k) for k in keys)

    # compose's names and paths, here: the service is reached as localhost on a free port, its files in tmp_path
    auth, port = tmp_path / "auth", str(free_port())
    here = {"/opt/airflow/auth": str(auth), "pipeline-service": "localhost", "8793": port,
            "/tmp/cdc-service-connection.json": str(tmp_path / "written-connection.json")}

    def localised(text: str) -> str:
        for there, local_value in here.items():
            text = text.replace(there, local_value)
        return text

    credentials = next(line for line in init_script().splitlines() if "service-credentials" in line)
    env = compose_env("pipeline-service", **local, CDC_SPARK_MASTER="local[2]")
    made = subprocess.run(localised(credentials).replace("python", sys.executable, 1).split(), env=env,
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr[-3000:]
    command = [localised(part) for part in SERVICES["pipeline-service"]["command"]]
    command[0] = sys.executable
    healthcheck = localised(SERVICES["pipeline-service"]["healthcheck"]["test"][3])

    def healthy() -> bool:
        return subprocess.run([sys.executable, "-c", healthcheck], env=env, capture_output=True, timeout=60).returncode == 0

    assert not healthy()
    with (tmp_path / "service.log").open("w") as log:
        service = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 300
            while not healthy():
                assert service.poll() is None and time.monotonic() < deadline, (tmp_path / "service.log").read_text()[-3000:]
                time.sleep(2)
            connection = ServiceConnection.from_file(auth / "service-connection.json")
            assert connection.url == f"https://localhost:{port}"
            request = JobRequest.from_argv(["run", "--lake", "unused", "--landing", "unused", "--tables", "customers",
                                            "--models", "customers_by_state", "--layers", "bronze,silver,gold"])
            job = submit(connection, request)
            while not (status := poll(connection, job)).done:
                assert time.monotonic() < deadline + 600, status.log[-3000:]
                time.sleep(1)
            assert status.exit_code == 0, status.log[-5000:]
        finally:
            service.terminate()
            service.wait(timeout=120)
    status_run = subprocess.run([sys.executable, "-m", "spark_jobs", "status", "--config", env["CDC_CONFIG"], "--lake",
                                 env["CDC_LAKE_URI"], "--json"], cwd=ROOT, env=env, capture_output=True, text=True,
                                timeout=300)
    rows = {(t["name"], layer): s["rows"] for t in json.loads(status_run.stdout)["tables"] for layer, s in t["layers"].items()}
    assert rows[("customers", "silver")] > 0 and rows[("customers_by_state", "gold")] > 0, rows


@pytest.mark.slow
def test_the_airflow_init_fails_when_a_step_fails_and_sets_everything_up_when_none_does(tmp_path):
    """Its secrets once (the same on a second start), the migration on PostgreSQL, the writer pools; a database
    that does not answer fails the one-shot (it ended in `|| echo` once: exit 0, and the services started on an
    unmigrated database, without pools)."""
    from tests.airflow.test_scheduler import postgres
    from tests.support import free_port

    auth = tmp_path / "auth"
    auth.mkdir()
    script = init_script().replace("/opt/airflow/auth", str(auth))
    base = {k: v.replace("/opt/airflow/auth", str(auth)).replace(PROJECT, str(ROOT))
            for k, v in compose_env("airflow-init", AIRFLOW_HOME=str(tmp_path / "home")).items()}

    def init(database: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True, timeout=600,
                              env={**base, "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": database})

    assert init(f"postgresql+psycopg2://postgres@127.0.0.1:{free_port()}/airflow").returncode != 0
    with postgres() as database:
        done = init(database)
        assert done.returncode == 0, done.stderr[-3000:]
        secrets = {name: (auth / name).read_text() for name in ("fernet.key", "jwt.secret", "api.secret")}
        assert all(len(v.strip()) >= 32 for v in secrets.values())
        assert all(oct((auth / name).stat().st_mode)[-3:] == "600" for name in secrets)
        pools = subprocess.run(["airflow", "pools", "list", "-o", "json"], capture_output=True, text=True, timeout=300,
                               env={**base, "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": database})
        assert {"cdc_table_customers", "cdc_gold_customers_by_state"} <= {p["pool"] for p in json.loads(pools.stdout)}
        # the connection as Airflow stores it (encrypted) and gives it to the tasks and the triggerer
        stored = subprocess.run(["airflow", "connections", "get", "cdc_service", "-o", "json"], capture_output=True,
                                text=True, timeout=300, env={**base, "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": database})
        conn = json.loads(stored.stdout)[0]
        assert conn["is_encrypted"] == "True" and conn["conn_type"] == "http"
        assert ServiceConnection.at(conn["schema"], conn["host"], int(conn["port"]), conn["password"],
                                    conn["extra_dejson"]["ca_file"]) == ServiceConnection(
            "https://pipeline-service:8793", (auth / "service.token").read_text().strip(), str(auth / "service.crt"))
        secrets.update({name: (auth / name).read_text() for name in ("service.token", "service.key", "service.crt")})
        assert all(oct((auth / name).stat().st_mode)[-3:] == "600" for name in secrets)
        assert init(database).returncode == 0
        assert secrets == {name: (auth / name).read_text() for name in secrets}  # kept, not remade


@pytest.mark.slow
def test_the_spark_healthchecks_pass_on_a_live_master_and_worker_and_fail_without_them(tmp_path):
    from tests.support import free_port, standalone_cluster

    ui = {"master": free_port(), "worker": free_port()}

    def check(service: str) -> int:
        test = SERVICES[service]["healthcheck"]["test"]
        assert test[:2] == ["CMD", "python"]
        code = test[3].replace("localhost:8080", f"localhost:{ui['master']}").replace("localhost:8081",
                                                                                      f"localhost:{ui['worker']}")
        return subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60).returncode

    assert check("spark-master") != 0 and check("spark-worker") != 0
    with standalone_cluster(tmp_path, ui_ports=(ui["master"], ui["worker"])):
        assert check("spark-master") == 0 and check("spark-worker") == 0


def test_the_readme_walks_the_stack_that_is_here():
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Running on a cluster"):]
    assert "docker compose up -d --build" in section and "sample-landing" in section
    assert SERVICES["s3"]["image"] in section and "minio" not in section.lower()
