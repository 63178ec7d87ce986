"""The staging arena: one shared-memory region that a capture is copied into, reused across captures.

An arena is an anonymous memfd (no name in /dev/shm, so nothing leaks when a process is
killed), mapped shared by the training process and by its background worker. The training
process copies each tensor once into its slot; the worker reads the same pages to write or send
them, so the only copy on the host is the staging copy itself.

With CUDA, the arena is registered with the driver (``cudaHostRegister``) so that device-to-host
copies are DMA into the shared pages, issued ``non_blocking`` on a side stream (see
``engine.Stager``). Registration is done once per arena, not per capture.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy
import torch

# Every slot starts on this boundary: enough for any dtype view and for DMA engines.
ALIGNMENT = 256


def _aligned(n: int) -> int:
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


@dataclass(frozen=True)
class Slot:
    """Where one tensor lives in an arena: a contiguous copy of shape ``shape`` and ``dtype``."""

    key: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class Layout:
    """The slots of one capture, in order, and the arena size they need."""

    slots: tuple[Slot, ...]
    nbytes: int
    signature: str

    @classmethod
    def of(cls, tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.dtype, tuple[int, ...]]]) -> Layout:
        """Lay out tensors (or ``(key, dtype, shape)`` triples) back to back, each slot aligned."""
        items = (
            [(k, t.dtype, tuple(t.shape)) for k, t in tensors.items()]
            if isinstance(tensors, Mapping)
            else list(tensors)
        )
        slots = []
        offset = 0
        digest = hashlib.blake2b(digest_size=16)
        for key, dtype, shape in items:
            numel = 1
            for s in shape:
                numel *= s
            nbytes = numel * torch._utils._element_size(dtype)
            slots.append(Slot(key, dtype, shape, offset, nbytes))
            digest.update(f"{key}\0{dtype}\0{shape}\0".encode())
            offset += _aligned(nbytes)
        return cls(tuple(slots), offset, digest.hexdigest())

    def __len__(self) -> int:
        return len(self.slots)


class Arena:
    """A shared-memory region of ``capacity`` bytes, and typed views of it.

    ``fd`` can be handed to another process (``socket.send_fds``) which maps the same pages with
    :meth:`attach`. The pages are populated at creation so that no capture pays page faults.
    """

    def __init__(self, capacity: int, *, fd: int | None = None, name: str = "lockstep-arena", populate: bool = True):
        self.capacity = max(int(capacity), ALIGNMENT)
        owned = fd is None
        if owned:
            fd = os.memfd_create(name, os.MFD_CLOEXEC)
            os.ftruncate(fd, self.capacity)
        self.fd = fd
        flags = mmap.MAP_SHARED | (mmap.MAP_POPULATE if populate and hasattr(mmap, "MAP_POPULATE") else 0)
        self._map = mmap.mmap(fd, self.capacity, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        self._bytes = torch.frombuffer(self._map, dtype=torch.uint8)
        self._views: dict[str, list[torch.Tensor]] = {}
        self._pinned = False

    @classmethod
    def attach(cls, fd: int, capacity: int) -> Arena:
        """Map an arena another process created (its memfd received over a socket)."""
        return cls(capacity, fd=fd, populate=False)

    def fits(self, layout: Layout) -> bool:
        return layout.nbytes <= self.capacity

    def views(self, layout: Layout) -> list[torch.Tensor]:
        """One tensor per slot sharing the arena's pages (cached per layout)."""
        cached = self._views.get(layout.signature)
        if cached is None:
            if not self.fits(layout):
                raise ValueError(f"layout needs {layout.nbytes} bytes, arena has {self.capacity}")
            cached = [self._typed(slot, self._bytes[slot.offset : slot.offset + slot.nbytes]) for slot in layout.slots]
            self._views = {layout.signature: cached}  # one layout at a time: views keep no extra memory
        return cached

    def own_storage_views(self, layout: Layout) -> list[torch.Tensor]:
        """Views whose storage is exactly their slot (``torch.save`` writes a tensor's whole storage).

        They keep the pages mapped for as long as they live, past :meth:`close` (through NumPy,
        whose arrays hold the mapping's buffer; ``torch.frombuffer`` does not).
        """
        out = []
        for slot in layout.slots:
            raw = torch.from_numpy(numpy.frombuffer(self._map, dtype=numpy.uint8, count=slot.nbytes, offset=slot.offset)) if slot.nbytes else torch.empty(0, dtype=torch.uint8)
            out.append(self._typed(slot, raw))
        return out

    @property
    def address(self) -> int:
        """Where the arena is mapped in this process."""
        return self._bytes.data_ptr()

    def memoryview(self, offset: int = 0, nbytes: int | None = None) -> memoryview:
        end = self.capacity if nbytes is None else offset + nbytes
        return memoryview(self._map)[offset:end]

    @staticmethod
    def _typed(slot: Slot, raw: torch.Tensor) -> torch.Tensor:
        if slot.nbytes == 0:
            return torch.empty(slot.shape, dtype=slot.dtype)
        return raw.view(slot.dtype).view(slot.shape)

    def pin(self) -> bool:
        """Register the pages with CUDA so device-to-host copies into them are asynchronous DMA.

        Returns False (and the arena stays pageable, copies then synchronous) when CUDA is not
        available or refuses the registration.
        """
        if self._pinned:
            return True
        if not torch.cuda.is_available():
            return False
        ptr = self._bytes.data_ptr()
        # cudaHostRegisterDefault (0): portable pinning of memory we already own.
        err = torch.cuda.cudart().cudaHostRegister(ptr, self.capacity, 0)
        self._pinned = int(err) == 0
        return self._pinned

    def close(self) -> None:
        if self._pinned:
            torch.cuda.cudart().cudaHostUnregister(self._bytes.data_ptr())
            self._pinned = False
        self._views = {}
        self._bytes = None
        # Views from own_storage_views() that are still alive keep the mapping until the last
        # of them goes; views() are for the arena's owner, who closes it after them.
        with contextlib.suppress(BufferError):
            self._map.close()
        self._map = None
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
