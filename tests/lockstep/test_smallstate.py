"""The per-rank small state: encoding, torn writes, records, RNG capture."""

import random

import numpy as np
import torch

from lockstep.runtime import smallstate
from lockstep.runtime.rng import RngTracker


def test_fields_round_trip():
    fields = {"torch": b"\x00\x01" * 100, "data": b"[[0,1,5]]", "empty": b""}
    assert smallstate.decode(smallstate.encode(fields)) == fields


def test_the_newest_complete_slot_is_read_and_a_torn_write_is_ignored(tmp_path):
    path = str(tmp_path / "rank0.post")
    w = smallstate.SlotWriter(path, capacity=64)
    w.write(1, smallstate.encode({"a": b"1"}))
    w.write(2, smallstate.encode({"a": b"2"}))
    step, payload = smallstate.read_slots(path)
    assert step == 2 and smallstate.decode(payload) == {"a": b"2"}
    # A writer killed in the middle of its third write leaves that slot's counter odd.
    w._map[0:8] = (int.from_bytes(w._map[0:8], "little") + 1).to_bytes(8, "little")
    step, payload = smallstate.read_slots(path)
    assert step == 2


def test_a_payload_larger_than_the_slot_grows_the_file(tmp_path):
    path = str(tmp_path / "rank0.mid")
    w = smallstate.SlotWriter(path, capacity=16)
    big = smallstate.encode({"buffers": b"x" * 5000})
    w.write(7, big)
    assert smallstate.read_slots(path) == (7, big)


def test_records_cut_short_by_a_death_are_dropped(tmp_path):
    path = str(tmp_path / "rank1.records")
    r = smallstate.RecordWriter(path)
    r.append({"ev": "iter", "loader": 0, "index": 0}, b"blob")
    r.append({"ev": "end", "loader": 0, "index": 0, "length": 5})
    with open(path, "ab") as f:
        f.write(b"\x20\x00\x00\x00\x00")
    assert [m["ev"] for m, _ in smallstate.read_records(path)] == ["iter", "end"]


def test_rng_capture_restores_every_generator():
    gen = torch.Generator().manual_seed(5)
    tracker = RngTracker()
    tracker.generators.append(gen)
    torch.manual_seed(1)
    np.random.seed(2)
    random.seed(3)
    fields = tracker.capture()
    expected = (torch.rand(3), np.random.rand(3), random.random(), torch.rand(2, generator=gen), np.random.randn())
    torch.manual_seed(99)
    np.random.seed(99)
    random.seed(99)
    gen.manual_seed(99)
    tracker.restore(fields)
    got = (torch.rand(3), np.random.rand(3), random.random(), torch.rand(2, generator=gen), np.random.randn())
    assert torch.equal(expected[0], got[0]) and np.array_equal(expected[1], got[1])
    assert expected[2] == got[2] and torch.equal(expected[3], got[3]) and expected[4] == got[4]


def test_a_gaussian_cached_by_numpy_is_captured():
    tracker = RngTracker()
    np.random.seed(4)
    tracker.capture()
    np.random.randn()  # draws two, caches one
    fields = tracker.capture()
    nxt = np.random.randn()  # the cached one: the key did not move
    np.random.seed(0)
    tracker.restore(fields)
    assert np.random.randn() == nxt


def test_the_watcher_reports_each_new_slot_once_and_follows_the_file_growing(tmp_path):
    path = str(tmp_path / "rank2.post")
    watcher = smallstate.SlotWatcher(path)
    assert watcher.poll() is None  # not written yet
    w = smallstate.SlotWriter(path, capacity=64)
    assert watcher.poll() is None  # created, nothing complete in it
    w.write(7, smallstate.encode({"a": b"7"}))
    step, payload = watcher.poll()
    assert step == 7 and smallstate.decode(payload) == {"a": b"7"}
    assert watcher.poll() is None
    w.write(8, smallstate.encode({"a": b"x" * 500}))  # larger than the slot: the file grows
    step, payload = watcher.poll()
    assert step == 8 and smallstate.decode(payload) == {"a": b"x" * 500}
    watcher.close()
