import re
from pathlib import Path

import pytest

from spark_jobs.errors import ConfigError
from spark_jobs.registry import load_registry, parse_table

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tables.yaml"
    path.write_text(text)
    return path


def test_shipped_registry_has_the_demo_tables_and_models():
    registry = load_registry(ROOT / "include" / "tables.yaml")
    assert list(registry.tables) == ["customers", "products", "inventory_customers", "film", "actor", "film_actor"]
    assert registry.tables["film_actor"].keys == ("actor_id", "film_id")
    assert sorted(registry.gold) == ["customer_email_domains", "customers_by_state", "films_per_actor",
                                     "products_by_weight"]
    assert registry.gold["films_per_actor"].sources == ("actor", "film_actor", "film")
    assert [m.name for m in registry.models_reading(["film"])] == ["films_per_actor"]


def test_defaults_apply_when_only_topic_and_keys_are_given():
    table = parse_table("t", {"topic": "a.b.c", "keys": ["id"]})
    assert (table.format, table.sequence_by, table.partition_by) == ("auto", None, ())
    assert (table.columns, table.history, table.tombstone_retention_s) == ((), False, None)


def test_history_retention_and_column_overrides_are_read():
    table = parse_table("t", {"topic": "x", "keys": ["id"], "history": True, "tombstone_retention": "30d",
                              "columns": {"price": "DECIMAL(10, 2)", "born": "date"}})
    assert table.history is True
    assert table.tombstone_retention_s == 30 * 86400
    assert table.columns == (("price", "decimal(10, 2)"), ("born", "date"))


def test_sequence_by_takes_source_fields_as_the_readme_documents():
    table = parse_table("t", {"topic": "x", "keys": "id", "sequence_by": ["source.txn", "version"]})
    assert table.sequence_by == ("source.txn", "version")
    with pytest.raises(ConfigError, match="sequence_by"):
        parse_table("t", {"topic": "x", "keys": "id", "sequence_by": ["source."]})


def test_sequence_by_and_partition_by_are_read():
    table = parse_table("t", {"topic": "x", "keys": "id", "sequence_by": ["version"], "partition_by": ["region"]})
    assert (table.keys, table.sequence_by, table.partition_by) == (("id",), ("version",), ("region",))


@pytest.mark.parametrize("spec, message", [
    ({"topic": "x", "keys": ["id"], "colour": "red"}, "table 'orders': unknown field(s) colour"),
    ({"keys": ["id"]}, "table 'orders': field 'topic' is required"),
    ({"topic": "x", "keys": ["id"], "history": "yes"}, "table 'orders': field 'history' must be true or false"),
    ({"topic": "x", "keys": ["id"], "tombstone_retention": "a week"},
     "table 'orders': field 'tombstone_retention' must be 'forever'"),
    ({"topic": "x", "keys": ["id"], "columns": {"price": "money"}},
     "table 'orders': field 'columns' has unsupported type(s) price: 'money'"),
    ({"topic": "x"}, "table 'orders': field 'keys' must be a non-empty list of column names, got None"),
    ({"topic": "x", "keys": []}, "table 'orders': field 'keys' must be a non-empty list of column names, got []"),
    ({"topic": "x", "keys": ["id"], "format": "csv"}, "table 'orders': field 'format' must be one of"),
])
def test_invalid_tables_name_the_table_and_field(spec, message):
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        parse_table("orders", spec)


def test_unknown_table_selection_is_an_error(tmp_path):
    registry = load_registry(write(tmp_path, "tables:\n  a: {topic: t, keys: [id]}\n"))
    with pytest.raises(ConfigError, match="unknown table\\(s\\) b; known: a"):
        registry.select(["b"])


def test_gold_model_needs_headers_and_known_sources(tmp_path):
    config = write(tmp_path, "tables:\n  a: {topic: t, keys: [id]}\n")
    (tmp_path / "gold").mkdir()
    (tmp_path / "gold" / "m.sql").write_text("-- keys: id\n-- sources: a, b\nSELECT 1")
    with pytest.raises(ConfigError, match="gold model 'm': sources not in the registry: b"):
        load_registry(config)
    (tmp_path / "gold" / "m.sql").write_text("-- sources: a\nSELECT 1")
    with pytest.raises(ConfigError, match="gold model 'm': missing '-- keys: ...' header"):
        load_registry(config)


@pytest.mark.parametrize("topic", ["../../outside", "a/b", "..", ".", "topic with space", "x" * 250, "t\u00e9"])
def test_a_topic_is_a_kafka_topic_name_never_a_path(topic):
    with pytest.raises(ConfigError, match=re.escape("table 't': field 'topic' must be a Kafka topic name")):
        parse_table("t", {"topic": topic, "keys": ["id"]})


@pytest.mark.parametrize(("field", "value"), [("keys", ["id", "id"]), ("partition_by", ["day", "day"]),
                                              ("sequence_by", ["source.lsn", "source.lsn"])])
def test_a_column_named_twice_is_refused_at_load(field, value):
    spec = {"topic": "a.b", "keys": ["id"], field: value}
    with pytest.raises(ConfigError, match=re.escape(f"table 't': field '{field}' names {value[0]} more than once")):
        parse_table("t", spec)


def test_a_table_publishing_its_transactions_keeps_history_and_is_named_as_its_end_events_name_it():
    table = parse_table("t", {"topic": "shop.public.orders", "keys": ["id"], "transactions": "shop.transaction"})
    assert (table.transactions, table.history) == ("shop.transaction", True)
    assert table.data_collections() == ("shop.public.orders", "public.orders")
    renamed = parse_table("t", {"topic": "orders", "keys": ["id"], "transactions": "shop.transaction",
                                "data_collection": "public.orders"})
    assert renamed.data_collections() == ("public.orders",)
    with pytest.raises(ConfigError, match="'transactions' needs its history"):
        parse_table("t", {"topic": "x", "keys": ["id"], "transactions": "shop.transaction", "history": False})
    with pytest.raises(ConfigError, match="field 'transactions' must be the connector's transaction topic"):
        parse_table("t", {"topic": "x", "keys": ["id"], "transactions": "../x"})
    with pytest.raises(ConfigError, match="field 'data_collection' .* takes 'transactions'"):
        parse_table("t", {"topic": "x", "keys": ["id"], "data_collection": "public.x"})


def test_a_gold_model_reads_at_a_watermark_the_sources_of_one_transaction_topic(tmp_path):
    config = write(tmp_path, "tables:\n  a: {topic: s.p.a, keys: [id], transactions: s.transaction}\n"
                             "  b: {topic: s.p.b, keys: [id], transactions: s.transaction}\n"
                             "  c: {topic: c, keys: [id]}\n  d: {topic: o.p.d, keys: [id], transactions: o.transaction}\n")
    (tmp_path / "gold").mkdir()
    (tmp_path / "gold" / "m.sql").write_text("-- keys: id\n-- sources: a, b, c\nSELECT 1")
    model = load_registry(config).gold["m"]
    assert (model.transactions, [t.name for t in model.at_watermark]) == ("s.transaction", ["a", "b"])
    (tmp_path / "gold" / "m.sql").write_text("-- keys: id\n-- sources: a, d\nSELECT 1")
    with pytest.raises(ConfigError, match="gold model 'm': its sources publish transactions on different topics"):
        load_registry(config)
