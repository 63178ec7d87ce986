"""The bound on how far a rank runs ahead of the off-node copy of its small state (``offnode``),
and the copy protocol between two supervisors (``node.PeerServer``): the decision on its own,
the shared-memory gate with real futex waits between threads, the records' tail, and a real
socket to a peer server. The whole path -- a lost node, a slowed forwarder -- is
tests/lockstep/test_node_loss.py's."""

from __future__ import annotations

import base64
import json
import os
import socket
import threading
import time
import types

import pytest

from lockstep.orchestrator.node import PeerServer
from lockstep.runtime import offnode, smallstate
from lockstep.runtime.transfer import recv_line


@pytest.mark.parametrize(("step", "post", "mid", "needs_mid", "wait"), [
    (7, 7, offnode.NONE, False, False),  # the boundary the step started from is held: go on
    (7, 8, 8, True, False),
    (7, 6, 7, False, True),  # its copy is a step behind: the survivors could finish step 8 without it
    (7, offnode.NONE, offnode.NONE, False, True),  # nothing held yet (a new holder)
    (7, 7, 6, True, True),  # the forward pass changed buffers: the replay pins them from mid(7)
    (7, 7, 6, False, False),  # unchanged buffers: post(7) is all a replacement needs
])
def test_a_rank_waits_only_while_the_boundary_its_step_started_from_is_not_held(step, post, mid, needs_mid, wait):
    assert offnode.must_wait(step, post, mid, needs_mid) is wait


def _waiter(gate, step, needs_mid=False):
    t = threading.Thread(target=gate.wait, args=(step, needs_mid), daemon=True)
    t.start()
    return t


def test_the_gate_holds_the_step_until_the_copy_is_acknowledged_and_wakes_on_the_ack(tmp_path):
    state = offnode.CopyState(str(tmp_path), 3)
    gate = offnode.CopyGate(str(tmp_path), 3, say=lambda m: None)
    gate.wait(5, False)  # gate off (no holder): no wait at all
    assert gate.waits == 0
    state.set(gate=True, post=5)
    gate.wait(5, False)  # held already: the normal case, no wait
    assert gate.waits == 0
    t = _waiter(gate, 6)
    t.join(0.3)
    assert t.is_alive(), "the step went on with its boundary's copy unacknowledged"
    state.set(mid=6)  # not what it waits for
    t.join(0.3)
    assert t.is_alive()
    started = time.monotonic()
    state.set(post=6)
    t.join(5)
    assert not t.is_alive() and time.monotonic() - started < 0.9  # woken by the ack, not its 1 s timeout
    assert gate.waits == 1


def test_the_gate_waits_for_mid_when_asked_and_opens_when_the_node_has_no_holder(tmp_path):
    state = offnode.CopyState(str(tmp_path), 0)
    gate = offnode.CopyGate(str(tmp_path), 0, say=lambda m: None)
    state.set(gate=True, post=2, mid=1)
    t = _waiter(gate, 2, needs_mid=True)
    t.join(0.3)
    assert t.is_alive()
    state.set(gate=False)  # the holder was lost and no node is left to copy to
    t.join(5)
    assert not t.is_alive()


def test_a_single_node_job_has_no_gate(tmp_path):
    gate = offnode.CopyGate(str(tmp_path), 0, say=lambda m: None)
    gate.wait(10, True)
    assert gate.waits == 0


def test_a_rank_write_wakes_the_forwarder(tmp_path):
    forwarder = offnode.Written(str(tmp_path), create=True)
    rank = offnode.Written(str(tmp_path), create=False)
    seen = forwarder.value()
    woke = threading.Event()

    def wait():
        forwarder.wait(seen, 5.0)
        woke.set()

    t = threading.Thread(target=wait, daemon=True)
    t.start()
    t.join(0.2)
    assert not woke.is_set()
    started = time.monotonic()
    rank.touch(2, 1)
    assert woke.wait(5) and time.monotonic() - started < 2.0
    assert forwarder.value() != seen
    forwarder.wait(seen, 5.0)  # the value changed before the wait: returns at once, nothing missed


def test_the_records_tail_is_read_from_an_offset_and_a_record_cut_short_waits(tmp_path):
    path = str(tmp_path / "rank0.records")
    writer = smallstate.RecordWriter(path)
    writer.append({"ev": "iter", "loader": 0, "index": 0}, b"rng0")
    first, end = smallstate.read_records_from(path, 0)
    assert [m["index"] for m, _ in first] == [0] and end == os.path.getsize(path)
    writer.append({"ev": "iter", "loader": 0, "index": 1}, b"rng1")
    with open(path, "ab") as f:
        f.write(b"\x05\x00\x00")  # a record still being written
    tail, end2 = smallstate.read_records_from(path, end)
    assert [(m["index"], b) for m, b in tail] == [(1, b"rng1")]
    assert end2 == os.path.getsize(path) - 3
    assert smallstate.read_records_from(path, end2) == ([], end2)
    assert [m["index"] for m, _ in smallstate.read_records(path)] == [0, 1]
    writer.close()


def _record(index):
    return [{"ev": "iter", "loader": 0, "index": index}, base64.b64encode(b"rng%d" % index).decode()]


def test_a_peer_server_holds_slots_and_records_tails_and_acknowledges_each_batch():
    server = PeerServer(types.SimpleNamespace(token="t0ken"), "127.0.0.1")
    with socket.create_connection(("127.0.0.1", int(server.addr.rsplit(":", 1)[1])), timeout=5) as sock:
        sock.sendall(json.dumps({"op": "hello", "token": "t0ken", "node": 1, "kind": "copies"}).encode() + b"\n")
        slot = [4, base64.b64encode(b"LSS1....").decode()]
        sock.sendall(f"2 post {json.dumps(slot)}\n2 records {json.dumps([_record(0)])}\n- 1\n".encode())
        buf = bytearray()
        assert recv_line(sock, buf) == b"1"
        assert server.copy_of(2)["post"] == slot and server.copy_of(2)["records"] == [_record(0)]
        sock.sendall(f"2 records+ {json.dumps([_record(1)])}\n2 records+ []\n- 2\n".encode())
        assert recv_line(sock, buf) == b"2"
        copy = server.copy_of(2)
        assert copy["records"] == [_record(0), _record(1)] and copy["mid"] is None
        sock.sendall(f"2 records {json.dumps([_record(5)])}\n- 3\n".encode())  # a new holder's resend
        assert recv_line(sock, buf) == b"3"
        assert server.copy_of(2)["records"] == [_record(5)]
    server.sock.close()


def test_a_peer_server_refuses_a_wrong_token():
    server = PeerServer(types.SimpleNamespace(token="t0ken"), "127.0.0.1")
    with socket.create_connection(("127.0.0.1", int(server.addr.rsplit(":", 1)[1])), timeout=5) as sock:
        sock.sendall(json.dumps({"op": "hello", "token": "wrong", "kind": "copies"}).encode() + b"\n")
        sock.sendall(b"2 post [1, \"\"]\n- 1\n")
        sock.settimeout(5)
        assert sock.recv(16) == b""  # closed, nothing acknowledged
    assert server.copy_of(2)["post"] is None
    server.sock.close()
