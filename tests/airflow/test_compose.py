"""docker-compose.yaml is validated statically (no Docker engine here): it parses, every image is
pinned, and its environment and volumes match what the code reads."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import yaml

from spark_jobs.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yaml").read_text())
SERVICES = COMPOSE["services"]
AIRFLOW = ["airflow-init", "airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer"]
PINS = dict(line.split("==", 1) for line in (ROOT / "requirements.txt").read_text().splitlines() if "==" in line)


def base_images() -> list[str]:
    images = [s["image"] for s in SERVICES.values() if "build" not in s]
    for service in SERVICES.values():
        inline = (service.get("build") or {}).get("dockerfile_inline", "")
        images += re.findall(r"^FROM\s+(\S+)", inline, re.MULTILINE)
    return images


def test_the_deployment_has_every_component():
    assert set(SERVICES) == {"postgres", "minio", "minio-init", "spark-master", "spark-worker", *AIRFLOW}
    commands = {name: " ".join(SERVICES[name]["command"]) for name in AIRFLOW}
    assert commands["airflow-apiserver"] == "airflow api-server"
    assert commands["airflow-dag-processor"] == "airflow dag-processor"
    assert commands["airflow-triggerer"] == "airflow triggerer"


def test_every_image_is_pinned():
    for image in base_images():
        name, _, tag = image.rpartition(":")
        assert name and tag and tag != "latest", f"unpinned image {image}"


def test_one_image_runs_airflow_and_spark_with_the_pinned_python_packages_and_jars():
    """Airflow's and Spark's Python are one (a driver and its executors on different Pythons fail every
    Python UDF with PYTHON_VERSION_MISMATCH); Spark is pyspark's own, as in the tests' live cluster."""
    assert {f"apache/airflow:{PINS['apache-airflow']}-python3.11"} == {i for i in base_images() if "airflow" in i}
    images = {name: s["image"] for name, s in SERVICES.items() if name.startswith(("spark-", "airflow-"))}
    assert len(set(images.values())) == 1, images
    build = SERVICES["spark-master"]["build"]["dockerfile_inline"]
    assert "pip install --no-cache-dir -r /opt/project/requirements.txt" in build  # pyspark and delta-spark pinned there
    assert "python -m spark_jobs jars" in build and "CDC_JARS_DIR=/opt/cdc-jars" in build  # spark_jobs/jvm.py's list
    for name in ("spark-master", "spark-worker"):
        assert SERVICES[name]["command"][0] == "spark-class" and SERVICES[name]["entrypoint"] == []


def test_the_login_the_readme_gives_is_the_one_the_deployment_sets():
    env = SERVICES["airflow-apiserver"]["environment"]
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"] == "admin:admin"  # user admin, role admin
    passwords = env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"]
    assert """echo '{"admin": "admin"}' > """ + passwords in SERVICES["airflow-init"]["command"][-1]
    assert "admin / admin" in (ROOT / "README.md").read_text()


def test_airflow_services_get_the_cdc_environment_and_the_project():
    code_reads = {Settings.variable(f.name) for f in fields(Settings)}
    contract = {"CDC_CONFIG", "CDC_LANDING_URI", "CDC_LAKE_URI"}  # docs/architecture.md, "Environment"; the others have defaults
    assert contract <= code_reads
    for name in AIRFLOW:
        env, volumes = SERVICES[name]["environment"], SERVICES[name]["volumes"]
        assert contract <= set(env), name
        mounts = dict(v.split(":")[:2] for v in volumes)
        assert mounts == {"./dags": "/opt/project/dags", "./spark_jobs": "/opt/project/spark_jobs",
                          "./include": "/opt/project/include", "./plugins": "/opt/project/plugins",
                          "airflow-auth": "/opt/airflow/auth"}
        assert env["AIRFLOW__CORE__DAGS_FOLDER"] == mounts["./dags"]
        assert "PYTHONPATH" not in env  # the project is installed in the image (editable, over the mounts)
        assert env["CDC_DELTA_ENGINE"] == "delta-spark"
        assert env["CDC_CONFIG"] == mounts["./include"] + "/tables.yaml"
        assert env["SPARK_CONF_DIR"] == mounts["./include"] + "/spark-conf"
        # landing and lake on S3 (MinIO, through aws_default), which the Spark executors read and write themselves
        assert env["CDC_LANDING_URI"].startswith("s3://landing/") and env["CDC_LAKE_URI"].startswith("s3://lake/")
        assert '"endpoint_url": "http://minio:9000"' in env["AIRFLOW_CONN_AWS_DEFAULT"]
        assert '"host": "spark://spark-master"' in env["AIRFLOW_CONN_SPARK_DEFAULT"]
    for path in [p for v in SERVICES["spark-worker"]["volumes"] for p in [v.split(":")[0]] if p.startswith("./")]:
        assert (ROOT / path).is_dir(), path
    assert "mc mb --ignore-existing local/landing local/lake" in SERVICES["minio-init"]["entrypoint"][-1]
    assert SERVICES["spark-worker"]["environment"]["AWS_ENDPOINT_URL"] == "http://minio:9000"
    assert (ROOT / "include" / "spark-conf" / "spark-defaults.conf").is_file()
