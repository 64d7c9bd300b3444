"""Replay tables by hand (Trigger DAG w/ config), after a bug or a bad file was fixed. Params:

- `tables`: which tables (default all).
- `mode`: `reprocess` reads the landing files that landed in [`since`, `until`) again (all of them
  without a window), replaces their rows in bronze (never duplicating a line), and applies them to silver;
  `rebuild` recomputes silver from all of bronze in a staging area and publishes it when its gate passes.
- `since` / `until`: the landing-time window of a reprocess (ISO 8601, UTC when naive).
- `max_quarantined`: for this replay only, the share of a batch that may be quarantined (e.g. `20%`):
  one way on after a gate failed on a batch with more bad records than the table allows.

The tables are replayed in one task, a pass like the layers' (a task per table cost a task process per table: a
replay of every table of a 500-table database started 500); then the gold models reading those tables are
refreshed. Bad params fail the run before any work, naming the param. A replay of unchanged data and code leaves
silver and gold as they were; each table is written under its writer lock, apart from the other DAGs' passes and
from writers outside Airflow, so it is safe to trigger at any time.
"""

from __future__ import annotations

# ParamsDict is public in airflow.sdk; the Task SDK's __init__.pyi, which type checkers read, does not list it yet
from airflow.sdk import DAG, ParamsDict, get_current_context, task  # type: ignore[attr-defined]

from cdc_airflow.callbacks import run_deadline
from cdc_airflow.operators import CdcSparkJob, TableVerdicts
from cdc_airflow.params import check_replay, replay_params
from cdc_airflow.wiring import default_args, gold_pool, wiring

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
                 doc_md="Checks the params (window order, a window only with reprocess) and picks the gold models "
                        "whose sources are replayed.")
    def replay_plan() -> list[str]:
        plan = check_replay(dict(get_current_context()["params"]), TABLES)
        print(f"replay: {plan}")
        replayed = set(plan["tables"])
        return ["replay", *(f"gold_refresh_{m.name}" for m in W.registry.gold.values() if replayed & set(m.sources))]

    plan = replay_plan()
    window = ["--since", "{{ params.since or '' }}", "--until", "{{ params.until or '' }}"]
    limit = ["--max-quarantined", "{{ params.max_quarantined or '' }}"]
    # one pass over the tables (a rebuild skips bronze); each table's assets updated if the replay advanced it
    replay = CdcSparkJob(
        task_id="replay", landing=W.landing,
        cli_args=W.cli_args("--layers", "bronze,silver", "--tables", "{{ params.tables | join(',') }}",
                            "--mode", "{{ params.mode }}", *window, *limit),
        announces=[W.pass_outlets("bronze"), W.pass_outlets("silver")],
        outlets=[W.advanced("bronze"), W.advanced("silver")],
        doc_md="reprocess: reads the window's landing files again, replaces their bronze rows in one commit and "
               "applies them to silver; rebuild: recomputes silver from all of bronze. Every table of the param in "
               "one pass; emits `cdc.bronze.<table>` and `cdc.silver.<table>` for each table it advanced.")
    plan >> replay >> TableVerdicts(
        task_id="replay_verdicts", of=replay.task_id, retries=0,
        doc_md="Fails the run with the failure line of the tables the replay could not advance (the others' assets "
               "are updated, and their gold refreshed).")
    for model in W.registry.gold.values():
        # the plan's branch skips the models of no replayed table; the others wait for the replay
        [plan, replay] >> CdcSparkJob(
            task_id=f"gold_refresh_{model.name}", landing=W.landing, pool=gold_pool(model.name),
            cli_args=W.cli_args("--layers", "gold", "--models", model.name), announces=[W.gold_outlets(model.name)],
            inlets=W.reads("gold", model.name), outlets=[W.advanced("gold")],
            doc_md="Refreshes the model from the replayed silver tables.")

# Set once the tasks are made: a task made under a DAG with params deep-copies them (the list of tables, twice), which
# at hundreds of tables was most of this file's parse time (tasks x tables). A task's params at run time are the DAG's
# merged with its own, so the tasks' templates and the run's validation read these as before.
dag.params = ParamsDict(replay_params(TABLES))
