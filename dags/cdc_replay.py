"""Replay tables by hand (Trigger DAG w/ config), after a bug or a bad file was fixed. Params:

- `tables`: which tables (default all).
- `mode`: `reprocess` reads the landing files that landed in [`since`, `until`) again (all of them
  without a window), replaces their rows in bronze (never duplicating a line), and applies them to silver;
  `rebuild` recomputes silver from all of bronze in a staging area and publishes it when its gate passes.
- `since` / `until`: the landing-time window of a reprocess (ISO 8601, UTC when naive).
- `max_quarantined`: for this replay only, the share of a batch that may be quarantined (e.g. `20%`):
  one way on after a gate failed on a batch with more bad records than the table allows.

Then the gold models reading those tables are refreshed. Bad params fail the run before any work, naming
the param. A replay of unchanged data and code leaves silver and gold as they were; it writes one table
at a time with the other DAGs (each task waits in its table's pool, queued by Airflow; a lock per table
guards writers outside Airflow), so it is safe to trigger at any time.
"""

from __future__ import annotations

# ParamsDict is public in airflow.sdk; the Task SDK's __init__.pyi, which type checkers read, does not list it yet
from airflow.sdk import DAG, ParamsDict, TriggerRule, get_current_context, task  # type: ignore[attr-defined]

from cdc_airflow.callbacks import run_deadline
from cdc_airflow.operators import CdcSparkJob
from cdc_airflow.params import check_replay, replay_params
from cdc_airflow.wiring import default_args, wiring, writer_pool

W = wiring()
TABLES = list(W.registry.tables)

with DAG(
    dag_id="cdc_replay",
    doc_md=__doc__,
    schedule=None,
    max_active_runs=1,
    tags=["cdc", "replay", "bronze", "silver", "gold"],
    deadline=run_deadline(),
    default_args=default_args(),
) as dag:

    @task.branch(task_id="replay_plan", retries=0,
                 doc_md="Checks the params (window order, a window only with reprocess) and picks the tasks to run.")
    def replay_plan() -> list[str]:
        plan = check_replay(dict(get_current_context()["params"]), TABLES)
        print(f"replay: {plan}")
        return [f"replay_{t}" for t in plan["tables"]]

    plan = replay_plan()
    replayed = {}
    window = ["--since", "{{ params.since or '' }}", "--until", "{{ params.until or '' }}"]
    limit = ["--max-quarantined", "{{ params.max_quarantined or '' }}"]
    # one task per table (a rebuild skips bronze)
    for name in TABLES:
        replayed[name] = CdcSparkJob(
            task_id=f"replay_{name}", landing=W.landing, pool=writer_pool(name),
            cli_args=W.cli_args("--layers", "bronze,silver", "--tables", name, "--mode", "{{ params.mode }}", *window,
                                *limit),
            inlets=W.reads("bronze", name), outlets=[W.asset("bronze", name), W.asset("silver", name)],
            doc_md="reprocess: reads the window's landing files again, replaces their bronze rows in one commit and "
                   "applies them to silver; rebuild: recomputes silver from all of bronze.")
        plan >> replayed[name]
    for model in W.registry.gold.values():
        [replayed[s] for s in model.sources] >> CdcSparkJob(
            task_id=f"gold_refresh_{model.name}", landing=W.landing, pool=writer_pool(model.name, gold=True),
            trigger_rule=TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS,
            cli_args=W.cli_args("--layers", "gold", "--models", model.name),
            inlets=W.reads("gold", model.name), outlets=[W.asset("gold", model.name)],
            doc_md="Refreshes the model from the replayed silver tables.")

# Set once the tasks are made: a task made under a DAG with params deep-copies them (the list of tables, twice), which
# at hundreds of tables was most of this file's parse time (tasks x tables). A task's params at run time are the DAG's
# merged with its own, so the tasks' templates and the run's validation read these as before.
dag.params = ParamsDict(replay_params(TABLES))
