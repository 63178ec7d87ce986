"""The fleet side of the audit: pure evaluations across nodes (``fleet``)."""
