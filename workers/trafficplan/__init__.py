"""Traffic plans for loading every link of a fabric at once (``plan``), the load generator's
per-agent arguments (``assign``) and its results as observation windows (``windows``)."""
