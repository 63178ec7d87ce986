"""The agent's local socket: protocol answers, bounds (line length, clients, unread replies,
the event queue), permissions, and events forwarded to the console as telemetry."""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import socket
import stat
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest
from agent_testlib import wait_for

from agent.clusterclock import ClusterClock, ClusterTime
from agent.localsock import server as sockserver
from agent.localsock.client import AgentSocket
from agent.localsock.server import LINE_MAX, EventQueue, LocalSocketServer

SYSTEM_PYTHON = "/usr/bin/python3"  # readable and runnable by `nobody`, unlike a venv under /root


class Served:
    """A LocalSocketServer on its own thread, as the agent.localsock activity runs it."""

    def __init__(self, path: Path, queue: EventQueue | None = None, **kwargs):
        self.events = queue if queue is not None else EventQueue()
        self.clock = ClusterClock()
        self.server = LocalSocketServer(path, self.events, self.clock, **kwargs)
        self.server.bind()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.server.serve_once(0.05)

    def stats(self) -> dict:
        return self.server.stats()

    def close(self) -> None:
        self._stop.set()
        self.thread.join(5)
        self.server.close()


@pytest.fixture
def short_dir():
    path = Path(tempfile.mkdtemp(prefix="ls-sock-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def served(short_dir):
    made: list[Served] = []

    def make(path: Path | None = None, **kwargs) -> Served:
        s = Served(path or short_dir / "agent.sock", **kwargs)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def connect(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(5)
    sock.connect(str(path))
    return sock


def read_line(sock: socket.socket, buf: bytearray) -> dict | None:
    """The next reply line (None at EOF)."""
    while b"\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        buf += chunk
    line, _, rest = bytes(buf).partition(b"\n")
    buf[:] = rest
    return json.loads(line)


def eof_after_replies(sock: socket.socket) -> list[dict]:
    """Every reply until the server closes the connection. A close with our bytes still unread
    on its side is a reset, which may swallow its last reply."""
    buf, out = bytearray(), []
    with contextlib.suppress(ConnectionResetError):
        while (msg := read_line(sock, buf)) is not None:
            out.append(msg)
    return out


def send(sock: socket.socket, *messages: dict | bytes) -> None:
    sock.sendall(b"".join(m if isinstance(m, bytes) else json.dumps(m).encode() + b"\n" for m in messages))


def test_time_answers_from_the_local_clock_until_a_provider_plugs_in(served):
    s = served()
    sock, buf = connect(s.server.path), bytearray()
    before = time.time_ns()
    send(sock, {"v": 1, "op": "time", "id": 41})
    answer = read_line(sock, buf)
    assert answer["v"] == 1 and answer["id"] == 41 and answer["ok"] is True
    assert answer["synced"] is False and answer["offset_ns"] == 0 and answer["drift_ppm"] == 0.0
    assert answer["sigma_ns"] is None and before <= answer["cluster_time_ns"] <= time.time_ns()

    class Estimator:
        def cluster_time(self):
            return ClusterTime(cluster_time_ns=time.time_ns() + 1500, offset_ns=1500, drift_ppm=-0.25, sigma_ns=90,
                               synced=True)

    s.clock.provide(Estimator())
    send(sock, {"v": 1, "op": "time", "id": 42})
    assert read_line(sock, buf) | {"cluster_time_ns": 0} == {
        "v": 1, "id": 42, "ok": True, "cluster_time_ns": 0, "offset_ns": 1500, "drift_ppm": -0.25, "sigma_ns": 90,
        "synced": True}

    class Broken:
        def cluster_time(self):
            raise RuntimeError("estimator not ready")

    s.clock.provide(Broken())  # a failing provider never breaks `time`: the local clock answers
    send(sock, {"v": 1, "op": "time", "id": 43})
    assert read_line(sock, buf)["synced"] is False
    assert s.stats()["time_requests"] == 3


def test_events_are_queued_and_bad_lines_are_answered_or_counted(served):
    s = served()
    sock, buf = connect(s.server.path), bytearray()
    send(sock,
         {"v": 1, "op": "event", "kind": "nccl.failover", "ts_ns": 1_764_000_000_123_456_789,
          "data": {"comm": "0x1", "from": "mlx5_0", "to": "mlx5_1"}},
         {"v": 1, "op": "event", "kind": "job.heartbeat"},  # no ts_ns: the agent stamps it; no data: {}
         {"v": 1, "op": "event", "kind": "Bad Kind", "data": {}},  # events are never answered, even refused
         {"v": 1, "op": "event", "kind": "job.snapshot", "ts_ns": "yesterday"},
         {"v": 1, "op": "event", "kind": "job.snapshot", "data": [1]},
         {"v": 1, "op": "reboot", "id": 7},
         b"this is not json\n",
         b"[1, 2]\n",
         {"v": 2, "op": "time", "id": 8},
         {"v": 1, "op": "time", "id": 9})
    replies = [read_line(sock, buf) for _ in range(5)]
    assert replies[0] == {"v": 1, "id": 7, "ok": False, "error": "unknown op 'reboot'"}
    assert replies[1]["ok"] is False and replies[1]["id"] is None and replies[1]["error"].startswith("not a JSON")
    assert replies[2] == {"v": 1, "id": None, "ok": False, "error": "not a JSON object"}
    assert replies[3] == {"v": 1, "id": 8, "ok": False,
                          "error": "unsupported protocol version 2; this agent speaks v 1"}
    assert replies[4]["id"] == 9 and replies[4]["ok"] is True  # the connection survived all of it
    queued = s.events.take(10, timeout=1)
    assert queued[0] == ("nccl.failover", 1_764_000_000.1234567, {"comm": "0x1", "from": "mlx5_0", "to": "mlx5_1"})
    assert queued[1][0] == "job.heartbeat" and abs(queued[1][1] - time.time()) < 60 and queued[1][2] == {}
    assert len(queued) == 2
    stats = s.stats()
    assert stats["events"] == 2 and stats["bad_events"] == 3 and stats["bad_lines"] == 4
    assert "data must be an object, not list" in stats["last_error"] or stats["last_error"]


def test_a_64_kib_line_is_accepted_and_a_longer_one_closes_the_connection(served):
    s = served()

    def event_line(total: int) -> bytes:
        head = b'{"v":1,"op":"event","kind":"job.checkpoint","data":{"pad":"'
        tail = b'"}}\n'
        return head + b"x" * (total - len(head) - len(tail)) + tail

    ok = connect(s.server.path)
    send(ok, event_line(LINE_MAX), {"v": 1, "op": "time", "id": 1})
    assert read_line(ok, bytearray())["ok"] is True
    assert len(s.events.take(1, timeout=1)[0][2]["pad"]) > 65000

    long = connect(s.server.path)
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        send(long, event_line(LINE_MAX + 1), {"v": 1, "op": "time", "id": 2})
    replies = eof_after_replies(long)
    assert replies in ([], [{"v": 1, "id": None, "ok": False, "error": "line longer than 65536 bytes; connection closed"}])
    assert s.stats()["too_long"] == 1 and len(s.events) == 0

    endless = connect(s.server.path)  # no newline at all: closed once the bound is passed
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        endless.sendall(b"{" + b" " * (LINE_MAX + 10))
    assert all(r["error"].startswith("line longer than") for r in eof_after_replies(endless))
    assert s.stats()["too_long"] == 2
    send(ok, {"v": 1, "op": "time", "id": 3})
    assert read_line(ok, bytearray())["id"] == 3


def test_a_client_that_never_reads_is_closed_and_the_others_are_served_meanwhile(served):
    s = served()
    greedy = connect(s.server.path)
    greedy.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    request = json.dumps({"v": 1, "op": "time", "id": 1}).encode() + b"\n"
    other, buf = connect(s.server.path), bytearray()
    greedy.setblocking(False)
    sent = 0
    deadline = time.monotonic() + 20
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the agent closed it: done
        while time.monotonic() < deadline and s.stats()["slow_closed"] == 0:
            select.select([], [greedy], [], 0.1)  # room to write: the agent keeps reading
            try:
                greedy.send(request)
                sent += 1
            except BlockingIOError:
                continue
    wait_for(lambda: s.stats()["slow_closed"] == 1, 10, "the greedy client to be closed")
    send(other, {"v": 1, "op": "time", "id": 99})
    assert read_line(other, buf)["id"] == 99
    assert sent > 100


def test_half_lines_and_silent_clients_do_not_stall_the_others(served):
    s = served()
    silent = connect(s.server.path)  # connected, says nothing, forever
    half = connect(s.server.path)
    half.sendall(b'{"v":1,"op":"event","kind":"job.rank_lost","data":{"rank":')  # and stops mid-line
    talker, buf = connect(s.server.path), bytearray()
    for i in range(50):
        send(talker, {"v": 1, "op": "time", "id": i})
        assert read_line(talker, buf)["id"] == i
    half.close()  # the process died: its unfinished line is dropped, not half-parsed
    wait_for(lambda: s.stats()["clients"] == 2, 10, "the dead client to be gone")
    assert len(s.events) == 0 and s.stats()["bad_lines"] == 0
    silent.close()


def test_too_many_clients_are_told_so_and_a_freed_slot_is_used_again(served):
    s = served(max_clients=3)
    first = [connect(s.server.path) for _ in range(3)]
    wait_for(lambda: s.stats()["clients"] == 3, 10, "three clients")
    extra = connect(s.server.path)
    assert eof_after_replies(extra) == [{"v": 1, "id": None, "ok": False,
                                         "error": "too many clients (3); try again later"}]
    first[0].close()
    wait_for(lambda: s.stats()["clients"] == 2, 10, "a slot to free up")
    again, buf = connect(s.server.path), bytearray()
    send(again, {"v": 1, "op": "time", "id": 5})
    assert read_line(again, buf)["ok"] is True
    assert s.stats()["refused"] == 1


def test_a_full_event_queue_drops_and_counts_while_time_still_answers(served):
    s = served(queue=EventQueue(max_events=5))
    sock, buf = connect(s.server.path), bytearray()
    send(sock, *[{"v": 1, "op": "event", "kind": "job.heartbeat", "data": {"i": i}} for i in range(8)],
         {"v": 1, "op": "time", "id": 1})
    assert read_line(sock, buf)["ok"] is True
    assert s.stats()["events"] == 5 and s.stats()["events_dropped"] == 3 and s.events.dropped == 3
    assert [e[2]["i"] for e in s.events.take(10, 0)] == [0, 1, 2, 3, 4]  # the oldest kept, in order


def test_the_socket_is_0660_in_a_0750_directory_with_the_lockstep_group(short_dir, served, monkeypatch):
    monkeypatch.setattr(sockserver, "GROUP", "daemon")  # stands in for `lockstep`, which this machine lacks
    gid = sockserver._group_id()
    path = short_dir / "run" / "lockstep" / "agent.sock"
    s = served(path)
    st = os.stat(path)
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == gid
    dst = os.stat(path.parent)
    assert stat.S_IMODE(dst.st_mode) == 0o750 and dst.st_gid == gid
    assert [p.name for p in path.parent.iterdir()] == ["agent.sock"]  # no temporary name left behind
    s.close()
    assert not path.exists()


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv") or not os.path.exists(SYSTEM_PYTHON),
                    reason="needs root, setpriv and /usr/bin/python3 to connect as another user")
def test_only_the_owner_and_the_group_may_connect(short_dir, served, monkeypatch):
    monkeypatch.setattr(sockserver, "GROUP", "daemon")
    gid = sockserver._group_id()
    short_dir.chmod(0o755)
    open_dir = short_dir / "open"
    open_dir.mkdir(mode=0o755)
    open_dir.chmod(0o755)  # so that only the socket's own mode decides
    s = served(open_dir / "agent.sock")
    probe = ("import socket, sys\ns = socket.socket(socket.AF_UNIX)\n"
             "try:\n    s.connect(sys.argv[1]); print('connected')\n"
             "except PermissionError:\n    print('denied')\n")

    def as_nobody(*groups: int) -> str:
        group_opt = [f"--groups={','.join(map(str, groups))}"] if groups else ["--clear-groups"]
        out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", *group_opt, SYSTEM_PYTHON, "-I", "-c",
                              probe, str(s.server.path)], capture_output=True, text=True, timeout=30, cwd="/")
        return out.stdout.strip() or out.stderr

    assert as_nobody() == "denied"
    assert as_nobody(gid) == "connected"


def test_a_stale_socket_is_replaced_and_a_live_agents_is_not_taken(short_dir, served):
    path = short_dir / "agent.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))
    dead.close()  # what a killed agent leaves behind
    s = served(path)
    assert AgentSocket(str(path)).time(timeout=2)["synced"] is False
    second = LocalSocketServer(path, EventQueue(), ClusterClock())
    with pytest.raises(OSError, match="another process .* listens on"):
        second.bind()
    assert AgentSocket(str(path)).time(timeout=2) is not None  # the first one still serves
    path.unlink()
    path.write_text("not a socket")
    with pytest.raises(OSError, match="exists and is not a socket"):
        LocalSocketServer(path, EventQueue(), ClusterClock()).bind()
    s.server.close = lambda: None  # its path is gone; nothing to clean up


def test_paths_longer_than_sun_path_work_on_both_sides(tmp_path, served):
    deep = tmp_path / ("d" * 80) / ("e" * 40)
    path = deep / "agent.sock"
    assert len(str(path)) > 108
    served(path)
    client = AgentSocket(str(path))
    assert client.event("job.heartbeat", {"step": 1}) is True
    assert client.time(timeout=2)["synced"] is False


def test_the_client_never_blocks_and_counts_what_it_drops(short_dir):
    path = short_dir / "nobody-listens.sock"
    client = AgentSocket(str(path))
    started = time.monotonic()
    assert [client.event("job.heartbeat", {"i": i}) for i in range(1000)] == [False] * 1000
    assert client.time(timeout=0.01) is None
    assert time.monotonic() - started < 2 and client.dropped == 1000 and client.sent == 0

    # a listener that accepts but never reads: the client fills the socket, then drops
    deaf = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    deaf.bind(str(path))
    deaf.listen(1)
    client = AgentSocket(str(path))
    results = [client.event("job.heartbeat", {"pad": "x" * 1000}) for _ in range(2000)]
    assert results[0] is True and False in results
    assert client.sent + client.dropped == 2000 and client.sent > 10
    deaf.close()
    assert client.event("job.heartbeat", {"too": "x" * LINE_MAX}) is False  # over the line bound: not sent


# -- in the daemon --------------------------------------------------------------------------------


def test_events_reach_the_console_as_event_telemetry_in_the_normal_batches(console, start_daemon, short_dir):
    sock_path = short_dir / "agent.sock"
    running = start_daemon(console, enroll_token=console.create_token(), agent_socket=str(sock_path))
    node = running.daemon.cred.node_id
    client = wait_for(lambda: sock_path.exists() and AgentSocket(str(sock_path)), 10, "the socket")
    ts_ns = 1_764_000_000_000_000_000
    assert client.event("nccl.failover", {"comm": "0x7f", "rank": 3, "from": "mlx5_0", "to": "mlx5_1"}, ts_ns=ts_ns)
    assert client.event("job.heartbeat", {"job": "j-1", "step": 12})
    assert client.time(timeout=2)["synced"] is False
    records = wait_for(lambda: [r for r in console.telemetry_records(node) if r["kind"].startswith("event.")]
                       if len([r for r in console.telemetry_records(node) if r["kind"].startswith("event.")]) == 2
                       else None, 15, "both events in telemetry")
    assert records[0] == {"kind": "event.nccl.failover", "ts": 1_764_000_000.0,
                          "data": {"comm": "0x7f", "rank": 3, "from": "mlx5_0", "to": "mlx5_1"}}
    assert records[1]["kind"] == "event.job.heartbeat" and records[1]["data"] == {"job": "j-1", "step": 12}
    assert [b["seq"] for b in console.telemetry_batches(node)] == list(range(1, len(console.telemetry_batches(node)) + 1))

    def socket_health():
        beats = console.heartbeats(node)
        entry = next((a for a in beats[-1]["activities"] if a["name"] == "agent.localsock"), None) if beats else None
        return entry if entry and entry.get("status", {}).get("events") == 2 else None

    entry = wait_for(socket_health, 15, "the socket's counters in a heartbeat")
    assert entry["state"] == "running" and entry["status"]["time_requests"] == 1


def test_a_flooding_client_does_not_slow_the_agent(console, start_daemon, short_dir):
    sock_path = short_dir / "agent.sock"
    running = start_daemon(console, enroll_token=console.create_token(), agent_socket=str(sock_path))
    node = running.daemon.cred.node_id
    wait_for(lambda: sock_path.exists(), 10, "the socket")
    flooder = AgentSocket(str(sock_path))
    stop = threading.Event()

    def flood():
        i = 0
        while not stop.is_set():
            flooder.event("job.heartbeat", {"i": i, "pad": "y" * 200})
            i += 1

    thread = threading.Thread(target=flood, daemon=True)
    thread.start()
    try:
        wait_for(lambda: flooder.sent > 2000, 20, "a flood of events")
        asker = AgentSocket(str(sock_path))
        for _ in range(20):  # answered (within its 2 s timeout) while the flood goes on
            assert asker.time(timeout=2) is not None
        cid = console.enqueue(node, "test.echo", {"text": "still serving"})
        wait_for(lambda: console.command(cid).state == "succeeded", 20, "a command during the flood")
        beats = len(console.heartbeats(node))
        wait_for(lambda: len(console.heartbeats(node)) > beats, 10, "a heartbeat during the flood")
    finally:
        stop.set()
        thread.join(5)
    server_side = running.daemon.supervisor.state_of("agent.localsock")
    wait_for(lambda: (st := running.daemon.supervisor.state_of("agent.localsock").get("status", {}))
             and st.get("events", 0) + st.get("events_dropped", 0) == flooder.sent, 20,
             "every written event to be read by the agent (queued or counted as dropped)")
    assert server_side["state"] == "running"
