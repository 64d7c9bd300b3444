"""Which gold models are kept incrementally (layers/gold_plan.py): the demo's, as the README's table says, an exact
plan, and the reason given for each kind of model the planner refuses."""

from pathlib import Path

import pytest

from spark_jobs.layers.gold_plan import Aggregate, IncrementalPlan, plan
from spark_jobs.registry import load_registry

ROOT = Path(__file__).resolve().parents[2]


def test_the_demos_models_are_planned_as_the_readme_says():
    models = load_registry(ROOT / "include" / "tables.yaml").gold
    planned = {name: plan(m.sql, m.keys) for name, m in models.items()}
    assert {name: p if isinstance(p, str) else "incremental" for name, p in planned.items()} == {
        "customers_by_state": "incremental", "customer_email_domains": "incremental",
        "products_by_weight": "incremental", "films_per_actor": "it has a join"}
    assert planned["customers_by_state"] == IncrementalPlan(
        source="customers", where=None, groups=("state",),
        aggregates=(Aggregate("avg", "fico"), Aggregate("min", "registration_date")),
        outputs=(("state", "_g0"), ("customers", "_rows"), ("avg_fico", "ROUND(_a0_avg, 1)"),
                 ("first_registration", "_a1_v")))


def test_a_plan_keeps_each_aggregate_once_a_where_and_a_grouped_expression():
    sql = """SELECT UPPER(c.region) AS region, SUM(amount) + MAX(amount) * 2 AS score, sum(Amount) AS total,
                    COUNT(note) AS notes
             FROM Orders AS c WHERE c.amount > 0 GROUP BY 1"""
    assert plan(sql, ("region",)) == IncrementalPlan(
        source="orders", where="amount > 0", groups=("UPPER(region)",),
        aggregates=(Aggregate("sum", "amount"), Aggregate("max", "amount"), Aggregate("count", "note")),
        outputs=(("region", "_g0"), ("score", "IF(_a0_n = 0, NULL, _a0_s) + _a1_v * 2"),
                 ("total", "IF(_a0_n = 0, NULL, _a0_s)"), ("notes", "_a2_n")))


@pytest.mark.parametrize("sql, keys, reason", [
    ("SELECT a, COUNT(DISTINCT b) AS n FROM t GROUP BY a", ("a",), "COUNT(DISTINCT b) is not a plain aggregate of one argument"),
    ("SELECT a, PERCENTILE(b, 0.5) AS p FROM t GROUP BY a", ("a",),
     "PERCENTILE is not kept incrementally (COUNT, SUM, AVG, MIN and MAX are)"),
    ("SELECT a, SUM(b) AS s FROM t GROUP BY a HAVING SUM(b) > 1", ("a",), "it has HAVING"),
    ("SELECT a, SUM(b) AS s FROM t GROUP BY a LIMIT 5", ("a",), "it has LIMIT"),
    ("SELECT x.a, COUNT(*) AS n FROM x JOIN y ON x.id = y.id GROUP BY x.a", ("a",), "it has a join"),
    ("SELECT a, b, COUNT(*) AS n FROM t GROUP BY a", ("a",), "column b is neither grouped nor aggregated"),
    ("SELECT a, b, COUNT(*) AS n FROM t GROUP BY a, b", ("a",), "its keys (a) are not its grouped columns (a, b)"),
    ("SELECT COUNT(*) AS n FROM t", ("n",), "it has no GROUP BY"),
    ("SELECT a, SUM(b) OVER (PARTITION BY a) AS s FROM t GROUP BY a, b", ("a",), "it has a window function"),
    ("SELECT a, COUNT(*) AS n FROM (SELECT * FROM t) AS s GROUP BY a", ("a",),
     "it does not read one silver table by name"),
    ("SELECT a, COUNT(*) AS n FROM t WHERE b IN (SELECT b FROM u) GROUP BY a", ("a",), "it has a subquery"),
    ("WITH s AS (SELECT * FROM t) SELECT a, COUNT(*) AS n FROM s GROUP BY a", ("a",), "it has a WITH clause"),
    ("SELECT a, COUNT(*) AS n FROM t GROUP BY ROLLUP (a)", ("a",), "it groups by ROLLUP, CUBE or GROUPING SETS"),
    ("SELECT a, COUNT(*) FROM t GROUP BY a", ("a",), "its column 'COUNT(*)' has no name"),
    ("SELECT a FROM t; SELECT b FROM t", ("a",), "it is not a single SELECT"),
])
def test_a_model_the_planner_refuses_gets_its_reason(sql, keys, reason):
    assert plan(sql, keys) == reason
