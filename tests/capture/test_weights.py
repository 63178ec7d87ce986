"""Weight push to rollout replicas (separate processes) while they generate.

Every generation reports the version it ran and an exact checksum of the weights its model used,
taken before and after its forward pass: each must be the checksum of that version as the trainer
pushed it, so a generation that saw a mix of two versions (or weights changing under it) fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys

import pytest
import torch

from lockstep.weights import WeightPublisher, WeightReplica
from lockstep.weights.plan import needed, stripe
from lockstep.weights.protocol import ProtocolError, parse_layout, parse_segments

from .conftest import child_env, wait_for

REPLICA = r"""
import json, sys, time, torch
from lockstep.weights import WeightReplica

host, port, name, last = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])

def net():
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128), torch.nn.Linear(128, 8))

def checksum(tensors):
    return int(sum((i + 1) * t.detach().reshape(-1).view(torch.int32).to(torch.int64).sum() for i, t in enumerate(tensors)))

replica = WeightReplica((host, port), name=name)
replica.wait_for_version(1, timeout=120)
model = net()
replica.bind(model)
x = torch.randn(4, 64)
print(json.dumps({"ready": True}), flush=True)
seen = {}  # version -> every distinct checksum a generation on it reported (must be one)
order, max_waited = [], 0.0
deadline = time.monotonic() + 240
while time.monotonic() < deadline:
    entered = time.perf_counter()
    with replica.hold() as w:
        max_waited = max(max_waited, time.perf_counter() - entered)
        before = checksum(model.state_dict().values())
        model(x).sum()
        after = checksum(model.state_dict().values())
        direct = checksum(w.tensors.values())
    seen.setdefault(w.version, set()).update({before, after, direct})
    if not order or order[-1] != w.version:
        order.append(w.version)
    if w.version == last:
        break
print(json.dumps({"done": replica.version, "order": order, "seen": {v: sorted(c) for v, c in seen.items()},
                  "max_waited_s": max_waited, "max_swap_s": replica.max_swap_s, "errors": replica.errors}), flush=True)
sys.stdin.readline()  # stay connected until the test has seen this replica on the last version
replica.close()
"""


def net():
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128), torch.nn.Linear(128, 8))


def checksum(tensors):
    return int(sum((i + 1) * t.detach().reshape(-1).view(torch.int32).to(torch.int64).sum() for i, t in enumerate(tensors)))


def start_replica(address, name, last):
    proc = subprocess.Popen(
        [sys.executable, "-c", REPLICA, address[0], str(address[1]), name, str(last)],
        env=child_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    assert line and json.loads(line)["ready"], f"replica {name} did not start ({proc.poll()})"
    return proc


def finish(proc):
    out, _ = proc.communicate("exit\n", timeout=240)
    assert proc.returncode == 0, out
    return [json.loads(line) for line in out.splitlines() if line]


@pytest.mark.parametrize("transport", ["tcp", "gloo"])
def test_three_generating_replicas_each_run_whole_versions_and_end_on_the_last(transport):
    torch.manual_seed(0)
    model = net()
    last = 8
    pub = WeightPublisher(model, streams=3, transport=transport, delta=True)
    expected = {}
    procs = {}
    try:
        first = pub.push(model)
        expected[1] = checksum(model.state_dict().values())
        procs = {f"r{i}": start_replica(pub.address, f"r{i}", last) for i in range(3)}
        first.wait(timeout=120)
        wait_for(lambda: {n: s["applied"] for n, s in pub.status()["replicas"].items()} == dict.fromkeys(procs, 1), what="3 replicas on version 1")

        sent = []
        for version in range(2, last + 1):
            with torch.no_grad():
                layer = model[0] if version % 2 else model[2]  # delta: only some tensors change
                layer.weight.add_(0.25 * version)
                if version == 5:
                    model[3].bias.mul_(-1)
            handle = pub.push(model)
            expected[version] = checksum(model.state_dict().values())
            result = handle.wait(timeout=120)
            assert handle.version == version and handle.changed == (2 if version == 5 else 1)
            assert set(result["replicas"].values()) == {"received"}
            sent.append(result["bytes"])
            if version == 4:  # a replica restarts after a kill -9 and must come back on the latest
                procs["r2"].send_signal(signal.SIGKILL)
                procs["r2"].wait()
                procs["r2"] = start_replica(pub.address, "r2", last)
            if version == 6:  # a late joiner
                procs["late"] = start_replica(pub.address, "late", last)
        full = sum(t.nbytes for t in model.state_dict().values())
        assert all(b < full * 3 for b in sent[:2])  # deltas, not the whole model to every replica

        def applied():
            return {n: s["applied"] for n, s in pub.status()["replicas"].items()}

        # every replica, the restarted one and the late joiner too, on the last version
        with contextlib.suppress(AssertionError):
            wait_for(lambda: applied() == dict.fromkeys(procs, last), timeout=60)
        assert applied() == dict.fromkeys(procs, last), pub.status()
        for name, proc in procs.items():
            (summary,) = finish(proc)
            assert summary["done"] == last and summary["errors"] == [], (name, summary)
            order = summary["order"]
            assert order == sorted(order) and order[-1] == last, name  # never back to an older one
            for version, checksums in summary["seen"].items():
                assert checksums == [expected[int(version)]], (name, version)
            if name == "late":
                assert order[0] >= 6
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
        pub.close()


@pytest.mark.parametrize("transport", ["tcp", "gloo"])
def test_an_overlapped_push_is_read_by_the_leader_and_the_optimizer_step_waits_for_it(transport):
    # 32 MiB of weights: the leader reads them in chunks while the trainer goes straight on to
    # optimizer.step(), which changes every byte. Each replica version must be the weights as they
    # were at push(), not a mix with the step's.
    torch.manual_seed(0)
    model = torch.nn.Linear(2048, 4096)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    pub = WeightPublisher(model, streams=3, transport=transport)
    replica = WeightReplica(pub.address, name="r")
    try:
        assert pub.leader_reads_memory
        for version in (1, 2, 3):
            expected = {k: v.clone() for k, v in model.state_dict().items()}
            handle = pub.push(model, overlap=True)
            assert handle.pulled
            for p in model.parameters():
                p.grad = torch.full_like(p, 0.5)
            opt.step()  # waits for the leader's reads
            assert handle.staged
            result = handle.wait(timeout=120)
            assert set(result["replicas"].values()) <= {"received"}
            replica.wait_for_version(version, timeout=60)
            with replica.hold() as w:  # swaps to it on entry
                assert w.version == version
                for k, v in expected.items():
                    assert torch.equal(w.tensors[k], v), (version, k)
        assert not torch.equal(model.weight, expected["weight"])  # the steps did change the weights
    finally:
        replica.close()
        pub.close()


@pytest.mark.parametrize("transport", ["tcp", "gloo"])
def test_a_shared_module_is_sent_from_its_own_memory_and_a_late_joiner_gets_the_last_version(transport):
    # share=True: the module's tensors move into the buffer the leader sends from, so a push
    # stages nothing; the optimizer step waits until the replica has the version and the arena
    # (for late joiners) has it too.
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.BatchNorm1d(2048))
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    weight = model[0].weight
    pub = WeightPublisher(model, streams=3, transport=transport, share=True)
    homed = {k: v.data_ptr() for k, v in model.state_dict().items()}
    assert model[0].weight is weight and opt.param_groups[0]["params"][0] is weight  # same objects, moved
    replica = WeightReplica(pub.address, name="r")
    late = None
    try:
        for version in (1, 2, 3):
            expected = {k: v.clone() for k, v in model.state_dict().items()}
            handle = pub.push(model, overlap=True)
            assert handle.pulled and handle.staged_bytes == 0  # nothing copied before sending
            for p in model.parameters():
                p.grad = torch.full_like(p, 0.25)
            opt.step()  # waits until the replica and the arena have the version
            assert handle.staged
            result = handle.wait(timeout=120)
            assert handle.delivered_s is not None
            if version > 1:  # connected by now (version 1 may reach it as a late joiner)
                assert result["replicas"] == {"r": "received"}
            replica.wait_for_version(version, timeout=60)
            with replica.hold() as w:
                assert w.version == version
                for k, v in expected.items():
                    assert torch.equal(w.tensors[k], v), (version, k)
        assert {k: v.data_ptr() for k, v in model.state_dict().items()} == homed  # still in the shared buffer
        late = WeightReplica(pub.address, name="late")  # served from the arena: version 3, not the stepped weights
        late.wait_for_version(3, timeout=60)
        with late.hold() as w:
            assert w.version == 3
            for k, v in expected.items():
                assert torch.equal(w.tensors[k], v), k
        assert not torch.equal(model[0].weight, expected["0.weight"])
    finally:
        for r in (replica, late):
            if r is not None:
                r.close()
        pub.close()
    stepped = model[0].weight.detach().clone()
    model(torch.randn(4, 1024)).sum().backward()  # the tensors outlive the publisher's buffer handle
    opt.step()
    assert not torch.equal(model[0].weight, stepped)


def test_share_refuses_what_it_cannot_move_whole():
    with pytest.raises(TypeError, match="nn.Module"):
        WeightPublisher({"w": torch.zeros(4)}, share=True)
    tied = torch.nn.Module()
    tied.a = torch.nn.Linear(4, 4)
    tied.b = torch.nn.Linear(4, 4)
    tied.b.weight = tied.a.weight
    with pytest.raises(ValueError, match="tied"):
        WeightPublisher(tied, share=True)


def test_push_is_refused_while_the_previous_is_in_flight_when_asked_not_to_block():
    from lockstep.capture import CaptureInFlight

    model = net()
    pub = WeightPublisher(model, streams=2)
    replica = WeightReplica(pub.address, name="slow")
    try:
        pub.push(model).wait(timeout=60)  # no replica yet or one: delivered either way
        replica.wait_for_version(1, timeout=60)
        handle = pub.push(model)
        if not handle.done():
            with pytest.raises(CaptureInFlight):
                pub.push(model, block=False)
        assert handle.wait(timeout=60)["replicas"] == {"slow": "received"}
        assert pub.push(model, block=False).wait(timeout=60)["version"] == 3
    finally:
        replica.close()
        pub.close()


def test_a_replica_with_the_wrong_token_is_refused():
    model = net()
    pub = WeightPublisher(model, streams=1, token="s3cret")
    bad = WeightReplica(pub.address, name="intruder", token="guess", reconnect=False)
    good = WeightReplica(pub.address, name="ok", token="s3cret")
    try:
        pub.push(model).wait(timeout=60)
        assert good.wait_for_version(1, timeout=60) == 1
        wait_for(lambda: bad.errors, what="the refusal")
        assert "bad token" in bad.errors[0] and bad.version is None
        assert "intruder" not in pub.status()["replicas"]
    finally:
        bad.close()
        good.close()
        pub.close()


def test_publisher_refuses_weights_whose_names_or_shapes_changed():
    model = net()
    pub = WeightPublisher(model, streams=1)
    try:
        with pytest.raises(ValueError, match="names changed"):
            pub.push({"other": torch.zeros(2)})
        bad = dict(model.state_dict())
        bad["0.weight"] = torch.zeros(3, 3)
        with pytest.raises(ValueError, match="'0.weight'"):
            pub.push(bad)
        with pytest.raises(ValueError, match="transport"):
            WeightPublisher(model, transport="carrier-pigeon")
    finally:
        pub.close()


def test_stripes_cover_every_byte_once_and_balance_the_senders():
    sizes = [1000, 0, 7, 4096, 3]
    for streams in (1, 2, 3, 8):
        parts = stripe(sizes, [0, 1, 2, 3, 4], streams, chunk=256)
        assert len(parts) == streams
        covered = {t: [] for t in range(len(sizes))}
        for segs in parts:
            for t, off, n in segs:
                covered[t].append((off, n))
        for t, spans in covered.items():
            spans.sort()
            pos = 0
            for off, n in spans:
                assert off == pos
                pos += n
            assert pos == sizes[t]
        loads = [sum(n for _, _, n in segs) for segs in parts]
        assert max(loads) - min(loads) <= 256  # dealt a chunk at a time
        for segs in parts:  # each sender goes through the model in order (it can follow the copy)
            assert segs == sorted(segs)
    assert needed([3, 1, 5], None) == [0, 1, 2]
    assert needed([3, 1, 5], 3) == [2]


def test_frames_from_the_network_are_checked_before_use():
    with pytest.raises(ProtocolError, match="dtype"):
        parse_layout([["w", "torch.evil", [2], 8]])
    with pytest.raises(ProtocolError, match="nbytes"):
        parse_layout([["w", "torch.float32", [2], 9]])
    with pytest.raises(ProtocolError, match="outside"):
        parse_segments([[0, 4, 8]], [8])
    with pytest.raises(ProtocolError, match="outside"):
        parse_segments([[1, 0, 1]], [8])
    assert parse_segments([[0, 0, 8]], [8]) == [(0, 0, 8)]


def test_module_weights_of_every_dtype_arrive_exactly():
    weights = {
        "f32": torch.randn(33, 7),
        "bf16": torch.randn(100).to(torch.bfloat16),
        "i64": torch.arange(50),
        "mask": torch.rand(13) > 0.5,
        "scalar": torch.tensor(3.5),
        "empty": torch.empty(0, 4),
    }
    pub = WeightPublisher(weights, streams=4)
    replica = WeightReplica(pub.address, name="dtypes")
    try:
        pub.push(weights).wait(timeout=60)
        replica.wait_for_version(1, timeout=60)
        with replica.hold() as w:
            for k, v in weights.items():
                assert w.tensors[k].dtype == v.dtype and torch.equal(w.tensors[k], v), k
    finally:
        replica.close()
        pub.close()
    assert os.environ.get("LOCKSTEP_CAPTURE_FAULT") is None
