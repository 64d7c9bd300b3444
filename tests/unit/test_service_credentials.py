"""Secrets written by the service and `service-credentials` (spark_jobs/service_credentials.write_private): whole,
readable by their user only, and never through a link someone planted in the folder."""

from __future__ import annotations

import os
import stat

from spark_jobs.service_credentials import write_private


def test_a_link_planted_where_the_secret_is_written_is_never_written_through(tmp_path):
    folder, victim = tmp_path / "auth", tmp_path / "victim"
    folder.mkdir()
    victim.write_text("someone else's file\n")
    secret = folder / "service.connection.json"
    # the partial file's name as it used to be (pid-based, predictable), and the file itself, both links to the victim
    (folder / f".{secret.name}.{os.getpid()}").symlink_to(victim)
    write_private(secret, b"first\n")
    assert victim.read_text() == "someone else's file\n"
    assert secret.read_bytes() == b"first\n" and not secret.is_symlink()
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    secret.unlink()
    secret.symlink_to(victim)
    write_private(secret, b"second\n")
    assert victim.read_text() == "someone else's file\n"
    assert secret.read_bytes() == b"second\n" and not secret.is_symlink()
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    # nothing partial left beside it (the planted link is the attacker's, left as it was)
    assert sorted(p.name for p in folder.iterdir()) == sorted([secret.name, f".{secret.name}.{os.getpid()}"])


def test_the_callers_get_the_certificate_apart_from_the_secret_and_the_key(tmp_path):
    """A deployment mounts the service's folder (secret, key) into the service alone and the certificate's copy into
    its callers: the connection trusts that copy, which is the service's certificate and holds nothing secret."""
    import json

    from spark_jobs.service_client import ServiceConnection
    from spark_jobs.service_credentials import ServiceCredentials

    service, callers = tmp_path / "service-auth", tmp_path / "service-ca"
    credentials = ServiceCredentials(service, callers / "service.crt")
    assert credentials.ensure("pipeline-service", 8793, "cdc_service")
    assert sorted(p.name for p in callers.iterdir()) == ["service.crt"]
    assert (callers / "service.crt").read_bytes() == credentials.cert.read_bytes()
    assert b"PRIVATE" not in (callers / "service.crt").read_bytes()
    connection = ServiceConnection.from_file(credentials.connection)
    assert connection == ServiceConnection("https://pipeline-service:8793", credentials.token.read_text().strip(),
                                           str(callers / "service.crt"))
    imported = json.loads(credentials.airflow_import.read_text())["cdc_service"]
    # the service's own connection type, the CA where the HTTP provider's hook reads it (cdc_airflow.service_hook)
    assert (imported["conn_type"], imported["extra"]) == ("cdc_pipeline_service", {"verify": str(callers / "service.crt")})
    assert not credentials.ensure("pipeline-service", 8793, "cdc_service")  # kept, the copy still the same
    assert (callers / "service.crt").read_bytes() == credentials.cert.read_bytes()


def test_a_link_planted_where_the_certificate_goes_is_never_written_through(tmp_path):
    """`service-credentials` writes the certificate (and the callers' copy of it) as it writes the secret: a new
    file renamed into place, so a link planted where it goes is replaced, its target left alone."""
    from spark_jobs.service_credentials import ServiceCredentials

    folder, ca, victim = tmp_path / "auth", tmp_path / "ca" / "service.crt", tmp_path / "victim"
    folder.mkdir()
    ca.parent.mkdir()
    victim.write_text("someone else's file\n")
    (folder / "service.crt").symlink_to(victim)
    ca.symlink_to(victim)
    ServiceCredentials(folder, ca).ensure("pipeline-service", 8793, "cdc_service")
    assert victim.read_text() == "someone else's file\n"
    for cert in (folder / "service.crt", ca):
        assert not cert.is_symlink() and cert.read_text().startswith("-----BEGIN CERTIFICATE-----")
        assert stat.S_IMODE(cert.stat().st_mode) == 0o644
