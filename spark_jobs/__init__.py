"""Debezium CDC files -> Delta Lake medallion (bronze, silver, gold) on PySpark.

Importing this package must stay cheap: DAG files import `spark_jobs.registry` and `spark_jobs.settings`
at parse time, so nothing here may import pyspark, deltalake or great_expectations at module level.
The layout: docs/architecture.md, "Code layout".
"""
