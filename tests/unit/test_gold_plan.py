"""Which gold models are kept incrementally (layers/gold_plan.py): the demo's, as the README's table says, an exact
plan of each kind (a per-group state; groups computed again, with the joins each table's changes reach the keys
through), and the reason given for each kind of model the planners refuse."""

from pathlib import Path

import pytest

from spark_jobs.layers.gold import incremental_plan
from spark_jobs.layers.gold_plan import Aggregate, GroupsPlan, IncrementalPlan, Reach, groups_plan, plan
from spark_jobs.registry import load_registry

ROOT = Path(__file__).resolve().parents[2]


def test_the_demos_models_are_planned_as_the_readme_says():
    models = load_registry(ROOT / "include" / "tables.yaml").gold
    planned = {name: incremental_plan(m) for name, m in models.items()}
    assert {name: type(p).__name__ for name, p in planned.items()} == {
        "customers_by_state": "IncrementalPlan", "customer_email_domains": "IncrementalPlan",
        "products_by_weight": "IncrementalPlan", "films_per_actor": "GroupsPlan"}
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


def test_a_join_is_computed_again_for_the_keys_each_tables_changes_reach():
    sql = """SELECT a.actor_id, COUNT(f.film_id) AS films FROM actor a
             LEFT JOIN film_actor fa ON fa.actor_id = a.actor_id AND fa.role <> 'cameo'
             JOIN film f ON f.film_id = fa.film_id GROUP BY a.actor_id HAVING COUNT(*) > 1"""
    assert groups_plan(sql, ("actor_id",)) == GroupsPlan(
        keyed_sql="SELECT a.actor_id, COUNT(f.film_id) AS films FROM _cdc_keyed_0 AS a LEFT JOIN _cdc_keyed_1 AS fa "
                  "ON fa.actor_id = a.actor_id AND fa.role <> 'cameo' JOIN _cdc_source_film AS f ON f.film_id = fa.film_id "
                  "GROUP BY a.actor_id HAVING COUNT(*) > 1",
        reaches=(
            Reach("actor", "SELECT `a`.`actor_id` AS _k0 FROM _cdc_changed_actor AS a", (), ("actor_id",)),
            Reach("film_actor", "SELECT `fa`.`actor_id` AS _k0 FROM _cdc_changed_film_actor AS fa", (),
                  ("actor_id",)),
            # a film reaches its actors through film_actor's rows (as they were and are), not through actor
            Reach("film", "SELECT `fa`.`actor_id` AS _k0 FROM _cdc_changed_film AS f JOIN "
                          "_cdc_every_film_actor AS fa ON `f`.`film_id` <=> `fa`.`film_id`", ("film_actor",), None)))


def test_a_key_only_reached_through_the_from_table_joins_it():
    sql = """SELECT o.region, SUM(l.amount) AS total FROM orders o JOIN lines l ON l.order_id = o.id GROUP BY o.region"""
    planned = groups_plan(sql, ("region",))
    assert isinstance(planned, GroupsPlan)
    assert planned.reaches[1] == Reach(
        "lines", "SELECT `o`.`region` AS _k0 FROM _cdc_changed_lines AS l JOIN _cdc_every_orders AS o "
                 "ON `l`.`order_id` <=> `o`.`id`", ("orders",), None)
    assert planned.keyed_sql.startswith(
        "SELECT o.region, SUM(l.amount) AS total FROM _cdc_keyed_0 AS o JOIN _cdc_source_lines AS l")


@pytest.mark.parametrize("sql, keys, reason", [
    ("SELECT b.a, COUNT(*) AS n FROM x JOIN y AS b ON x.id = b.id GROUP BY b.a", ("a",),
     "its key a is not a column of its FROM table"),
    ("SELECT x.a, COUNT(*) AS n FROM x RIGHT JOIN y ON x.id = y.id GROUP BY x.a", ("a",),
     "its join of y is not an INNER or LEFT join ON a condition"),
    ("SELECT x.a, COUNT(*) AS n FROM x JOIN y USING (id) GROUP BY x.a", ("a",),
     "its join of y is not an INNER or LEFT join ON a condition"),
    ("SELECT x.a, COUNT(*) AS n FROM x JOIN y ON x.id < y.id GROUP BY x.a", ("a",),
     "its join of y has no equality with a table before it"),
    ("SELECT x.a, COUNT(*) AS n FROM x JOIN y ON x.id = y.id OR x.b = y.b GROUP BY x.a", ("a",),
     "its join of y has no equality with a table before it"),
    ("SELECT x.a, COUNT(*) OVER () AS n FROM x JOIN y ON x.id = y.id", ("a",), "it has a window function"),
    ("SELECT x.a, y.b FROM x JOIN y ON x.id = y.id LIMIT 3", ("a",), "it has LIMIT"),
    ("SELECT x.a, COUNT(*) AS n FROM x JOIN x ON x.id = x.id GROUP BY x.a", ("a",), "two of its tables have one name"),
    ("SELECT COUNT(*) AS n FROM x JOIN y ON x.id = y.id", ("n",), "it aggregates without GROUP BY"),
])
def test_a_join_the_planner_refuses_gets_its_reason(sql, keys, reason):
    assert groups_plan(sql, keys) == reason


def test_a_join_neither_planner_keeps_is_rewritten_for_the_joins_reason():
    from spark_jobs.registry import GoldModel

    model = GoldModel(name="m", sql="SELECT x.a, COUNT(*) AS n FROM x FULL JOIN y ON x.id = y.id GROUP BY x.a",
                      keys=("a",), sources=("x", "y"), path=Path("m.sql"))
    assert incremental_plan(model) == "its join of y is not an INNER or LEFT join ON a condition"
    one_table = GoldModel(name="m", sql="SELECT UPPER(a) AS a, COUNT(DISTINCT b) AS n FROM x GROUP BY 1", keys=("a",),
                          sources=("x",), path=Path("m.sql"))
    assert incremental_plan(one_table) == "COUNT(DISTINCT b) is not a plain aggregate of one argument"


def test_a_joins_sql_reads_only_views_of_its_own_models_scope():
    """The pipeline service runs jobs side by side in one Spark session, which shares temporary views: a model's
    refresh reads only views named within its own scope, never another model's or a bare table name."""
    import sqlglot
    from sqlglot import exp

    from spark_jobs.layers.gold import view_scope

    models = load_registry(ROOT / "include" / "tables.yaml").gold
    planned = incremental_plan(models["films_per_actor"])
    assert isinstance(planned, GroupsPlan)
    scope = view_scope(models["films_per_actor"])
    assert scope != view_scope(models["customers_by_state"])
    for sql in [planned.keyed_sql, *(r.sql for r in planned.reaches)]:
        read = {t.name for t in sqlglot.parse_one(sql, dialect="spark").find_all(exp.Table)}
        assert read and all(name.startswith(scope + "_") for name in read), read
