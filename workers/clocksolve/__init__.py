"""The network effect of clock sync: loop-consistent per-node offsets from pairwise estimates.

``solve(parse_graph(doc)).to_document()`` turns a ``lockstep.clockgraph/v1`` into a
``lockstep.clocksolution/v1``; ``python -m workers.clocksolve GRAPH.json`` does it from a file.
"""

from workers.clocksolve.graph import GRAPH_FORMAT, SOLUTION_FORMAT, Graph, GraphError, parse_graph
from workers.clocksolve.solver import Solution, SolverConfig, solve

__all__ = ["GRAPH_FORMAT", "SOLUTION_FORMAT", "Graph", "GraphError", "Solution", "SolverConfig", "parse_graph",
           "solve"]
