"""`python -m cdc_airflow.ui [--port 8080]` (`make ui`): the Airflow UI of `make demo`'s Airflow home, on this machine's
loopback, behind the demo's own login: user admin, with a password drawn once into `<AIRFLOW_HOME>/ui-passwords.json`
(mode 600) and printed before the API server starts. Airflow's simple auth manager would draw one too, but only once
the server is up, into a file the newcomer has to find."""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
from pathlib import Path

USER = "admin"


def passwords_file(home: Path) -> Path:
    return home / "ui-passwords.json"


def login(path: Path) -> str:
    """The admin's password, drawn into `path` (mode 600, never through a link) the first time."""
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump({USER: secrets.token_urlsafe(12)}, out)
    return json.loads(path.read_text())[USER]


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    home = Path(os.environ.get("AIRFLOW_HOME", Path.home() / "airflow"))
    if not (home / "airflow.db").exists():
        print(f"no Airflow database in {home}: run make demo first", file=sys.stderr)
        return 1
    path = passwords_file(home)
    base = f"http://127.0.0.1:{args.port}"
    print(f"Airflow UI: {base}/  user {USER}, password {login(path)} ({path}); Ctrl-C stops it", flush=True)
    env = {**os.environ, "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:admin",
           "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(path), "AIRFLOW__API__BASE_URL": base}
    os.execve(sys.executable, [sys.executable, "-m", "airflow", "api-server", "-H", "127.0.0.1", "-p", str(args.port),
                               "-w", "1"], env)
    return 1  # not reached: the API server replaced this process


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m cdc_airflow.ui", description="the demo's Airflow UI on loopback")
    parser.add_argument("--port", type=int, default=8080)
    return parser


if __name__ == "__main__":
    sys.exit(main())
