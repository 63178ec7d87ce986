"""Random-number-generator states of a rank, captured cheaply enough to do it at every step.

Captured: torch's CPU generator, every initialized CUDA device's generator, Python's ``random``,
NumPy's legacy global generator (``np.random.*``) when NumPy is loaded, and the
``torch.Generator`` objects the runtime found driving data loading (a DataLoader's or its
sampler's ``generator=``). ``random.getstate()`` costs ~10 µs and ``np.random.get_state()``
~35 µs, too much for every step, so the tracker peeks at the generators' raw state words (a
2.5 KB memcpy through ctypes, verified against the official getter at start-up and disabled if
they ever disagree) and calls the official getter only when the state moved.
"""

from __future__ import annotations

import ctypes
import random
import struct
import sys

import torch

_PY_STATE = struct.Struct("<i625I")
_NP_TAIL = struct.Struct("<iid")


class RngTracker:
    def __init__(self):
        self.generators: list[torch.Generator] = []
        self._py_peek = self._probe_python_peek()
        self._py_last: bytes | None = None
        self._py_field = b""
        self._np_addr: int | None = None
        self._np_last: bytes | None = None
        self._np_field = b""
        self._np_full = False

    # Python's random: the C RandomObject is {PyObject_HEAD; int index; uint32_t state[624]}.
    @staticmethod
    def _probe_python_peek() -> bool:
        try:
            raw = ctypes.string_at(id(random._inst) + 16, 4 + 624 * 4)
            index, *words = struct.unpack("<i624I", raw)
            version, internal, _gauss = random.getstate()
            return tuple(words) == internal[:624] and index == internal[624]
        except Exception:
            return False

    def _python_field(self) -> bytes:
        inst = random._inst
        if self._py_peek:
            raw = ctypes.string_at(id(inst) + 16, 4 + 624 * 4)
            gauss = inst.gauss_next
            if raw == self._py_last and gauss == getattr(self, "_py_gauss", None):
                return self._py_field
            self._py_last = raw
            self._py_gauss = gauss
        version, internal, gauss = random.getstate()
        self._py_field = _PY_STATE.pack(version, *internal) + (
            b"\x01" + struct.pack("<d", gauss) if gauss is not None else b"\x00")
        return self._py_field

    def _numpy_field(self) -> bytes | None:
        np = sys.modules.get("numpy")
        if np is None:
            return None
        if self._np_addr is None:
            try:
                self._np_addr = np.random.mtrand._rand._bit_generator.ctypes.state_address
            except Exception:
                self._np_addr = 0
                self._np_full = True
        if not self._np_full:
            raw = ctypes.string_at(self._np_addr, 624 * 4 + 4)
            if raw == self._np_last:
                return self._np_field
            if self._np_last is not None:
                # The legacy generator is in use: its cached Gaussian is not visible to a peek,
                # so from now on every capture asks NumPy.
                self._np_full = True
            self._np_last = raw
        name, keys, pos, has_gauss, cached = np.random.get_state()
        self._np_field = keys.astype("<u4").tobytes() + _NP_TAIL.pack(pos, has_gauss, cached)
        return self._np_field

    def capture(self, include_slow: bool = True) -> dict[str, bytes]:
        """``include_slow`` False: only torch generators (the mid-step pins)."""
        fields = {"torch": torch.get_rng_state().numpy().tobytes()}
        if torch.cuda.is_initialized():  # (never without CUDA; is_available() costs a call into C)
            states = torch.cuda.get_rng_state_all()
            fields["cuda"] = struct.pack("<I", len(states)) + b"".join(
                struct.pack("<I", s.numel()) + s.numpy().tobytes() for s in states)
        for i, gen in enumerate(self.generators):
            fields[f"gen.{i}"] = gen.get_state().numpy().tobytes()
        if include_slow:
            fields["py"] = self._python_field()
            npf = self._numpy_field()
            if npf is not None:
                fields["np"] = npf
        return fields

    def restore(self, fields: dict[str, bytes]):
        torch.set_rng_state(torch.frombuffer(bytearray(fields["torch"]), dtype=torch.uint8))
        if "cuda" in fields:
            data = fields["cuda"]
            (n,) = struct.unpack_from("<I", data)
            off = 4
            states = []
            for _ in range(n):
                (size,) = struct.unpack_from("<I", data, off)
                off += 4
                states.append(torch.frombuffer(bytearray(data[off:off + size]), dtype=torch.uint8))
                off += size
            torch.cuda.set_rng_state_all(states)
        for i, gen in enumerate(self.generators):
            key = f"gen.{i}"
            if key in fields:
                gen.set_state(torch.frombuffer(bytearray(fields[key]), dtype=torch.uint8))
        if "py" in fields:
            data = fields["py"]
            version, *internal = _PY_STATE.unpack_from(data)
            gauss = struct.unpack_from("<d", data, _PY_STATE.size + 1)[0] if data[_PY_STATE.size] else None
            random.setstate((version, tuple(internal), gauss))
            self._py_last = None
        if "np" in fields and "numpy" in sys.modules:
            np = sys.modules["numpy"]
            data = fields["np"]
            keys = np.frombuffer(data[:624 * 4], dtype="<u4").astype(np.uint32)
            pos, has_gauss, cached = _NP_TAIL.unpack_from(data, 624 * 4)
            np.random.set_state(("MT19937", keys, pos, has_gauss, cached))
            self._np_last = None
