"""`python -m testbed`: emulated clusters in network namespaces, fault injection, agents."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

from . import nvmlshim
from .fabric import DEFAULT_PREFIX, Fabric, default_base_dir
from .netops import TestbedError, require_root_and_netns
from .topogen import generate

DESCRIPTION = """\
Lockstep testbed. An emulated cluster is a set of network namespaces on this machine (one per
host and per switch, veth pairs as cables, L3 ECMP routing as in a rail-optimized leaf-spine
fabric, a management bridge to reach the console). Faults are injected on purpose and logged
with start and end times as ground truth. Everything is named with --prefix, so several
testbeds (and other users of namespaces) coexist, and `down --all` cleans up after a crash.

Needs root, iproute2 and nftables (scripts/setup-host.sh installs them).
"""

EPILOG = """\
examples:
  python -m testbed up --hosts 16 --rails 2 --hosts-per-leaf 8 --spines 2
  python -m testbed up --topology ../shared/scenarios/ex1-link-loss/topology.json
  python -m testbed status
  python -m testbed fault link-loss 'leaf-su00-r0~spine-p0-00#0' --rate 0.05 --direction 'a>b'
  python -m testbed fault host-stall node0003
  python -m testbed fault link-police 'node0001/nic0~leaf-su00-r0' --mbit 5     (passes idle, drops loaded)
  python -m testbed fault nic-mtu node0002/nic1 --mtu 1200
  python -m testbed fault switch-ecmp-off leaf-su00-r1
  python -m testbed fault node-gpu node0003 --defect remap-pending --gpu 2     (agents with --fake-nvml)
  python -m testbed heal f1            (or: heal --all)
  python -m testbed agents start --console-url http://10.201.0.1:8000 --token lse_... --cluster-id 1
  python -m testbed exec node0000 -- ping -c1 172.16.0.3
  python -m testbed down               (or: down --all)
"""


def _parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(prog="python -m testbed", description=DESCRIPTION, epilog=EPILOG, formatter_class=fmt)
    p.add_argument("--prefix", default=None,
                   help=f"name prefix of the testbed's namespaces and interfaces, 1-8 lowercase letters/digits "
                        f"(default: $LOCKSTEP_TESTBED_PREFIX or {DEFAULT_PREFIX!r})")
    p.add_argument("--state-dir", default=None,
                   help=f"directory holding one state directory per testbed prefix "
                        f"(default: $LOCKSTEP_TESTBED_DIR or {default_base_dir()})")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    up = sub.add_parser("up", help="build an emulated cluster", formatter_class=fmt,
                        description="Build an emulated cluster from a topology file, or generate a rail-optimized "
                                    "leaf-spine one from --hosts/--rails/--hosts-per-leaf/--spines.")
    src = up.add_mutually_exclusive_group(required=True)
    src.add_argument("--topology", metavar="FILE", help="a lockstep.topology/v1 JSON file")
    src.add_argument("--hosts", type=int, metavar="N", help="generate a topology with N hosts")
    up.add_argument("--rails", type=int, default=2, metavar="R", help="NICs per host, one per rail (default 2)")
    up.add_argument("--hosts-per-leaf", type=int, default=8, metavar="K",
                    help="hosts per leaf switch: each rail gets one leaf per K hosts (default 8)")
    up.add_argument("--spines", type=int, default=2, metavar="S", help="spine switches (default 2)")
    up.add_argument("--links-per-spine", type=int, default=1, metavar="P",
                    help="parallel cables between each leaf and each spine (default 1)")
    up.add_argument("--name", help="name of the generated topology")
    up.add_argument("--write-topology", metavar="FILE", help="also save the topology document to FILE")
    up.add_argument("--mgmt-subnet", metavar="CIDR",
                    help="management network, e.g. 10.77.0.0/16 (default: a free /16 in 10.200-10.255 "
                         "chosen from the prefix); the root namespace holds its .0.1")
    up.add_argument("--fault-log", metavar="FILE",
                    help="where fault start/end events go as JSON lines (default: <state dir>/faults.jsonl, "
                         "removed by down)")

    down = sub.add_parser("down", help="tear a testbed down", formatter_class=fmt,
                          description="Stop its processes and remove its namespaces, veths, bridge, nftables "
                                      "rules, cgroups and state.")
    down.add_argument("--all", action="store_true",
                      help="remove every testbed recorded in the state directory, and the --prefix one if "
                           "given, by name prefix, even when a crashed run left no usable state")

    st = sub.add_parser("status", help="hosts, switches, links, active faults, agents")
    st.add_argument("--json", action="store_true", help="print the status as JSON")

    fault = sub.add_parser("fault", help="inject a fault (prints its id)", formatter_class=fmt,
                           description="Inject a fault. Each prints its id, stays until `heal ID`, and is logged "
                                       "with its culprit in the verdict vocabulary (an access link's fault is "
                                       "named as its NIC).")
    fsub = fault.add_subparsers(dest="fault", metavar="KIND", required=True)
    f = fsub.add_parser("link-down", help="take a link down (both ends)")
    f.add_argument("link", help="link id")
    f.add_argument("--no-reroute", action="store_true",
                   help="keep static routes (far switches black-hole traffic into the dead link) instead "
                        "of converging around it as a routing protocol would")
    f = fsub.add_parser("link-flap", help="flap a link until healed")
    f.add_argument("link", help="link id")
    f.add_argument("--period", type=float, default=2.0, help="seconds per down+up cycle (default 2)")
    f.add_argument("--duty", type=float, default=0.5, help="fraction of each period the link is down (default 0.5)")
    direction_help = ("which way: 'a>b' (traffic leaving the link's a end), 'b>a', 'both', or the name of the "
                      "end the traffic leaves (a NIC or switch)")
    f = fsub.add_parser("link-loss", help="random loss on a link (nftables numgen drop)")
    f.add_argument("link", help="link id")
    f.add_argument("--rate", type=float, required=True, help="fraction of packets dropped, e.g. 0.05")
    f.add_argument("--direction", default="a>b", help=direction_help + " (default a>b)")
    f = fsub.add_parser("link-rate", help="rate-limit a link (tc tbf): a marginal optic or congestion")
    f.add_argument("link", help="link id")
    f.add_argument("--mbit", type=float, required=True, help="rate in Mbit/s")
    f.add_argument("--direction", default="both", help=direction_help + " (default both)")
    f.add_argument("--burst-kb", type=float, help="token bucket size in kB (default ~4 ms of traffic)")
    f.add_argument("--latency-ms", type=float, default=50.0,
                   help="longest a packet may queue behind the limit before it is dropped (default 50)")
    f = fsub.add_parser("switch-loss", help="random loss on everything a switch forwards")
    f.add_argument("switch", help="switch name")
    f.add_argument("--rate", type=float, required=True, help="fraction of packets dropped, e.g. 0.05")
    f = fsub.add_parser("nic-down", help="take a NIC down inside its host")
    f.add_argument("nic", help="NIC name, e.g. node0000/nic1")
    f = fsub.add_parser("host-stall", help="freeze every process in a host (agent, responders)")
    f.add_argument("host", help="host name")
    f = fsub.add_parser("link-police", help="drop what exceeds a rate (nftables limit): passes idle, fails loaded")
    f.add_argument("link", help="link id")
    f.add_argument("--mbit", type=float, required=True, help="rate in Mbit/s above which packets are dropped")
    f.add_argument("--direction", default="both", help=direction_help + " (default both)")
    f.add_argument("--burst-kb", type=float, help="burst tolerated in kB (default ~2 ms of traffic)")
    f = fsub.add_parser("nic-mtu", help="set a NIC's MTU inside its host (the fabric keeps its own)")
    f.add_argument("nic", help="NIC name, e.g. node0000/nic1")
    f.add_argument("--mtu", type=int, required=True, help="the wrong MTU, e.g. 1200 or 9000")
    f = fsub.add_parser("switch-ecmp-off", help="ECMP hashing off on a switch: every flow on one uplink")
    f.add_argument("switch", help="switch name")
    f = fsub.add_parser("node-gpu", help="a GPU defect in a host's NVML fake (agents started with --fake-nvml)")
    f.add_argument("host", help="host name")
    f.add_argument("--defect", required=True,
                   help="ecc, remap-pending, remap-failure, pcie-gen4-x8, xid, throttle-thermal, power-brake, "
                        "nvlink-down, fabric-not-started, persistence-off, power-capped, lost")
    f.add_argument("--gpu", type=int, default=0, help="GPU index (default 0)")
    fsub.add_parser("list", help="active faults")
    fsub.add_parser("log", help="the fault log (JSON lines: start/end events)")
    f = fsub.add_parser("truth", help="ground truth as a lockstep.verdict/v1 document")
    f.add_argument("--at", type=float, help="unix time (default: now, the active faults)")

    heal = sub.add_parser("heal", help="undo faults")
    heal.add_argument("ids", nargs="*", metavar="FAULT_ID", help="fault ids as printed by `fault`")
    heal.add_argument("--all", action="store_true", help="heal every active fault")

    ag = sub.add_parser("agents", help="node agents in the host namespaces", formatter_class=fmt,
                        description="Start, stop, restart, freeze and thaw one agent per host namespace. "
                                    "Agents get LOCKSTEP_CONSOLE_URL, LOCKSTEP_STATE_DIR, LOCKSTEP_HOSTNAME, "
                                    "LOCKSTEP_MACHINE_ID, LOCKSTEP_ENROLL_TOKEN, LOCKSTEP_CLUSTER_ID.")
    asub = ag.add_subparsers(dest="action", metavar="ACTION", required=True)
    a = asub.add_parser("start", help="start agents (remembers the configuration for restart)")
    a.add_argument("--console-url", help="console URL as seen from the hosts "
                                         "(default http://<management bridge address>:<--console-port>)")
    a.add_argument("--console-port", type=int, default=8000, help="port for the default console URL (8000)")
    a.add_argument("--token", default="", help="enrollment token (lse_...)")
    a.add_argument("--cluster-id", help="cluster id")
    a.add_argument("--cmd", help="agent command line; placeholders {python} {repo} {host} {ns} {state_dir} "
                                 "{mgmt_address} {console_url} (default: '{python} -m agent run')")
    a.add_argument("--env", action="append", default=[], metavar="K=V", help="extra environment (repeatable)")
    a.add_argument("--fake-nvml", metavar="MACHINE", choices=("hgx_h100", "dgx_h100", "l40s"),
                   help="agents see this machine's GPUs through the NVML fake (testbed/nvmlshim), so "
                        "`fault node-gpu` can inject GPU defects")
    a.add_argument("hosts", nargs="*", help="only these hosts (default all)")
    for action, text in (("stop", "stop agents (SIGTERM, then SIGKILL)"), ("restart", "stop and start again"),
                         ("freeze", "freeze agents (cgroup freezer / SIGSTOP)"), ("thaw", "resume frozen agents")):
        a = asub.add_parser(action, help=text)
        a.add_argument("hosts", nargs="*", help="only these hosts (default all)")
    asub.add_parser("status", help="pid, running, frozen, log of each agent")

    ex = sub.add_parser("exec", help="run a command inside a host or switch namespace")
    ex.add_argument("node", help="host, switch or NIC name")
    ex.add_argument("argv", nargs=argparse.REMAINDER, help="the command (after --)")

    sub.add_parser("simulate", help="simulated large fabrics: `simulate --help` (testbed/simulate)", add_help=False)
    return p


def _print_status(s: dict) -> None:
    m = s["management"]
    print(f"testbed {s['prefix']} ({s['phase']}), topology {s['topology']}, state {s['state_dir']}")
    print(f"management: bridge {m['bridge']} {m['address']} ({m['subnet']})")
    print(f"hosts ({len(s['hosts'])}):")
    for h in s["hosts"]:
        nics = ", ".join(f"{n['ifname']}={n['address']}" for n in h["nics"])
        print(f"  {h['name']:<14} ns {h['ns']:<20} mgmt {h['mgmt_address']:<15} {nics}"
              + ("" if h["present"] else "  [namespace missing]"))
    print(f"switches ({len(s['switches'])}):")
    for sw in s["switches"]:
        print(f"  {sw['name']:<16} {sw['tier']:<6} ns {sw['ns']:<22} {sw['block'] or ''}"
              + ("" if sw["present"] else "  [namespace missing]"))
    down = [lk for lk in s["links"] if not lk["up"]]
    print(f"links ({len(s['links'])}, {len(down)} down):")
    for lk in s["links"]:
        print(f"  {'up  ' if lk['up'] else 'DOWN'} {lk['id']:<36} {lk['a']} <-> {lk['b']}"
              f"  tx {lk['tx_packets']['a']}/{lk['tx_packets']['b']}")
    print(f"active faults ({len(s['faults'])}):")
    for fault in s["faults"]:
        c = fault["culprit"]
        params = " ".join(f"{k}={v}" for k, v in fault["params"].items())
        print(f"  {fault['id']:<5} {fault['type']:<12} {c['kind']}:{c['name']}  {params}"
              f"  since {time.strftime('%H:%M:%S', time.localtime(fault['started']))}")
    print(f"agents ({len(s['agents'])}):")
    for host, a in s["agents"].items():
        state = "frozen" if a["frozen"] else ("running" if a["running"] else "exited")
        print(f"  {host:<14} pid {a['pid']:<8} {state:<8} log {a['log']}")


def _simulate(rest: list[str]) -> int:
    from testbed.simulate import cli as simulate_cli

    return int(simulate_cli.main(rest) or 0)


def _simulate_argv(argv: list[str]) -> list[str] | None:
    """The arguments after `simulate` when that is the command (they go to testbed.simulate.cli)."""
    i = 0
    while i < len(argv):
        if argv[i] in ("--prefix", "--state-dir"):
            i += 2
        elif argv[i].startswith(("--prefix=", "--state-dir=")):
            i += 1
        else:
            break
    return argv[i + 1:] if i < len(argv) and argv[i] == "simulate" else None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    rest = _simulate_argv(argv)
    if rest is not None:
        return _simulate(rest)
    args = _parser().parse_args(argv)
    explicit_prefix = args.prefix
    prefix = args.prefix or os.environ.get("LOCKSTEP_TESTBED_PREFIX") or DEFAULT_PREFIX
    base = args.state_dir
    try:
        require_root_and_netns()
        if args.command == "up":
            if args.topology:
                topology = args.topology
            else:
                topology = generate(args.hosts, args.rails, args.hosts_per_leaf, args.spines,
                                    args.links_per_spine, args.name)
            t0 = time.monotonic()
            fab = Fabric.up(topology, prefix=prefix, base_dir=base, mgmt_subnet=args.mgmt_subnet,
                            fault_log=args.fault_log)
            elapsed = time.monotonic() - t0
            if args.write_topology:
                Path(args.write_topology).write_text(json.dumps(fab.topology.to_document(), indent=1) + "\n")
            print(f"up: {fab.topology.name}: {len(fab.hosts)} hosts, {len(fab.switches)} switches, "
                  f"{len(fab.links)} links in {elapsed:.2f} s; prefix {fab.prefix}; management "
                  f"{fab.plan.mgmt_subnet} (console at {fab.bridge_address}); state {fab.state_dir}")
            return 0
        if args.command == "down":
            if args.all:
                cleaned = Fabric.down_all(base, [explicit_prefix] if explicit_prefix else [])
                print(f"down: removed {', '.join(cleaned) if cleaned else 'nothing (no testbed recorded)'}")
            else:
                Fabric.attach(prefix, base).down()
                print(f"down: removed {prefix}")
            return 0
        fab = Fabric.attach(prefix, base)
        if args.command == "status":
            s = fab.status()
            if args.json:
                print(json.dumps(s, indent=1))
            else:
                _print_status(s)
            return 0
        if args.command == "fault":
            return _fault(fab, args)
        if args.command == "heal":
            if not args.all and not args.ids:
                raise TestbedError("name the faults to heal (ids from `fault list`), or --all")
            healed = fab.heal_all() if args.all else [fab.heal(fid)["id"] for fid in args.ids]
            print(f"healed: {', '.join(healed) if healed else 'nothing active'}")
            return 0
        if args.command == "agents":
            return _agents(fab, args)
        if args.command == "exec":
            rest = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
            if not rest:
                raise TestbedError("give the command to run after --")
            os.execvp("ip", ["ip", "netns", "exec", fab.ns(args.node), *rest])  # noqa: S606
    except TestbedError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def _fault(fab: Fabric, args: argparse.Namespace) -> int:
    kind = args.fault
    if kind == "list":
        for fault in fab.active_faults():
            print(fab._fault_summary(fault))
        return 0
    if kind == "log":
        for event in fab.fault_log():
            print(json.dumps(event, sort_keys=True))
        return 0
    if kind == "truth":
        print(json.dumps(fab.ground_truth(at=args.at), indent=1))
        return 0
    if kind == "link-down":
        fid = fab.fault_link_down(args.link, reroute=not args.no_reroute)
    elif kind == "link-flap":
        fid = fab.fault_link_flap(args.link, period=args.period, duty=args.duty)
    elif kind == "link-loss":
        fid = fab.fault_link_loss(args.link, rate=args.rate, direction=args.direction)
    elif kind == "link-rate":
        fid = fab.fault_link_rate(args.link, rate_mbit=args.mbit, direction=args.direction,
                                  burst_kb=args.burst_kb, latency_ms=args.latency_ms)
    elif kind == "switch-loss":
        fid = fab.fault_switch_loss(args.switch, rate=args.rate)
    elif kind == "nic-down":
        fid = fab.fault_nic_down(args.nic)
    elif kind == "link-police":
        fid = fab.fault_link_police(args.link, rate_mbit=args.mbit, direction=args.direction, burst_kb=args.burst_kb)
    elif kind == "nic-mtu":
        fid = fab.fault_nic_mtu(args.nic, mtu=args.mtu)
    elif kind == "switch-ecmp-off":
        fid = fab.fault_switch_ecmp_off(args.switch)
    elif kind == "node-gpu":
        fid = fab.fault_node_gpu(args.host, defect=args.defect, gpu=args.gpu)
    else:
        fid = fab.fault_host_stall(args.host)
    print(fid)
    return 0


def _agents(fab: Fabric, args: argparse.Namespace) -> int:
    hosts = getattr(args, "hosts", None) or None
    if args.action == "start":
        env = {}
        for item in args.env:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise TestbedError(f"--env {item!r}: use KEY=VALUE")
            env[key] = value
        if args.fake_nvml:
            env |= nvmlshim.agent_env(args.fake_nvml)
        url = args.console_url or fab.console_url(args.console_port)
        started = fab.start_agents(console_url=url, token=args.token, cluster_id=args.cluster_id,
                                   argv=shlex.split(args.cmd) if args.cmd else None, hosts=hosts, env=env)
        print(f"started {len(started)} agents against {url}")
    elif args.action == "stop":
        print(f"stopped: {', '.join(fab.stop_agents(hosts)) or 'none'}")
    elif args.action == "restart":
        print(f"restarted: {', '.join(fab.restart_agents(hosts)) or 'none'}")
    elif args.action == "freeze":
        print(f"frozen: {', '.join(fab.freeze_agents(hosts)) or 'none'}")
    elif args.action == "thaw":
        print(f"thawed: {', '.join(fab.thaw_agents(hosts)) or 'none'}")
    else:
        for host, a in fab.agents().items():
            state = "frozen" if a["frozen"] else ("running" if a["running"] else "exited")
            print(f"{host:<14} pid {a['pid']:<8} {state:<8} machine {a['machine_id']} log {a['log']}")
    return 0
