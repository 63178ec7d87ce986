"""Summarize a py-spy raw profile (collapsed stacks): where the console's threads spend samples.

    python -m bench.longpoll.profile console-profile.txt [--top 40] [--match console/,api/]

Prints, per thread kind (event loop, DB pool, other), the share of samples, then the functions
with the largest inclusive share (a function counted once per stack it appears in).
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

FRAME = re.compile(r"^(?P<func>.+?) \((?P<file>[^()]*?)(?::(?P<line>\\d+))?\)$")


def thread_kind(frame: str) -> str:
    if "lockstep-db" in frame:
        return "db pool"
    if "MainThread" in frame or "0x" in frame and "main" in frame.lower():
        return "event loop"
    return "other"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.longpoll.profile", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("profile")
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--match", default="", help="only functions whose file contains one of these (comma list)")
    args = p.parse_args(argv)
    kinds: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in Path(args.profile).read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        kinds[frames[0] if frames else "?"] += n
        seen = set()
        for frame in frames[1:]:
            m = FRAME.match(frame)
            name = f"{m['func']} ({Path(m['file']).name})" if m else frame
            if args.match and not (m and any(s in m["file"] for s in args.match.split(","))):
                continue
            if name not in seen:
                seen.add(name)
                inclusive[name] += n
    print(f"{total} samples")
    for kind, n in kinds.most_common(12):
        print(f"  {100 * n / total:5.1f}%  {kind}")
    print("inclusive:")
    for name, n in inclusive.most_common(args.top):
        print(f"  {100 * n / total:5.1f}%  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
