import signal
import socket
import sys

import uvicorn
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from console.commands import wakeup
from console.core.beat import InProcessBeat
from console.live.publish import outbox


class Command(BaseCommand):
    help = ("Serve the console (HTTP, agent long-polls, websockets) with uvicorn. With no REDIS_URL the "
            "periodic tasks (lost-node sweep, command leases) run in this process too.")

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1", help="Address to listen on (default 127.0.0.1).")
        parser.add_argument("--port", type=int, default=8000, help="Port (default 8000).")
        parser.add_argument("--also-listen", action="append", default=[], metavar="ADDR",
                            help="Another address to listen on, same port (e.g. a cluster management network).")
        parser.add_argument("--no-beat", action="store_true",
                            help="Do not run periodic tasks here (a Celery beat does it).")

    def handle(self, *args, host, port, also_listen, no_beat, **options):
        serve(host, port, also_listen, beat=not no_beat and not settings.REDIS_URL)


def bind(address: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((address, port))
    except OSError as exc:
        raise CommandError(f"cannot listen on {address}:{port}: {exc.strerror}") from None
    sock.listen(2048)  # thousands of agents hold long polls
    return sock


class Server(uvicorn.Server):
    async def shutdown(self, sockets=None):
        # Answer the held long polls first: otherwise the graceful shutdown waits for them, times
        # out and cancels them, and each cancelled request prints its traceback.
        wakeup.drain()
        await super().shutdown(sockets)


def serve(host: str, port: int, also_listen=(), beat: bool = True) -> None:
    sockets = [bind(address, port) for address in [host, *also_listen]]
    ticker = InProcessBeat() if beat else None
    if ticker:
        ticker.start()
    # uvicorn shuts down gracefully on SIGTERM and SIGINT (Ctrl-C), then re-raises the signal: make
    # that a clean exit here, so callers' `finally` blocks (the demo's fabric teardown) run instead
    # of the process dying or printing a KeyboardInterrupt traceback.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: sys.exit(0))
    config = uvicorn.Config("console.asgi:application", lifespan="off", log_config=None,
                            access_log=False, timeout_graceful_shutdown=5,
                            ws_max_size=64 * 1024)  # browsers send only small subscribe messages
    try:
        Server(config).run(sockets=sockets)
    finally:
        # Live updates published while the server stopped (the answered polls' node states) go
        # out now, before the interpreter exits under a pending delivery timer.
        outbox.drain()
        if ticker:
            ticker.stop()
        for sock in sockets:
            sock.close()
