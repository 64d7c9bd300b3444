"""Gold is refreshed only when something it reads changed: a silver version its SQL or references read,
its definition in tables.yaml or its SQL, or the gold table itself; never skipped when its rows or
verdict depend on the clock."""

from dataclasses import replace

from spark_jobs.lake import Lake
from spark_jobs.layers import gold
from spark_jobs.registry import load_registry


def _model(tmp_path, sql="SELECT customer, count(*) AS n FROM orders GROUP BY customer", extra=""):
    (tmp_path / "gold").mkdir(exist_ok=True)
    (tmp_path / "gold" / "by_customer.sql").write_text(f"-- keys: customer\n-- sources: orders\n{sql}\n")
    config = tmp_path / "tables.yaml"
    config.write_text("tables:\n  orders: {topic: t, keys: [id]}\n  customers: {topic: c, keys: [id]}\n"
                      "gold:\n  by_customer:\n    references: [{columns: [customer], table: customers, to: [id]}]\n"
                      f"{extra}")
    return load_registry(config).gold["by_customer"]


def _silver(spark, engine, lake, orders, customers):
    if orders is not None:
        engine.overwrite(spark.createDataFrame([(i, c, f"{i}|1", 0) for i, c in orders],
                                               "id INT, customer INT, _seq STRING, _source_ts_ms BIGINT"),
                         lake.silver("orders"))
    if customers is not None:
        engine.overwrite(spark.createDataFrame([(c,) for c in customers], "id INT"), lake.silver("customers"))


def _rows(spark, engine, lake):
    return sorted(tuple(r) for r in engine.read(spark, lake.gold("by_customer")).collect())


def test_gold_is_refreshed_only_when_what_it_reads_changed(spark, engine, tmp_path):
    model, lake = _model(tmp_path), Lake(str(tmp_path / "lake"))
    _silver(spark, engine, lake, [(1, 10), (2, 10)], [10, 11])

    def refresh(m=model):
        summary = gold.gold_refresh(spark, engine, m, lake, "b")
        return summary.gate, summary.version

    assert refresh() == ("passed", 0)
    assert refresh() == ("skipped (sources unchanged)", 0)  # twice: nothing written
    _silver(spark, engine, lake, [(1, 10), (2, 11)], None)  # its source
    assert refresh() == ("passed", 1)
    assert _rows(spark, engine, lake) == [(10, 1), (11, 1)]
    assert refresh() == ("skipped (sources unchanged)", 1)
    # a table only its references read: gated again; kept incrementally, the model's rows are not rewritten
    _silver(spark, engine, lake, None, [10, 11, 12])
    assert refresh() == ("passed", 1)
    assert refresh(replace(model, row_count=(1, 5))) == ("passed", 2)  # its definition in tables.yaml
    changed_sql = _model(tmp_path, "SELECT customer, count(*) + 0 AS n FROM orders GROUP BY customer")
    changed_sql = replace(changed_sql, row_count=(1, 5))
    assert refresh(changed_sql) == ("passed", 3)  # its SQL
    assert refresh(changed_sql) == ("skipped (sources unchanged)", 3)
    engine.overwrite(spark.createDataFrame([(99, 99)], "customer INT, n BIGINT"), lake.gold("by_customer"))
    assert refresh(changed_sql) == ("passed", 5)  # gold changed by hand: put right again
    assert _rows(spark, engine, lake) == [(10, 1), (11, 1)]


def test_gold_reading_the_clock_or_checked_for_freshness_is_refreshed_every_run(spark, engine, tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    _silver(spark, engine, lake, [(1, 10)], [10])
    clock = _model(tmp_path, "SELECT customer, count(*) AS n, current_date AS asof FROM orders GROUP BY customer")
    fresh = _model(tmp_path, extra="    freshness: 100000d\n")
    for model in (clock, fresh):
        assert gold.depends_on_the_clock(model)
        verdicts = [gold.gold_refresh(spark, engine, model, lake, "b").gate for _ in range(2)]
        assert verdicts == ["passed", "passed"]
    assert not gold.depends_on_the_clock(_model(tmp_path))
