"""Pure planning of a weight push: which tensors a replica needs, and how they stripe over senders."""

from __future__ import annotations


def needed(changed_at: list[int], have: int | None) -> list[int]:
    """Tensors a replica holding version ``have`` (None: nothing) must receive."""
    if have is None:
        return list(range(len(changed_at)))
    return [i for i, v in enumerate(changed_at) if v > have]


def stripe(sizes: list[int], tensors: list[int], streams: int, chunk: int = 8 << 20) -> list[list[tuple[int, int, int]]]:
    """Deal the bytes of ``tensors`` (in order) to ``streams`` senders, ``chunk`` bytes at a time.

    Returns per stream a list of ``(tensor, byte offset, nbytes)`` segments in layout order. Chunks
    go round-robin, so every sender works through the model from its start: a large tensor is
    sent by all of them at once, and sending can follow a copy that is still in progress.
    """
    out: list[list[tuple[int, int, int]]] = [[] for _ in range(streams)]
    stream, room = 0, chunk
    for t in tensors:
        off = 0
        while off < sizes[t]:
            n = min(sizes[t] - off, room)
            segs = out[stream]
            if segs and segs[-1][0] == t and segs[-1][1] + segs[-1][2] == off:
                segs[-1] = (t, segs[-1][1], segs[-1][2] + n)  # same tensor, contiguous: one segment
            else:
                segs.append((t, off, n))
            off += n
            room -= n
            if room == 0:
                stream, room = (stream + 1) % streams, chunk
    return out
