"""The job's control plane: the orchestrator (``server``), the node supervisor that ``lockstep run``
runs on every node (``node``), their pure decisions (``core``), the torchrun command line
(``launchspec``), the job directory (``jobdir``) and events to the node agent (``events``)."""
