"""The command line reads the deployment as the service and the DAGs do: each of --config, --landing and --lake
defaults to its CDC_* setting, and a flag given wins."""

from __future__ import annotations

import pytest

from spark_jobs.arguments import parser


@pytest.mark.parametrize("command", [["run"], ["status"], ["maintain"], ["generate"]])
def test_the_registry_landing_and_lake_default_to_their_settings(command, monkeypatch):
    monkeypatch.setenv("CDC_CONFIG", "/etc/cdc/tables.yaml")
    monkeypatch.setenv("CDC_LANDING_URI", "s3://landing/cdc")
    monkeypatch.setenv("CDC_LAKE_URI", "s3://lake/prod")
    args = parser().parse_args(command)
    assert args.config == "/etc/cdc/tables.yaml"
    if command[0] in ("run", "generate"):
        assert args.landing == "s3://landing/cdc"
    else:  # status and maintain read the landing only when asked to
        assert args.landing is None
    if command[0] != "generate":
        assert args.lake == "s3://lake/prod"
    given = parser().parse_args([*command, "--config", "mine.yaml"])
    assert given.config == "mine.yaml"


def test_without_settings_they_are_the_embedded_setups(monkeypatch):
    for name in ("CDC_CONFIG", "CDC_LANDING_URI", "CDC_LAKE_URI"):
        monkeypatch.delenv(name, raising=False)
    args = parser().parse_args(["run"])
    assert (args.config, args.landing, args.lake) == ("include/tables.yaml", "data/landing", "data/lake")


def test_version_names_the_project_and_what_it_runs_on(capsys):
    """`--version` prints the project's version and its engines', from the installed distributions and the pinned
    Delta jar, on one line, and exits 0; the commands need none of it."""
    from importlib.metadata import version

    from spark_jobs.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == (
        f"cdc-medallion {version('cdc-medallion')} (pyspark {version('pyspark')}, delta-spark 4.4.0, deltalake "
        f"{version('deltalake')}, great-expectations {version('great-expectations')}, apache-airflow "
        f"{version('apache-airflow')})\n")
