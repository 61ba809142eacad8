"""`python -m bench`: run the benchmark cases, print the table, write the JSON."""

from __future__ import annotations

import sys

from bench.runner import main

sys.exit(main())
