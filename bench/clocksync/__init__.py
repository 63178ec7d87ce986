"""Clock-sync benchmarks (``python -m bench.clocksync``)."""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as the agent does (agent/clocksync/__init__.py)
