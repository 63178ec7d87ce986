"""Simulated large fabrics: rail-optimized topologies up to 9,216 GPUs and beyond, probe
observation windows with injected faults and noise, and their ground truth (issue 4, part 4).

- `topology`: `TopoParams`, `PRESETS`, `generate_topology`, `dump_topology`.
- `model`: the statistical model (what each fault and each kind of noise does), documented.
- `window`: `WindowConfig`, `simulate(topology, config) -> Scenario`.
- `suite`: `build_suite` for benchmark scenario sets.
- `checks`: format checks for observations and verdicts.
- `cli`: `python -m testbed.simulate topology|window|suite|check`, and the
  `add_subparser(subparsers)` / `main(args)` hook for `python -m testbed simulate`.
"""
