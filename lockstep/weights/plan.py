"""Pure planning of a weight push: which tensors a replica needs, and how they stripe over senders."""

from __future__ import annotations


def needed(changed_at: list[int], have: int | None) -> list[int]:
    """Tensors a replica holding version ``have`` (None: nothing) must receive."""
    if have is None:
        return list(range(len(changed_at)))
    return [i for i, v in enumerate(changed_at) if v > have]


def stripe(sizes: list[int], tensors: list[int], streams: int) -> list[list[tuple[int, int, int]]]:
    """Split the bytes of ``tensors`` (in order) into ``streams`` contiguous runs of near-equal size.

    Returns per stream a list of ``(tensor, byte offset, nbytes)`` segments; a large tensor is cut
    across streams, so one big tensor is still sent by every sender in parallel.
    """
    total = sum(sizes[t] for t in tensors)
    out: list[list[tuple[int, int, int]]] = [[] for _ in range(streams)]
    if total == 0:
        return out
    bounds = [total * (k + 1) // streams for k in range(streams)]
    stream, pos = 0, 0
    for t in tensors:
        off = 0
        while off < sizes[t]:
            while pos >= bounds[stream]:
                stream += 1
            n = min(sizes[t] - off, bounds[stream] - pos)
            out[stream].append((t, off, n))
            off += n
            pos += n
    return out
