"""Drive libnccl-net-lockstep.so exactly as NCCL's proxy thread does, through ctypes.

    python netplugin.py recv --lib L --dir D [--abi 12] [--bytes N | --until-stop] [--seed S]
    python netplugin.py send --lib L --dir D ...

The receiver listens and writes the 128-byte handle to D/handle; the sender reads it and
connects (in NCCL the handle travels through the bootstrap network; here through a file, which
also works between network namespaces). Both sides expand the same seeded plan: groups of 1..8
messages from 0 B to 4 MiB, one grouped (multi-buffer, tagged) receive per group, each message
sent in a shuffled tag order. Up to 32 requests are outstanding on each side; a NULL request is
retried. Every message's bytes are a slice of a seeded random pool, so the receiver checks each
byte and each reported size without a side channel.

--until-stop: the sender keeps going until D/stop exists, then writes the number of groups it
sent to D/groups; the receiver checks exactly that many arrived (more would be duplication).

Prints one JSON line at the end: {"ok": ..., "bytes": ..., "groups": ..., "error": ...,
"stall_max_ms": ..., "completions": [...]} (completions only with --trace: receive times).
Exit status 0 only when everything arrived intact. Standalone (stdlib only), so it runs by path
inside network namespaces, under `LD_PRELOAD=libasan.so` for the sanitizer build.
"""

from __future__ import annotations

import argparse
import ctypes as C
import json
import os
import random
import sys
import time
import zlib

MAX_REQUESTS = 32
HANDLE_SIZE = 128
POOL_BYTES = 8 << 20
PROGRESS_EVERY = 8 << 20  # the receiver writes D/progress (bytes received) this often
SIZES = [0, 1, 7, 100, 4096, 65536, 131072, 1 << 20, 4 << 20]

RESULT = C.c_int
P = C.c_void_p
PP = C.POINTER(C.c_void_p)
IP = C.POINTER(C.c_int)
SP = C.POINTER(C.c_size_t)
LOGGER = C.CFUNCTYPE(None, C.c_int, C.c_ulong, C.c_char_p, C.c_int, C.c_char_p)  # variadic tail ignored
F = C.CFUNCTYPE

# ---- the ABI, per version (field order as NCCL's plugins/net README documents it) ----


class VProps4(C.Structure):
    _fields_ = [("ndevs", C.c_int), ("devs", C.c_int * 4)]


class VProps8(C.Structure):
    _fields_ = [("ndevs", C.c_int), ("devs", C.c_int * 8)]


_PROPS_HEAD = [("name", C.c_char_p), ("pciPath", C.c_char_p), ("guid", C.c_uint64), ("ptrSupport", C.c_int),
               ("regIsGlobal", C.c_int)]
_PROPS_MID = [("speed", C.c_int), ("port", C.c_int), ("latency", C.c_float), ("maxComms", C.c_int),
              ("maxRecvs", C.c_int), ("netDeviceType", C.c_int), ("netDeviceVersion", C.c_int)]


class Props8(C.Structure):
    _fields_ = _PROPS_HEAD + _PROPS_MID


class Props9(C.Structure):
    _fields_ = _PROPS_HEAD + [("forceFlush", C.c_int)] + _PROPS_MID + [
        ("vProps", VProps4), ("maxP2pBytes", C.c_size_t), ("maxCollBytes", C.c_size_t)]


class Props11(C.Structure):
    _fields_ = Props9._fields_ + [("maxMultiRequestSize", C.c_int)]


class Props12(C.Structure):
    _fields_ = _PROPS_HEAD + [("forceFlush", C.c_int)] + _PROPS_MID + [
        ("vProps", VProps8), ("maxP2pBytes", C.c_size_t), ("maxCollBytes", C.c_size_t),
        ("maxMultiRequestSize", C.c_int), ("railId", C.c_int16), ("planeId", C.c_int16)]


PROPS = {8: Props8, 9: Props9, 10: Props9, 11: Props11, 12: Props12}


def _table(version: int):
    sz = C.c_int if version == 8 else C.c_size_t
    szp = C.POINTER(sz)
    props = C.POINTER(PROPS[version])
    ctx = [P] if version >= 11 else []
    if version >= 11:
        init = F(RESULT, PP, C.c_uint64, P, LOGGER, P)
    elif version == 10:
        init = F(RESULT, LOGGER, P)
    else:
        init = F(RESULT, LOGGER)
    connect_args = ([P] if version >= 11 else []) + [C.c_int] + ([P] if version == 10 else []) + [P, PP, PP]
    ph = [P] if version >= 10 else []
    fields = [
        ("name", C.c_char_p),
        ("init", init),
        ("devices", F(RESULT, IP)),
        ("getProperties", F(RESULT, C.c_int, props)),
        ("listen", F(RESULT, *ctx, C.c_int, P, PP)),
        ("connect", F(RESULT, *connect_args)),
        ("accept", F(RESULT, P, PP, PP)),
        ("regMr", F(RESULT, P, P, C.c_size_t, C.c_int, PP)),
        ("regMrDmaBuf", P),
        ("deregMr", F(RESULT, P, P)),
        ("isend", F(RESULT, P, P, sz, C.c_int, P, *ph, PP)),
        ("irecv", F(RESULT, P, C.c_int, PP, szp, IP, PP, *([PP] if version >= 10 else []), PP)),
        ("iflush", F(RESULT, P, C.c_int, PP, IP, PP, PP)),
        ("test", F(RESULT, P, IP, IP)),
        ("closeSend", F(RESULT, P)),
        ("closeRecv", F(RESULT, P)),
        ("closeListen", F(RESULT, P)),
        ("getDeviceMr", P),
        ("irecvConsumed", P),
    ]
    if version >= 9:
        fields.append(("makeVDevice", P))
    if version >= 11:
        fields += [("finalize", F(RESULT, P)), ("setNetAttr", P)]
    return type(f"ncclNet_v{version}", (C.Structure,), {"_fields_": fields}), sz


class Plugin:
    """The plugin's table of one ABI version, called as NCCL calls it."""

    def __init__(self, lib_path: str, version: int):
        self.dl = C.CDLL(lib_path, mode=os.RTLD_NOW | os.RTLD_LOCAL)
        self.version = version
        self.tables = {}
        for v in (8, 9, 10, 11, 12):  # every exported symbol resolves and names the plugin
            table, _ = _table(v)
            self.tables[v] = table.in_dll(self.dl, f"ncclNetPlugin_v{v}")
            assert self.tables[v].name == b"Lockstep", self.tables[v].name
        self.net = self.tables[version]
        self.size_t = _table(version)[1]
        self.ctx = C.c_void_p()
        self._logger = LOGGER(lambda level, flags, file, line, fmt: None)

    def check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise PluginError(rc, what)

    def init(self):
        if self.version >= 11:
            self.check(self.net.init(C.byref(self.ctx), 1, None, self._logger, None), "init")
        elif self.version == 10:
            self.check(self.net.init(self._logger, None), "init")
        else:
            self.check(self.net.init(self._logger), "init")
        n = C.c_int()
        self.check(self.net.devices(C.byref(n)), "devices")
        props = PROPS[self.version]()
        self.check(self.net.getProperties(0, C.byref(props)), "getProperties")
        return n.value, props

    def listen(self, handle):
        comm = C.c_void_p()
        args = ([self.ctx] if self.version >= 11 else []) + [0, handle, C.byref(comm)]
        self.check(self.net.listen(*args), "listen")
        return comm

    def connect_once(self, handle):
        comm, dev = C.c_void_p(), C.c_void_p()
        args = ([self.ctx] if self.version >= 11 else []) + [0] + ([None] if self.version == 10 else []) + [
            handle, C.byref(comm), C.byref(dev)]
        self.check(self.net.connect(*args), "connect")
        return comm if comm.value else None

    def accept_once(self, listen_comm):
        comm, dev = C.c_void_p(), C.c_void_p()
        self.check(self.net.accept(listen_comm, C.byref(comm), C.byref(dev)), "accept")
        return comm if comm.value else None

    def finalize(self):
        if self.version >= 11:
            self.check(self.net.finalize(self.ctx), "finalize")

    def unload(self):
        handle = self.dl._handle
        self.tables = self.net = None
        self.dl = None
        C.CDLL(None).dlclose(C.c_void_p(handle))


class PluginError(RuntimeError):
    def __init__(self, rc: int, what: str):
        super().__init__(f"{what} returned {rc}")
        self.rc = rc


def plan(seed: int):
    """Groups for ever: [(sizes, tags, send order)]."""
    rng = random.Random(seed)
    while True:
        n = 1 if rng.random() < 0.7 else rng.randint(2, 8)
        sizes = [rng.choice(SIZES) if rng.random() < 0.6 else rng.randint(0, 4 << 20) for _ in range(n)]
        tags = rng.sample(range(1, 1000), n)
        order = list(range(n))
        rng.shuffle(order)
        yield sizes, tags, order


def offset(seed: int, group: int, slot: int, size: int) -> int:
    return (zlib.crc32(f"{seed}:{group}:{slot}".encode()) * 4099) % (POOL_BYTES - size + 1)


def make_pool(seed: int):
    data = random.Random(seed ^ 0x5EED).randbytes(POOL_BYTES)
    return C.create_string_buffer(data, POOL_BYTES)


def read_handle(directory: str, timeout: float):
    path = os.path.join(directory, "handle")
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError("no handle from the receiver")
        time.sleep(0.01)
    with open(path, "rb") as f:
        return C.create_string_buffer(f.read(), HANDLE_SIZE)


def write_atomic(directory: str, name: str, data: bytes) -> None:
    tmp = os.path.join(directory, f".{name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
    os.rename(tmp, os.path.join(directory, name))


def run_send(plugin: Plugin, args) -> dict:
    handle = read_handle(args.dir, 30)
    comm = None
    while comm is None:  # non-blocking connect: called again until it returns a comm
        comm = plugin.connect_once(handle)
        if comm is None:
            time.sleep(0.001)
    try:
        return _send_all(plugin, comm, args)
    finally:  # closed on errors too: the plugin's threads must be gone before dlclose
        plugin.check(plugin.net.closeSend(comm), "closeSend")


def _send_all(plugin: Plugin, comm, args) -> dict:
    mh = C.c_void_p()
    plugin.check(plugin.net.regMr(comm, None, 0, 1, C.byref(mh)), "regMr")
    pool = make_pool(args.seed)
    base = C.addressof(pool)
    inflight = []  # (request, size)
    queue = []     # messages to post: (pointer, size, tag)
    groups = plan(args.seed)
    group = sent = nulls = 0
    stop_at = None
    done_flag, size_out = C.c_int(), (C.c_int * 8)()
    while True:
        if not queue and stop_at is None:
            if (args.bytes and sent >= args.bytes) or (args.until_stop and os.path.exists(os.path.join(args.dir, "stop"))):
                stop_at = group
                if args.until_stop:
                    write_atomic(args.dir, "groups", str(group).encode())
            else:
                sizes, tags, order = next(groups)
                for j in order:
                    queue.append((base + offset(args.seed, group, j, sizes[j]), sizes[j], tags[j]))
                    sent += sizes[j]
                group += 1
        while queue and len(inflight) < MAX_REQUESTS:
            ptr, size, tag = queue[0]
            own = None
            if args.scribble:  # a buffer of its own, overwritten once test() says done
                own = C.create_string_buffer(size or 1)
                C.memmove(own, ptr, size)
                ptr = C.addressof(own)
            req = C.c_void_p()
            args_ = [comm, C.c_void_p(ptr), size, tag, mh] + ([None] if plugin.version >= 10 else []) + [C.byref(req)]
            plugin.check(plugin.net.isend(*args_), "isend")
            if not req.value:
                nulls += 1
                break
            inflight.append((req, size, own))
            queue.pop(0)
        still = []
        for req, size, own in inflight:
            plugin.check(plugin.net.test(req, C.byref(done_flag), size_out), "test")
            if done_flag.value:
                if size_out[0] != size:
                    raise AssertionError(f"test reported {size_out[0]} bytes sent, not {size}")
                if own is not None:  # NCCL reuses a buffer once its send is done: any later read is corrupt
                    C.memset(own, 0xEE, size)
            else:
                still.append((req, size, own))
        inflight = still
        if stop_at is not None and not queue and not inflight:
            break
        if inflight and len(still) == len(inflight):
            time.sleep(0.0002)
    plugin.check(plugin.net.deregMr(comm, mh), "deregMr")
    return {"bytes": sent, "groups": stop_at, "null_requests": nulls}


def run_recv(plugin: Plugin, listen_comm, args) -> dict:
    comm = None
    while comm is None:  # non-blocking accept
        comm = plugin.accept_once(listen_comm)
        if comm is None:
            time.sleep(0.001)
    plugin.check(plugin.net.closeListen(listen_comm), "closeListen")
    try:
        return _recv_all(plugin, comm, args)
    finally:
        plugin.check(plugin.net.closeRecv(comm), "closeRecv")


def _recv_all(plugin: Plugin, comm, args) -> dict:
    mh = C.c_void_p()
    plugin.check(plugin.net.regMr(comm, None, 0, 1, C.byref(mh)), "regMr")
    pool = make_pool(args.seed)
    groups = plan(args.seed)
    rng = random.Random(args.seed + 1)
    posted = []  # (request, group, sizes, buffers)
    group_posted = group_done = received = nulls = reported = 0
    expected_groups = None if args.until_stop else -1
    total_planned = 0
    last_completion = time.monotonic()
    stall_max = 0.0
    completions = []
    done_flag, size_out = C.c_int(), (C.c_int * 8)()
    while True:
        if expected_groups is None and os.path.exists(os.path.join(args.dir, "groups")):
            with open(os.path.join(args.dir, "groups")) as f:
                expected_groups = int(f.read())
        # post receives ahead, as NCCL does (here up to 32 groups)
        while len(posted) < MAX_REQUESTS and not (args.bytes and total_planned >= args.bytes):
            sizes, tags, _ = next(groups)
            n = len(sizes)
            bufs = [C.create_string_buffer(s + rng.choice([0, 0, 1, 4096])) for s in sizes]
            ptrs = (C.c_void_p * n)(*[C.addressof(b) for b in bufs])
            capacities = (plugin.size_t * n)(*[len(b) for b in bufs])
            ctags = (C.c_int * n)(*tags)
            mhs = (C.c_void_p * n)(*([mh.value] * n))
            req = C.c_void_p(1)  # NCCL may pass NCCL_NET_OPTIONAL_RECV_COMPLETION in here
            args_ = [comm, n, ptrs, capacities, ctags, mhs] + ([None] if plugin.version >= 10 else []) + [C.byref(req)]
            plugin.check(plugin.net.irecv(*args_), "irecv")
            if not req.value or req.value == 1:
                nulls += 1
                groups = _replay(groups, (sizes, tags, _))
                break
            posted.append((req, group_posted, sizes, bufs))
            group_posted += 1
            total_planned += sum(sizes)
        if posted:
            req, g, sizes, bufs = posted[0]
            plugin.check(plugin.net.test(req, C.byref(done_flag), size_out), "test")
            if done_flag.value:
                now = time.monotonic()
                stall_max = max(stall_max, now - last_completion)
                last_completion = now
                if args.trace:
                    completions.append(round(time.time(), 4))
                if expected_groups is not None and expected_groups >= 0 and g >= expected_groups:
                    raise AssertionError(f"group {g} arrived but only {expected_groups} were sent (duplication)")
                for j, size in enumerate(sizes):
                    if size_out[j] != size:
                        raise AssertionError(f"group {g} buffer {j}: test reported {size_out[j]} bytes, sent {size}")
                    off = offset(args.seed, g, j, size)
                    if C.string_at(bufs[j], size) != pool.raw[off:off + size]:
                        raise AssertionError(f"group {g} buffer {j}: the {size} bytes differ from what was sent")
                    received += size
                posted.pop(0)
                group_done += 1
                if received - reported >= PROGRESS_EVERY:  # for tests that act while data flows
                    reported = received
                    write_atomic(args.dir, "progress", str(received).encode())
                continue
        if expected_groups is not None and expected_groups >= 0 and group_done >= expected_groups:
            break
        if expected_groups == -1 and args.bytes and total_planned >= args.bytes and not posted:
            break
        time.sleep(0.0002)
    plugin.check(plugin.net.deregMr(comm, mh), "deregMr")
    out = {"bytes": received, "groups": group_done, "null_requests": nulls, "stall_max_ms": round(stall_max * 1e3, 1)}
    if args.trace:
        out["completions"] = completions
    return out


def _replay(groups, first):
    yield first
    yield from groups


def run_and_report(plugin: Plugin, body, result: dict, errors=(AssertionError, TimeoutError)) -> int:
    """The harness programs' one shell: run ``body()`` (its dict joins ``result``), finalize and
    unload the plugin, print the result as one JSON line; 0 when it ran through. A plugin error
    or a failed check is reported in the line, never as a traceback."""
    try:
        result.update(body())
        plugin.finalize()
        result["ok"] = True
    except PluginError as exc:
        result.update(error=str(exc), rc=exc.rc)
    except errors as exc:
        result.update(error=str(exc))
    finally:
        plugin.unload()
    print(json.dumps(result), flush=True)
    return 0 if result["ok"] else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("role", choices=["send", "recv"])
    parser.add_argument("--lib", required=True)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--abi", type=int, default=12, choices=[8, 9, 10, 11, 12])
    parser.add_argument("--bytes", type=int, default=0)
    parser.add_argument("--until-stop", action="store_true")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--trace", action="store_true")
    parser.add_argument("--scribble", action="store_true",
                        help="send: each message from its own buffer, overwritten as soon as test() says done")
    args = parser.parse_args(argv)
    plugin = Plugin(args.lib, args.abi)
    result = {"role": args.role, "abi": args.abi, "ok": False}

    def body() -> dict:
        ndev, props = plugin.init()
        result.update(devices=ndev, nic=props.name.decode(), speed=props.speed, max_recvs=props.maxRecvs)
        if args.role == "recv":
            handle = C.create_string_buffer(HANDLE_SIZE)
            listen_comm = plugin.listen(handle)
            write_atomic(args.dir, "handle", handle.raw)
            return run_recv(plugin, listen_comm, args)
        return run_send(plugin, args)

    return run_and_report(plugin, body, result)


if __name__ == "__main__":
    sys.exit(main())
