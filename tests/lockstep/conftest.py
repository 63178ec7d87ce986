"""Fixtures of the end-to-end ``lockstep run`` tests."""

from __future__ import annotations

import pytest

from tests.lockstep.lockstep_helpers import Job


@pytest.fixture
def job_factory(tmp_path):
    """Starts ``Job``s (``lockstep run`` in the background); closes every one at the end."""
    jobs = []

    def make(*args, **kwargs):
        job = Job(tmp_path, *args, **kwargs)
        jobs.append(job)
        return job

    yield make
    for job in jobs:
        job.close()
