"""Command line of the fabric simulator.

    python -m testbed.simulate topology --preset gpu9216 --out fabric.json
    python -m testbed.simulate window --topology gpu1024 --faults link_loss:1,switch:1 --seed 7 --out DIR
    python -m testbed.simulate suite --out DIR
    python -m testbed.simulate check DIR

`python -m testbed simulate ...` reaches the same commands through `add_subparser(subparsers)`
(adds the `simulate` command to another parser) and `main(args)` (runs a parsed namespace).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from testbed.simulate import model
from testbed.simulate.checks import FormatError, check_observations, check_verdict
from testbed.simulate.suite import DEFAULT_FAULT_SETS, build_suite
from testbed.simulate.topology import PRESETS, TopoParams, dump_topology, generate_topology, params_from_name
from testbed.simulate.window import SimulationError, WindowConfig, simulate
from workers.fabric.topology import TopologyError, parse_topology

DESCRIPTION = """Simulated rail-optimized GPU fabrics: topologies (up to 9,216 GPUs and beyond),
probe observation windows with injected faults and noise, and their ground truth, in the formats
of formats/fabric.md. Deterministic: the same inputs and seed give byte-identical files."""


def _kinds_help() -> str:
    kinds = "; ".join(f"{k.name} ({k.description})" for k in model.FAULT_KINDS.values())
    aliases = ", ".join(f"{a}={k}" for a, k in model.ALIASES.items())
    return f"fault kinds: {kinds}. Aliases: {aliases}."


def _presets_help() -> str:
    return "; ".join(f"{name}: {desc}" for name, (_, desc) in PRESETS.items())


def _load_topology(spec: str) -> tuple[dict[str, Any], TopoParams | None]:
    """A topology file, a preset name, or a generated topology's name."""
    path = Path(spec)
    if path.is_file():
        try:
            doc = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise SimulationError(f"--topology {spec}: not JSON ({exc})") from None
        name = doc.get("name", "") if isinstance(doc, dict) else ""
        return doc, params_from_name(name) if isinstance(name, str) else None
    if spec in PRESETS:
        params = PRESETS[spec][0]
        return generate_topology(params), params
    params = params_from_name(spec)
    if params is not None:
        return generate_topology(params), params
    raise SimulationError(
        f"--topology {spec!r}: no such file, preset ({', '.join(PRESETS)}) or generated name "
        "(like rail8-h32-su8-s4x1)"
    )


def _add_window_options(p: argparse.ArgumentParser) -> None:
    d = WindowConfig()
    p.add_argument("--peers-per-nic", type=int, default=d.peers_per_nic, metavar="K",
                   help=f"distinct peers each NIC probes (default {d.peers_per_nic})")
    p.add_argument("--peer-mix", default=",".join(str(x) for x in d.peer_mix), metavar="A,B,C",
                   help="shares of peers on the same leaf, on the same rail elsewhere in the pod, and "
                        "anywhere else (other rails, other pods); default %(default)s")
    p.add_argument("--sent", type=int, default=d.sent, metavar="N",
                   help=f"probes sent per pair in the window (default {d.sent})")
    p.add_argument("--path-fraction", type=float, default=d.path_fraction, metavar="F",
                   help=f"fraction of pairs whose path is known and given as `path` (default {d.path_fraction}); "
                        "link faults need F > 0 to be identifiable")
    p.add_argument("--window-s", type=float, default=d.window_s, metavar="S",
                   help=f"window length written in the observations (default {d.window_s})")
    p.add_argument("--noisy-hosts", default="auto", metavar="N|auto",
                   help="hosts with a noisy delay tail that are not faults; auto draws about "
                        f"{model.NOISY_HOST_FRACTION * 100:g}%% of hosts (default auto)")
    p.add_argument("--bg-loss", default=f"{model.BG_LOSS[0]:g},{model.BG_LOSS[1]:g}", metavar="LO,HI",
                   help="background loss per link direction, drawn log-uniformly in [LO, HI] (default %(default)s)")
    p.add_argument("--any-place", action="store_true",
                   help="place faults anywhere, also where these probes cannot tell them apart from other "
                        "elements (default: only identifiable places)")


def _floats(text: str, n: int, what: str) -> tuple[float, ...]:
    try:
        values = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise SimulationError(f"{what}: {text!r} is not {n} comma-separated numbers") from None
    if len(values) != n:
        raise SimulationError(f"{what}: {text!r} is not {n} comma-separated numbers")
    return values


def _config(args: argparse.Namespace, faults: str, seed: int) -> WindowConfig:
    if args.noisy_hosts == "auto":
        noisy = None
    else:
        try:
            noisy = int(args.noisy_hosts)
        except ValueError:
            raise SimulationError(f"--noisy-hosts: {args.noisy_hosts!r} is not an integer or 'auto'") from None
    return WindowConfig(
        faults=faults, seed=seed, peers_per_nic=args.peers_per_nic,
        peer_mix=_floats(args.peer_mix, 3, "--peer-mix"), sent=args.sent,
        path_fraction=args.path_fraction, window_s=args.window_s, noisy_hosts=noisy,
        bg_loss=_floats(args.bg_loss, 2, "--bg-loss"), identifiable_only=not args.any_place,
    )


def _cmd_topology(args: argparse.Namespace) -> int:
    if args.list_presets:
        for name, (params, desc) in PRESETS.items():
            print(f"{name:14s} {params.name:34s} {desc}")
        return 0
    if args.preset:
        params = PRESETS[args.preset][0]
    elif args.hosts:
        params = TopoParams(hosts=args.hosts, rails=args.rails, hosts_per_leaf=args.hosts_per_leaf,
                            spines=args.spines, links_per_leaf_spine=args.links_per_leaf_spine,
                            su_per_pod=args.su_per_pod, cores_per_plane=args.cores_per_plane,
                            links_per_spine_core=args.links_per_spine_core)
    else:
        raise SimulationError("topology: give --preset NAME or --hosts N (see --help)")
    doc = generate_topology(params, name=args.name)
    parse_topology(doc)
    text = dump_topology(doc)
    if args.out in (None, "-"):
        sys.stdout.write(text)
    else:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
        c = params.counts()
        print(f"{args.out}: {doc['name']}: {c['hosts']} hosts, {c['nics']} NICs, {c['leaves']} leaves, "
              f"{c['spines']} spines, {c['cores']} cores, {c['links']} links", file=sys.stderr)
    return 0


def _cmd_window(args: argparse.Namespace) -> int:
    doc, params = _load_topology(args.topology)
    t0 = time.perf_counter()
    scenario = simulate(doc, _config(args, args.faults, args.seed), params)
    elapsed = time.perf_counter() - t0
    files = scenario.write(args.out)
    culprits = ", ".join(f"{c['kind']} {c['name']}" for c in scenario.truth["culprits"]) or "none"
    print(f"{args.out}: {scenario.truth['scenario']['pairs']} pairs, culprits: {culprits} "
          f"(generated in {elapsed:.2f} s; wrote {', '.join(f.name for f in files)})", file=sys.stderr)
    return 0


def _cmd_suite(args: argparse.Namespace) -> int:
    topologies = []
    for spec in args.topology or ["example"]:
        doc, params = _load_topology(spec)
        topologies.append((spec if spec in PRESETS else doc["name"], doc, params))
    fault_sets = args.faults_set or list(DEFAULT_FAULT_SETS)
    t0 = time.perf_counter()
    entries = build_suite(args.out, topologies, fault_sets, seeds=args.seeds, first_seed=args.first_seed,
                          base=_config(args, "none", 0))
    print(f"{args.out}: {len(entries)} scenarios in {time.perf_counter() - t0:.1f} s (index: suite.json)",
          file=sys.stderr)
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    bad = 0
    for d in args.dirs:
        d = Path(d)
        try:
            topo = parse_topology(json.loads((d / "topology.json").read_text()))
            check_observations(json.loads((d / "observations.json").read_text()), topo)
            if (d / "truth.json").exists():
                check_verdict(json.loads((d / "truth.json").read_text()), topo)
        except (OSError, json.JSONDecodeError, TopologyError, FormatError) as exc:
            print(f"{d}: {exc}", file=sys.stderr)
            bad += 1
        else:
            print(f"{d}: ok")
    return 1 if bad else 0


def _add_commands(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="sim_command", metavar="COMMAND", required=True)

    p = sub.add_parser("topology", help="generate a rail-optimized topology (lockstep.topology/v1)",
                       description="Generate a rail-optimized leaf-spine(-core) topology. Presets: "
                                   + _presets_help())
    p.add_argument("--preset", choices=sorted(PRESETS), help="a named shape (see --list-presets)")
    p.add_argument("--list-presets", action="store_true", help="list the presets and exit")
    p.add_argument("--hosts", type=int, help="number of hosts (servers)")
    p.add_argument("--rails", type=int, default=8, help="NICs per host, one per rail (default 8)")
    p.add_argument("--hosts-per-leaf", type=int, default=32,
                   help="hosts per scalable unit; each SU has one leaf per rail (default 32)")
    p.add_argument("--spines", type=int, default=16,
                   help="spines (per pod with --su-per-pod); every leaf connects to each (default 16)")
    p.add_argument("--links-per-leaf-spine", type=int, default=2,
                   help="parallel links between a leaf and each spine (default 2)")
    p.add_argument("--su-per-pod", type=int, default=0,
                   help="SUs per pod; 0 (default) is a two-tier fabric with one set of spines")
    p.add_argument("--cores-per-plane", type=int, default=0,
                   help="three tiers: core switches per plane; spine j of every pod connects to plane j")
    p.add_argument("--links-per-spine-core", type=int, default=1,
                   help="parallel links between a spine and each core of its plane (default 1)")
    p.add_argument("--name", help="topology name (default: encodes the parameters, e.g. rail8-h32-su8-s4x1)")
    p.add_argument("--out", help="output file (default: standard output)")
    p.set_defaults(sim_func=_cmd_topology)

    p = sub.add_parser("window", help="simulate one observation window with faults and ground truth",
                       description="Simulate one probe window (lockstep.observations/v1) on a topology with "
                                   "injected faults and noise; write topology.json, observations.json and "
                                   "truth.json (lockstep.verdict/v1 plus a scenario block) into --out. "
                                   + _kinds_help(),
                       epilog="The statistical model is documented in testbed/simulate/model.py.")
    p.add_argument("--topology", required=True, metavar="T",
                   help="a topology file, a preset (" + ", ".join(PRESETS) + ") or a generated name")
    p.add_argument("--faults", default="none", metavar="SPEC",
                   help="comma-separated KIND:COUNT, e.g. link_loss:1,switch:1 (default none)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory")
    _add_window_options(p)
    p.set_defaults(sim_func=_cmd_window)

    p = sub.add_parser("suite", help="write a set of scenarios for benchmarks",
                       description="Write one scenario directory per (topology, fault set, seed) and an index "
                                   "suite.json. Default fault sets: " + "; ".join(DEFAULT_FAULT_SETS))
    p.add_argument("--out", required=True, metavar="DIR", help="output directory")
    p.add_argument("--topology", action="append", metavar="T",
                   help="topology file, preset or generated name; repeatable (default: example)")
    p.add_argument("--faults-set", action="append", metavar="SPEC",
                   help="a fault spec to include; repeatable (default: every kind, healthy, and combinations)")
    p.add_argument("--seeds", type=int, default=2, help="scenarios per topology and fault set (default 2)")
    p.add_argument("--first-seed", type=int, default=1000, help="seed of the first scenario (default 1000)")
    _add_window_options(p)
    p.set_defaults(sim_func=_cmd_suite)

    p = sub.add_parser("check", help="validate scenario directories against formats/fabric.md",
                       description="Parse topology.json and check observations.json and truth.json in each "
                                   "directory; exit 1 if any is invalid.")
    p.add_argument("dirs", nargs="+", metavar="DIR", help="scenario directories")
    p.set_defaults(sim_func=_cmd_check)


def build_parser(prog: str = "python -m testbed.simulate") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=DESCRIPTION)
    _add_commands(parser)
    return parser


def add_subparser(subparsers: Any) -> argparse.ArgumentParser:
    """Add `simulate` to another CLI (`python -m testbed simulate ...`); run it with main(args)."""
    parser = subparsers.add_parser("simulate", help="simulated large fabrics and observation windows",
                                   description=DESCRIPTION)
    _add_commands(parser)
    parser.set_defaults(func=main)
    return parser


def main(args: argparse.Namespace | Sequence[str] | None = None) -> int:
    """Run a parsed namespace (from build_parser or add_subparser) or a list of arguments."""
    if not isinstance(args, argparse.Namespace):
        args = build_parser().parse_args(None if args is None else list(args))
    try:
        return args.sim_func(args)
    except (SimulationError, TopologyError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
