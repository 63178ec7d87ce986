"""Fleet audit, the node side: checks of GPUs, PCIe, GPU-NIC affinity, NICs and host facts,
the load generator and the collective bandwidth test, as agent commands (``commands``).

Collection (``collect``, I/O) is kept apart from evaluation (``gpu``, ``pcie``, ``affinity``,
``nic``, ``host``: pure functions of facts and ``thresholds``).
"""
