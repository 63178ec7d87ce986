import logging

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from console.core.demo import PASSWORD, USERNAME, seed_demo
from console.core.management.commands.serve import serve


class Command(BaseCommand):
    help = ("Run the console with a demo cluster: migrate, seed an organization, its owner and a cluster, "
            "start an agent per host — real agents on an emulated fabric when this machine allows network "
            "namespaces (root), simulated agents otherwise — inject a fault now and then, and serve the "
            "console until Ctrl-C.")

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--hosts", type=int, default=8, help="Hosts in the demo fabric (default 8).")
        parser.add_argument("--rails", type=int, default=2, help="NICs per host, one rail each (default 2).")
        parser.add_argument("--fault-every", type=float, default=45.0, help="Seconds between faults (default 45).")
        parser.add_argument("--fault-for", type=float, default=40.0, help="Seconds each fault lasts (default 40).")
        parser.add_argument("--prefix", default="demo", help="Name prefix of the emulated fabric (default demo).")
        parser.add_argument("--faults", default="host-stall,nic-down",
                            help="Fault kinds to draw from, comma-separated (default host-stall,nic-down; "
                                 "simulated agents only stall).")
        parser.add_argument("--simulated", action="store_true",
                            help="Use simulated agents even where an emulated fabric could run.")

    def handle(self, *args, port, hosts, rails, fault_every, fault_for, prefix, faults, simulated, **options):
        from testbed.demo import EmulatedDemo, SimulatedDemo
        from testbed.topogen import generate

        logging.getLogger("lockstep.demo").setLevel(logging.INFO)
        call_command("migrate", verbosity=0)
        topology = generate(hosts=hosts, rails=rails, hosts_per_leaf=max(1, hosts // 2), spines=2,
                            name=f"demo-rail{rails}-h{hosts}")
        seed = seed_demo(topology)
        kinds = tuple(f.strip() for f in faults.split(",") if f.strip())
        reason = "--simulated" if simulated else EmulatedDemo.unavailable_reason()
        try:
            if reason is None:
                demo = EmulatedDemo(topology, prefix=prefix, fault_every_s=fault_every, fault_for_s=fault_for,
                                    faults=kinds)
            else:
                demo = SimulatedDemo(topology, fault_every_s=fault_every, fault_for_s=fault_for, faults=kinds)
        except ValueError as exc:
            raise CommandError(f"--faults: {exc}") from None
        extra_address = demo.up()
        try:
            demo.start(port, seed.enrollment_token, seed.cluster.pk)
            if reason is None:
                agents = (f"{hosts} hosts x {rails} rails in network namespaces with real agents, which reach "
                          f"the console at http://{extra_address}:{port}")
            else:
                agents = (f"{hosts} hosts x {rails} rails served by simulated agents (no emulated fabric: "
                          f"{reason})")
            self.stdout.write(self.style.SUCCESS(
                f"\nLockstep console: http://127.0.0.1:{port}/   login: {USERNAME} / {PASSWORD}\n"
                f"Cluster {seed.cluster.name!r}: {agents}; a fault every {fault_every:.0f}s.\n"
                f"Database: {settings.DATABASES['default']['NAME']}. Ctrl-C stops the demo"
                f"{' and removes the fabric' if reason is None else ''}.\n"
            ))
            serve("127.0.0.1", port, [extra_address] if extra_address else [], beat=not settings.REDIS_URL)
        finally:
            demo.stop()
