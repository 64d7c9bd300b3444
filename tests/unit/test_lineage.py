"""Each gold model's column lineage, read from its SQL by OpenLineage's parser, and shown on its report page."""

from __future__ import annotations

from pathlib import Path

from spark_jobs.lineage import model_lineage, silver_lineage
from spark_jobs.registry import load_registry

ROOT = Path(__file__).resolve().parents[2]

DEMO_LINEAGE = {
    "customer_email_domains": {"email_domain": ["inventory_customers.email"]},
    "customers_by_state": {"avg_fico": ["customers.fico"], "first_registration": ["customers.registration_date"],
                           "state": ["customers.state"]},
    "films_per_actor": {"actor_id": ["actor.actor_id"], "avg_rental_rate": ["film.rental_rate"],
                        "films": ["film.film_id"], "first_name": ["actor.first_name"], "last_name": ["actor.last_name"]},
    "products_by_weight": {"avg_weight": ["products.weight"], "weight_band": ["products.weight"]},
}


def test_the_demo_models_column_lineage_is_read_from_their_sql():
    models = load_registry(ROOT / "include" / "tables.yaml").gold
    assert {name: model_lineage(model.sql) for name, model in models.items()} == DEMO_LINEAGE


def test_a_join_and_an_expression_trace_each_column_to_every_source_column():
    sql = ("SELECT o.id, c.name, o.qty * p.price AS total, COUNT(*) AS n FROM orders o JOIN customers c ON c.id = o.cid "
           "JOIN products p ON p.id = o.pid GROUP BY o.id, c.name, o.qty, p.price")
    assert model_lineage(sql) == {"id": ["orders.id"], "name": ["customers.name"],
                                  "total": ["orders.qty", "products.price"]}


def test_silvers_columns_trace_to_the_envelope_fields_they_are_made_from():
    columns = ["id", "name", "_op", "_seq", "_source_ts_ms", "_ingested_at", "_batch_id"]
    expected = {"id": ["t.after.id", "t.before.id"], "name": ["t.after.name", "t.before.name"], "_op": ["t.op"],
                "_seq": ["t.source"], "_source_ts_ms": ["t.source.ts_ms"], "_ingested_at": ["t._ingested_at"],
                "_batch_id": []}
    assert silver_lineage("t", columns, None) == expected
    assert silver_lineage("t", ["_seq"], ("updated_at", "source.lsn")) == {"_seq": ["t.after.updated_at", "t.source.lsn"]}


def test_the_models_report_page_shows_its_column_lineage(tmp_path):
    from spark_jobs.lake import Lake
    from spark_jobs.report import render_table

    lake = Lake(str(tmp_path / "lake"))
    path = render_table(lake, "m", [], {}, {"state": ["customers.state"], "n": [], "<b>": ["t.<script>"]})
    page = Path(path).read_text()
    assert "<h2>Column lineage</h2>" in page
    assert "<tr><td><code>state</code></td><td>customers.state</td></tr>" in page
    assert "<tr><td><code>n</code></td><td>(no column: rows counted, or a constant)</td></tr>" in page
    assert "<script>" not in page and "&lt;b&gt;" in page  # names from a source are escaped
