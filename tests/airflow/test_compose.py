"""docker-compose.yaml without a Docker engine: each defect a user met is caught in the file itself, and what the
services run (the bucket and sample-landing one-shots, the Airflow init, the pipeline service and its healthcheck,
the Spark healthchecks) runs here, on a local S3 endpoint, a local Airflow home and pyspark's own master and worker
(tests/cluster)."""

from __future__ import annotations

import functools
import json
import os
import re
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import fields
from pathlib import Path

import pytest

from spark_jobs.quality.docs_assets import assets_dir
from spark_jobs.service_client import ServiceConnection
from spark_jobs.session import SPARK_SECRET_VARIABLE
from spark_jobs.settings import Settings
from tests.support import COMPOSE_AIRFLOW, ROOT, compose_file, subprocess_env

COMPOSE = compose_file()
SERVICES = COMPOSE["services"]
AIRFLOW = COMPOSE_AIRFLOW
PINS = dict(line.split("==", 1) for line in (ROOT / "requirements.txt").read_text().splitlines() if "==" in line)
BUILD = SERVICES["spark-master"]["build"]["dockerfile_inline"]
PROJECT = "/opt/project"  # where the image holds the project (its Dockerfile COPYs there)
# the secrets' volumes, where the containers mount them
AIRFLOW_AUTH, SERVICE_AUTH, SERVICE_CA = "/opt/airflow/auth", "/opt/service-auth", "/opt/service-ca"
VARIABLE = re.compile(r"\$\{(\w+)(?:(:-|:\?)([^}]*))?\}")


@functools.cache
def dotenv() -> dict[str, str]:
    """The .env `make compose-env` writes (in a folder of its own: the clone's is never touched)."""
    with tempfile.TemporaryDirectory(prefix="cdc-compose-env-") as folder:
        made = subprocess.run(["make", "-s", "-f", str(ROOT / "Makefile"), "-C", folder, "compose-env"],
                              capture_output=True, text=True, timeout=60)
        assert made.returncode == 0, made.stderr
        text = (Path(folder) / ".env").read_text()
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))


def interpolated(value: str, env: dict[str, str]) -> str:
    """`value` as compose reads it with `env` (its .env): ${VAR}, ${VAR:-default}, and ${VAR:?error}, which stops
    compose with the error when VAR is unset or empty."""
    def one(match: re.Match) -> str:
        name, kind, text = match.groups()
        if env.get(name):
            return env[name]
        if kind == ":?":
            raise ValueError(f"{name}: {text}")
        return text if kind == ":-" else ""

    return VARIABLE.sub(one, value)


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


def test_the_images_are_current_the_long_running_services_restart_and_airflow_keeps_its_logs():
    """PostgreSQL at a supported major (18's image refuses a volume at .../data: its data lives one level down), a
    Java package every current Debian ships (trixie has no openjdk-17), restarts for what runs on, none for the
    one-shots (`unless-stopped` would start a finished one again), and one logs volume the scheduler and the
    triggerer write and the API server reads."""
    postgres = SERVICES["postgres"]
    assert int(postgres["image"].split(":")[1].split(".")[0]) >= 18
    assert "postgres-data:/var/lib/postgresql" in postgres["volumes"]
    assert "default-jre-headless" in BUILD and "openjdk-" not in BUILD
    one_shots = {"s3-init", "sample-landing", "airflow-init"}
    for name, service in SERVICES.items():
        assert service.get("restart", "no") == ("no" if name in one_shots else "unless-stopped"), name
    logs = {name for name, s in SERVICES.items() if "airflow-logs:/opt/airflow/logs" in s.get("volumes", [])}
    assert logs == {"airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer"}


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
    for name in ("spark-master", "spark-worker", "s3", "postgres", "pipeline-service", *AIRFLOW[1:]):
        # `docker compose ps` shows each healthy: tests/airflow/test_scheduler.py runs Airflow's against its stack
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
        f"{SERVICE_AUTH}/service.{name}" for name in ("token", "crt", "key")}
    assert f"service-auth:{SERVICE_AUTH}:ro" in service["volumes"]
    assert service["environment"]["CDC_SPARK_MASTER"] == "spark://spark-master:7077"
    assert service["environment"]["CDC_DELTA_ENGINE"] == "delta-spark"
    script = init_script()
    assert (f"python -m spark_jobs service-credentials --dir {SERVICE_AUTH} --host pipeline-service --port "
            f"{options['--port']} --ca-file {SERVICE_CA}/service.crt") in script
    assert f"airflow connections import --overwrite {SERVICE_AUTH}/service-connections-import.json" in script
    for name in AIRFLOW:
        env = SERVICES[name]["environment"]
        assert env["CDC_SERVICE_CONN_ID"] == "cdc_service", name
        assert "AIRFLOW_CONN_SPARK_DEFAULT" not in env and "CDC_SPARK_REMOTE" not in env, name


def test_airflow_services_share_secrets_the_init_makes_and_none_is_in_the_file():
    for name in AIRFLOW:
        env = SERVICES[name]["environment"]
        assert env["AIRFLOW__CORE__FERNET_KEY_CMD"] == f"cat {AIRFLOW_AUTH}/fernet.key", name
        assert env["AIRFLOW__API_AUTH__JWT_SECRET_CMD"] == f"cat {AIRFLOW_AUTH}/jwt.secret", name
        assert "AIRFLOW__API_AUTH__JWT_SECRET" not in env and "AIRFLOW__CORE__FERNET_KEY" not in env
        # the init writes them, the others only read; the API server's simple auth manager opens its passwords file
        # for writing (r+ and a+) even to read it, so its mount stays writable
        mode = "" if name in ("airflow-init", "airflow-apiserver") else ":ro"
        assert f"airflow-auth:{AIRFLOW_AUTH}{mode}" in SERVICES[name]["volumes"], name


def test_no_secret_is_written_in_the_file_and_compose_refuses_to_start_without_them(tmp_path):
    """Every key, password and secret comes from .env (`make compose-env`: drawn once, mode 600, kept on a second
    run); without it each is an error naming the command, as compose's ${VAR:?} stops `up`. The file held the S3
    keys, PostgreSQL's password and Airflow's admin/admin as literals."""
    made = dotenv()
    required = {m.group(1) for m in VARIABLE.finditer((ROOT / "docker-compose.yaml").read_text()) if m.group(2) == ":?"}
    assert required == {"CDC_S3_ACCESS_KEY", "CDC_S3_SECRET_KEY", "CDC_POSTGRES_PASSWORD", "CDC_AIRFLOW_ADMIN_PASSWORD",
                        "CDC_SPARK_SECRET"}
    assert required <= set(made) and all(len(made[name]) >= 16 for name in required)
    assert len(set(made.values())) == len(made)  # each drawn on its own
    secretive = re.compile(r"KEY|SECRET|PASSWORD|TOKEN|SQL_ALCHEMY_CONN|AIRFLOW_CONN_", re.IGNORECASE)
    for name, service in SERVICES.items():
        for key, value in (service.get("environment") or {}).items():
            if secretive.search(key) and not str(value).startswith(("cat ", "/")):  # a secret's file, or its path
                assert VARIABLE.search(str(value)), f"{name}: {key} is written in the file"
                with pytest.raises(ValueError, match="make compose-env"):
                    interpolated(str(value), {})
    airflow_db = interpolated(SERVICES["airflow-scheduler"]["environment"]["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"], made)
    assert airflow_db == f"postgresql+psycopg2://airflow:{made['CDC_POSTGRES_PASSWORD']}@postgres:5432/airflow"
    aws = json.loads(interpolated(SERVICES["airflow-scheduler"]["environment"]["AIRFLOW_CONN_AWS_DEFAULT"], made))
    assert (aws["login"], aws["password"]) == (made["CDC_S3_ACCESS_KEY"], made["CDC_S3_SECRET_KEY"])
    # the file itself, and a second run
    folder = tmp_path
    for _ in range(2):
        subprocess.run(["make", "-s", "-f", str(ROOT / "Makefile"), "-C", str(folder), "compose-env"], check=True,
                       capture_output=True, timeout=60)
        if _ == 0:
            first = (folder / ".env").read_text()
    assert (folder / ".env").read_text() == first and stat.S_IMODE((folder / ".env").stat().st_mode) == 0o600
    assert sorted(p.name for p in folder.iterdir()) == [".env"]
    assert ".env" in (ROOT / ".gitignore").read_text().split() and ".env" in (ROOT / ".dockerignore").read_text().split()
    # a link planted where .env goes, to where the secrets would land for someone else: never written through
    planted, victim = tmp_path / "planted", tmp_path / "victim"
    planted.mkdir()
    (planted / ".env").symlink_to(victim)
    refused = subprocess.run(["make", "-s", "-f", str(ROOT / "Makefile"), "-C", str(planted), "compose-env"],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "remove it" in refused.stderr
    assert not victim.exists() and sorted(p.name for p in planted.iterdir()) == [".env"]


def test_every_published_port_is_on_loopback_unless_the_operator_opts_in():
    """The S3 API and console, the Spark master's UI and Airflow's: 127.0.0.1 by default, another address only
    through CDC_PUBLISH_ADDRESS. The Spark master's RPC port, which runs code on the worker for whoever reaches it,
    and the worker's, PostgreSQL's and the pipeline service's ports are for the containers only."""
    published = {name: service["ports"] for name, service in SERVICES.items() if "ports" in service}
    assert set(published) == {"s3", "spark-master", "airflow-apiserver"}
    for name, ports in published.items():
        for port in ports:
            assert re.fullmatch(r"\$\{CDC_PUBLISH_ADDRESS:-127\.0\.0\.1\}:\d+:\d+", port), (name, port)
            assert interpolated(port, dotenv()).startswith("127.0.0.1:"), (name, port)
            assert interpolated(port, {**dotenv(), "CDC_PUBLISH_ADDRESS": "0.0.0.0"}).startswith("0.0.0.0:")
    assert all(not port.endswith(":7077") for port in published["spark-master"])


def test_each_secret_reaches_only_the_containers_that_use_it():
    """Through the environment and through volumes: the service's secret and TLS key to the service alone (and the
    init that makes them), read-only; Airflow's secrets to Airflow; Spark's secret to Spark; S3's keys to the S3
    server and its clients (the Spark master and worker never had to hold them: each job brings its own)."""
    def holders(variable: str) -> set[str]:
        return {name for name, service in SERVICES.items()
                if any(f"${{{variable}" in str(v) for v in (service.get("environment") or {}).values())}

    s3_clients = {"s3", "s3-init", "sample-landing", "pipeline-service", *AIRFLOW}
    assert holders("CDC_S3_ACCESS_KEY") == holders("CDC_S3_SECRET_KEY") == s3_clients
    assert holders("CDC_POSTGRES_PASSWORD") == {"postgres", *AIRFLOW}
    assert holders("CDC_AIRFLOW_ADMIN_PASSWORD") == {"airflow-init"}
    assert holders("CDC_SPARK_SECRET") == {"spark-master", "spark-worker", "pipeline-service"}

    def mounts(volume: str) -> dict[str, str]:
        return {name: v.split(":", 1)[1] for name, service in SERVICES.items() for v in service.get("volumes", [])
                if v.split(":", 1)[0] == volume}

    assert mounts("service-auth") == {"pipeline-service": f"{SERVICE_AUTH}:ro", "airflow-init": SERVICE_AUTH}
    assert mounts("airflow-auth") == {name: f"{AIRFLOW_AUTH}:ro" for name in AIRFLOW[2:]} | {
        "airflow-init": AIRFLOW_AUTH, "airflow-apiserver": AIRFLOW_AUTH}
    assert mounts("service-ca") == {name: f"{SERVICE_CA}:ro" for name in ["pipeline-service", *AIRFLOW[1:]]} | {
        "airflow-init": SERVICE_CA}
    assert set(COMPOSE["volumes"]) == {"postgres-data", "s3-data", "airflow-auth", "service-auth", "service-ca",
                                       "airflow-logs"}


def test_every_named_volume_is_mounted_where_the_image_has_a_folder_its_user_owns():
    """Docker fills a new named volume from the image's folder at its mount point, ownership included: where the image
    has none, the volume is root's and the init, which runs as the image's user, cannot write its secrets there."""
    made = re.search(r"mkdir -p ([^\\&]+)", BUILD)
    owned = re.search(r"chown airflow: ([^\\&\n]+)", BUILD)
    assert made and owned, BUILD
    folders = set(made.group(1).split()) & set(owned.group(1).split())
    for name, service in SERVICES.items():
        for volume in service.get("volumes", []):
            source, target = volume.split(":")[:2]
            if source in COMPOSE["volumes"] and source not in ("postgres-data", "s3-data"):  # theirs: own images
                assert target in folders, (name, volume)


def test_spark_rpc_is_authenticated_with_the_secret_from_the_env_file():
    """spark.authenticate in the deployment's Spark settings, and the secret (Spark's _SPARK_AUTH_SECRET: outside
    Kubernetes Spark reads no secret file) in each Spark process's environment: the master, the worker (which hands
    it to the executors it starts) and the service's driver (spark_jobs/session.py makes it the driver's setting).
    tests/cluster runs the cluster this way, and shows a driver without the secret refused."""
    conf = dict(line.split(None, 1) for line in (ROOT / "include" / "spark-conf" / "spark-defaults.conf").read_text()
                .splitlines() if line.strip() and not line.startswith("#"))
    assert conf["spark.authenticate"].strip() == "true"
    for name in ("spark-master", "spark-worker", "pipeline-service"):
        env = SERVICES[name]["environment"]
        assert env["SPARK_CONF_DIR"] == f"{PROJECT}/include/spark-conf", name
        assert interpolated(env[SPARK_SECRET_VARIABLE], dotenv()) == dotenv()["CDC_SPARK_SECRET"], name


def test_the_login_the_readme_gives_is_the_one_the_deployment_sets(tmp_path):
    """admin, with .env's password: the init writes Airflow's passwords file from it at every start."""
    env = SERVICES["airflow-apiserver"]["environment"]
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"] == "admin:admin"  # user admin, role admin
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"] == f"{AIRFLOW_AUTH}/passwords.json"
    step = next(line for line in init_script().splitlines() if "passwords.json" in line)
    written = subprocess.run(["bash", "-c", step.replace("python", sys.executable, 1) + " && cat passwords.json"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=60,
                             env={**os.environ, "CDC_AIRFLOW_ADMIN_PASSWORD": "p4ss \"quoted\""})
    assert json.loads(written.stdout) == {"admin": 'p4ss "quoted"'}
    assert "grep AIRFLOW_ADMIN_PASSWORD .env" in (ROOT / "README.md").read_text()


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
    assert "AWS_SECRET_ACCESS_KEY" not in SERVICES["spark-worker"]["environment"]


# --- what the services run, run here ------------------------------------------------------------------------------

def init_script() -> str:
    command = SERVICES["airflow-init"]["command"]
    assert command[:4] == ["bash", "-euo", "pipefail", "-c"], command  # any failing step fails the one-shot
    assert "||" not in command[4].replace("] ||", "")  # no step's failure is turned into success
    return command[4]


def compose_env(service: str, **local: str) -> dict[str, str]:
    """The service's environment for a process here: compose's values, with `local` in place of its addresses."""
    env = {k: interpolated(str(v), dotenv()) for k, v in (SERVICES[service].get("environment") or {}).items()}
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
    init made, as the tasks submit theirs, brings the files to gold on S3 (a local master here: tests/cluster runs the
    same service on a standalone cluster)."""
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
    here = {SERVICE_AUTH: str(auth), SERVICE_CA: str(tmp_path / "ca"), "pipeline-service": "localhost", "8793": port,
            "/tmp/cdc-service-connection.json": str(tmp_path / "written-connection.json")}

    def localised(text: str) -> str:
        for there, local_value in here.items():
            text = text.replace(there, local_value)
        return text

    credentials = next(line for line in init_script().splitlines() if "service-credentials" in line)
    # a local master in place of the cluster (tests/cluster runs this service on one, writing with delta-spark from its
    # executors, compose's engine): here the driver writes (delta-rs), and as on compose's cluster there is no warm-up
    env = compose_env("pipeline-service", **local, CDC_SPARK_MASTER="local[2]", CDC_DELTA_ENGINE="delta-rs",
                      CDC_SERVICE_WARM_UP="false")
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
def test_the_airflow_init_fails_when_a_step_fails_and_sets_everything_up_when_none_does(tmp_path, postgres_server):
    """Its secrets once (the same on a second start), the migration on PostgreSQL, the writer pools; a database
    that does not answer fails the one-shot (it ended in `|| echo` once: exit 0, and the services started on an
    unmigrated database, without pools)."""
    from tests.support import free_port

    auth, service_auth, ca = tmp_path / "auth", tmp_path / "service-auth", tmp_path / "service-ca"
    for folder in (auth, service_auth, ca):
        folder.mkdir()
    here = {AIRFLOW_AUTH: str(auth), SERVICE_AUTH: str(service_auth), SERVICE_CA: str(ca), PROJECT: str(ROOT)}

    def localised(text: str) -> str:
        for there, local_value in here.items():
            text = text.replace(there, local_value)
        return text

    script = localised(init_script())
    base = {k: localised(v) for k, v in compose_env("airflow-init", AIRFLOW_HOME=str(tmp_path / "home")).items()}

    def init(database: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True, timeout=600,
                              env={**base, "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": database})

    assert init(f"postgresql+psycopg2://postgres@127.0.0.1:{free_port()}/airflow").returncode != 0
    database = postgres_server.database("compose_init")  # new and empty: the init migrates it
    done = init(database)
    assert done.returncode == 0, done.stderr[-3000:]
    secrets = {name: (auth / name).read_text() for name in ("fernet.key", "jwt.secret", "api.secret")}
    assert all(len(v.strip()) >= 32 for v in secrets.values())
    assert all(oct((auth / name).stat().st_mode)[-3:] == "600" for name in secrets)
    pools = subprocess.run(["airflow", "pools", "list", "-o", "json"], capture_output=True, text=True, timeout=300,
                           env={**base, "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": database})
    assert "cdc_gold_customers_by_state" in {p["pool"] for p in json.loads(pools.stdout)}
    # the connection as Airflow stores it (encrypted) and gives it to the tasks and the triggerer
    stored = subprocess.run(["airflow", "connections", "get", "cdc_service", "-o", "json"], capture_output=True,
                            text=True, timeout=300, env={**base, "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": database})
    conn = json.loads(stored.stdout)[0]
    assert conn["is_encrypted"] == "True" and conn["conn_type"] == "cdc_pipeline_service"
    assert ServiceConnection.at(conn["schema"], conn["host"], int(conn["port"]), conn["password"],
                                conn["extra_dejson"]["verify"]) == ServiceConnection(
        "https://pipeline-service:8793", (service_auth / "service.token").read_text().strip(),
        str(ca / "service.crt"))
    assert json.loads((auth / "passwords.json").read_text()) == {"admin": dotenv()["CDC_AIRFLOW_ADMIN_PASSWORD"]}
    # Airflow's folder holds Airflow's secrets only; the service's secret and key are in the service's
    assert sorted(p.name for p in auth.iterdir()) == ["api.secret", "fernet.key", "jwt.secret", "passwords.json"]
    assert sorted(p.name for p in ca.iterdir()) == ["service.crt"]
    secrets.update({name: (service_auth / name).read_text() for name in ("service.token", "service.key")})
    assert all(oct(((service_auth if name.startswith("service") else auth) / name).stat().st_mode)[-3:] == "600"
               for name in secrets)
    assert init(database).returncode == 0
    assert secrets == {name: ((service_auth if name.startswith("service") else auth) / name).read_text()
                       for name in secrets}  # kept, not remade


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
    quickstart = readme[readme.index("## The compose stack"):readme.index("## Where to read on")]
    commands = [line.split("#")[0].strip() for line in quickstart.split("```bash")[1].split("```")[0].strip().splitlines()]
    assert commands[:2] == ["make compose-env", "docker compose up -d --build"], commands
    assert len(quickstart.splitlines()) <= 25
    guide = (ROOT / "docs" / "deployment.md").read_text()
    assert "docker compose up -d --build" in guide and "sample-landing" in guide and "make compose-env" in guide
    assert SERVICES["s3"]["image"] in guide and "minio" not in guide.lower()
    assert "admin / admin" not in readme + guide and "cdc-s3-secret" not in readme + guide
