"""Channel-layer group names: `o<org>` for an organization, `o<org>.c<cluster>` for a cluster,
and `u<user>` for a user's own sockets (access changes; never subscribable by a client).

Channels accepts `[A-Za-z0-9._-]` and fewer than 100 characters; ids keep names short and
free of user text.
"""

from __future__ import annotations

import re

_GROUP = re.compile(r"^o(?P<org>\d+)(?:\.c(?P<cluster>\d+))?$")


def organization_group(organization_id: int) -> str:
    return f"o{int(organization_id)}"


def cluster_group(organization_id: int, cluster_id: int) -> str:
    return f"o{int(organization_id)}.c{int(cluster_id)}"


def user_group(user_id: int) -> str:
    return f"u{int(user_id)}"


def parse_group(name: str) -> tuple[int, int | None] | None:
    """(organization id, cluster id or None) for a valid group name, else None."""
    match = _GROUP.match(name) if isinstance(name, str) else None
    if match is None:
        return None
    cluster = match.group("cluster")
    return int(match.group("org")), int(cluster) if cluster else None
