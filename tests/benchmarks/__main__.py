"""`python -m tests.benchmarks`: see tests/benchmarks/harness.py."""

import sys

from tests.benchmarks.harness import main

sys.exit(main())
