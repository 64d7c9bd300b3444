"""Entry point for `python -m spark_jobs` and for spark-submit (which runs this file as a script)."""

import sys

from spark_jobs.cli import main

if __name__ == "__main__":
    sys.exit(main())
