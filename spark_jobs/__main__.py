"""Entry point for `python -m spark_jobs` and for spark-submit (which runs this file as a script)."""

import os
import sys

if not __package__:
    # run as a script, this file's folder is sys.path[0]: there `spark_jobs/delta` would stand in for
    # delta-spark's own `delta` package (and `debezium`, `layers`... for any of that name)
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]

from spark_jobs.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
