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


def test_versions_match_the_python_pins():
    assert "apache/spark:" + PINS["pyspark"] in " ".join(base_images())
    assert "apache/airflow:" + PINS["apache-airflow"] in " ".join(base_images())
    spark_build = SERVICES["spark-master"]["build"]["dockerfile_inline"]
    assert f"delta-spark_2.13-{PINS['delta-spark']}.jar" in spark_build
    for package in ("PyYAML", "great_expectations", "deltalake"):
        assert f"{package}=={PINS[package]}" in spark_build


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
                          "lake-data": "/opt/lake"}
        assert env["AIRFLOW__CORE__DAGS_FOLDER"] == mounts["./dags"]
        assert env["PYTHONPATH"] == "/opt/project"
        assert env["CDC_CONFIG"] == mounts["./include"] + "/tables.yaml"
        assert env["SPARK_CONF_DIR"] == mounts["./include"] + "/spark-conf"
        # landing on S3 (MinIO, through aws_default); the lake on a volume Airflow and Spark share
        assert env["CDC_LANDING_URI"].startswith("s3://landing/") and env["CDC_LAKE_URI"] == mounts["lake-data"]
        assert '"endpoint_url": "http://minio:9000"' in env["AIRFLOW_CONN_AWS_DEFAULT"]
        assert '"host": "spark://spark-master"' in env["AIRFLOW_CONN_SPARK_DEFAULT"]
    for path in [p for v in SERVICES["spark-worker"]["volumes"] for p in [v.split(":")[0]] if p.startswith("./")]:
        assert (ROOT / path).is_dir(), path
    assert "lake-data" in COMPOSE["volumes"]
    assert "mc mb --ignore-existing local/landing" in SERVICES["minio-init"]["entrypoint"][-1]
    assert (ROOT / "include" / "spark-conf" / "spark-defaults.conf").is_file()
