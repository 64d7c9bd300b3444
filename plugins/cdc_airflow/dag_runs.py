"""`python -m cdc_airflow.dag_runs 'cdc_bronze' 'cdc_replay -c "{\"mode\": \"rebuild\"}"' ...`: several `airflow dags
test` runs, one after another, in one process.

Each argument is what would follow `airflow dags test` on a command line (shell-quoted); each is run by Airflow's own
command line entry point, in this process, so every option and check is Airflow's. Airflow's import, configuration
and providers are loaded once instead of once per DAG: a process per DAG costs 8-17 s before its first task on two
cores (`make demo` runs 11 DAGs). A line `airflow dags test <argument>` starts each run's output; the first run that
fails ends the process with exit code 1. An argument `spark_jobs <command ...>` runs that command of the project's
own command line instead, in turn (`make demo` lands its second batch of sample files between two rounds of runs)."""

from __future__ import annotations

import shlex
import sys


def run_in_turn(runs: list[str]) -> int:
    from airflow.__main__ import main

    for run in runs:
        if run.startswith("spark_jobs "):
            from spark_jobs.cli import main as project_command

            print(run, flush=True)
            if project_command(shlex.split(run)[1:]) != 0:
                print(f"{run}: failed", file=sys.stderr, flush=True)
                return 1
            continue
        print(f"airflow dags test {run}", flush=True)
        sys.argv = ["airflow", "dags", "test", *shlex.split(run)]
        try:
            main()
        except SystemExit as exc:  # `dags test` exits for a failed run or a bad argument: the whole call fails
            if exc.code not in (None, 0):
                print(f"airflow dags test {run}: {exc.code}", file=sys.stderr, flush=True)
                return 1
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python -m cdc_airflow.dag_runs '<dag_id> [dags test options]' ...")
    sys.exit(run_in_turn(sys.argv[1:]))
