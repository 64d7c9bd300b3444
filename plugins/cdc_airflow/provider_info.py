"""What Airflow's providers manager learns of this distribution (its `apache_airflow_provider` entry point, in
pyproject.toml): the pipeline service's connection type, so that the Connections UI offers it with its own fields
and `airflow connections add --conn-type cdc_pipeline_service` knows it. Plain data: read without importing the hook."""

from __future__ import annotations

from typing import Any


def provider_info() -> dict[str, Any]:
    return {
        "package-name": "cdc-medallion",
        "name": "CDC medallion pipeline",
        "description": "Debezium change files to Delta Lake bronze, silver and gold, gated by Great Expectations.",
        "connection-types": [{
            "connection-type": "cdc_pipeline_service",
            "hook-class-name": "cdc_airflow.service_hook.PipelineServiceHook",
            "hook-name": "CDC pipeline service",
            "ui-field-behaviour": {
                "hidden-fields": ["login", "extra"],
                "relabeling": {"password": "Secret", "schema": "Scheme"},
                "placeholders": {"host": "pipeline-service", "port": "8793", "schema": "https (http on loopback)",
                                 "password": "the service's secret (CDC_SERVICE_TOKEN or its --token-file)"},
            },
            "conn-fields": {
                "verify": {
                    "label": "CA file",
                    "description": "The PEM file of the CA that signed the service's TLS certificate (the compose "
                                   "picture's is /opt/service-ca/service.crt); empty: the system's CAs.",
                    "schema": {"type": ["string", "null"]},
                },
            },
        }],
    }
