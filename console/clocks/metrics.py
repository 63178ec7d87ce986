"""``lockstep_clock_worst_bound_ns``: per cluster running clock sync, the largest bound (3 σ) of a
synced node's offset, read from the database at each scrape; and the nodes synced of planned."""

from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from console.core.metrics import register_database_collector


class ClockCollector(Collector):
    @staticmethod
    def _families():
        return (GaugeMetricFamily("lockstep_clock_worst_bound_ns", "Largest offset bound (3 sigma, ns) of a synced "
                                  "node, per cluster running clock sync.", labels=["organization_id", "cluster_id"]),
                GaugeMetricFamily("lockstep_clock_nodes_synced", "Nodes synced to the cluster's reference clock.",
                                  labels=["organization_id", "cluster_id"]),
                GaugeMetricFamily("lockstep_clock_nodes_planned", "Nodes clock sync plans in the cluster.",
                                  labels=["organization_id", "cluster_id"]))

    def describe(self):
        return list(self._families())

    def collect(self):
        from console.clocks.models import ClockSync
        from console.core import scoping

        bound, synced, planned = self._families()
        with scoping.unscoped("metrics: clock sync quality of every cluster"):
            rows = list(ClockSync.objects.filter(running=True).values_list(
                "organization_id", "cluster_id", "worst_bound_ns", "nodes_synced", "nodes_total"))
        for org_id, cluster_id, worst, n_synced, n_total in rows:
            labels = [str(org_id), str(cluster_id)]
            if worst is not None:
                bound.add_metric(labels, worst)
            synced.add_metric(labels, n_synced)
            planned.add_metric(labels, n_total)
        yield bound
        yield synced
        yield planned


register_database_collector(ClockCollector())
