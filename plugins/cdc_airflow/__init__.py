"""The Airflow side of the pipeline, shaped like a provider package: hooks (the landing store and its S3
connection), triggers, sensors, operators, params and callbacks. The DAG files in dags/ only wire these.

Nothing heavy is imported at module level (no pyspark, deltalake or great_expectations): the DAG processor
imports these while parsing."""
