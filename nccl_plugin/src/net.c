/* The plugin's calls (the newest ABI's shape; abi.c adapts the older versions). They run on
 * NCCL's threads and never block: they take a comm's lock, which its progress thread only holds
 * between non-blocking socket calls. */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "net_impl.h"

#define HANDLE_MAGIC 0x4c534e31u /* "LSN1" */

typedef struct {
    int dev;
    int fd;
    uint64_t token;
    int pending[16];
} ls_listen;

static int dummy_mr;
static int initialized;

ncclResult_t ls_init(void **ctx, ncclDebugLogger_t logger) {
    ncclResult_t rc = ls_config_load(logger);
    if (rc != ncclSuccess) return rc;
    initialized = 1;
    if (ctx) *ctx = &initialized; /* nothing per NCCL communicator; a non-NULL context */
    return ncclSuccess;
}

ncclResult_t ls_devices(int *ndev) {
    *ndev = ls_cfg.ndevs;
    return ncclSuccess;
}

ncclResult_t ls_get_properties(int dev, ncclNetProperties_v12_t *props) {
    if (dev < 0 || dev >= ls_cfg.ndevs) return ncclInvalidArgument;
    const ls_nic *primary = &ls_cfg.devs[dev].nics[0];
    memset(props, 0, sizeof *props);
    props->name = (char *)primary->name;
    props->pciPath = primary->pci_path[0] ? (char *)primary->pci_path : NULL;
    props->guid = (uint64_t)dev;
    props->ptrSupport = NCCL_PTR_HOST;
    props->regIsGlobal = 0;
    props->forceFlush = 0;
    props->speed = primary->speed_mbps;
    props->port = 0;
    props->latency = 0;
    props->maxComms = 65536;
    props->maxRecvs = LS_MAX_RECVS;
    props->netDeviceType = NCCL_NET_DEVICE_HOST;
    props->netDeviceVersion = 0;
    props->vProps.ndevs = 1;
    props->vProps.devs[0] = dev;
    props->maxP2pBytes = INT_MAX; /* test() reports sizes as int */
    props->maxCollBytes = INT_MAX;
    props->maxMultiRequestSize = 1;
    props->railId = -1;
    props->planeId = -1;
    return ncclSuccess;
}

ncclResult_t ls_listen_(int dev, void *handle, void **listen_comm) {
    if (dev < 0 || dev >= ls_cfg.ndevs) return ncclInvalidArgument;
    ls_listen *l = calloc(1, sizeof *l);
    if (!l) return ncclSystemError;
    uint16_t port;
    l->dev = dev;
    l->fd = ls_sock_listen(&ls_cfg.devs[dev].nics[0], &port);
    if (l->fd < 0) {
        free(l);
        return ncclSystemError;
    }
    l->token = ls_random64();
    for (int i = 0; i < 16; i++) l->pending[i] = -1;
    ls_handle h;
    memset(&h, 0, sizeof h);
    h.magic = HANDLE_MAGIC;
    h.addr = ls_cfg.devs[dev].nics[0].addr.s_addr;
    h.port = port;
    h.listen_token = l->token;
    memset(handle, 0, NCCL_NET_HANDLE_MAXSIZE);
    memcpy(handle, &h, sizeof h);
    *listen_comm = l;
    return ncclSuccess;
}

ncclResult_t ls_connect(int dev, void *handle, void **send_comm) {
    *send_comm = NULL;
    if (dev < 0 || dev >= ls_cfg.ndevs) return ncclInvalidArgument;
    ls_handle h;
    memcpy(&h, handle, sizeof h);
    if (h.magic != HANDLE_MAGIC) return ncclInvalidArgument;
    ls_comm *c = h.connecting;
    if (!c) {
        c = ls_comm_new(1, dev);
        if (!c) return ncclSystemError;
        c->listen_token = h.listen_token;
        c->conn_token = ls_random64();
        c->paths[0].peer_addr = h.addr;
        c->paths[0].peer_port = h.port;
        if (ls_comm_start(c) != 0) {
            ls_comm_free(c);
            return ncclSystemError;
        }
        h.connecting = c;
        memcpy(handle, &h, sizeof h);
        return ncclSuccess;
    }
    pthread_mutex_lock(&c->lock);
    int ready = c->established;
    uint64_t age = ls_now_ms() - c->created_ms;
    ncclResult_t err = c->error;
    pthread_mutex_unlock(&c->lock);
    if (ready) {
        *send_comm = c;
    } else if (err != ncclSuccess || age > (uint64_t)ls_cfg.giveup_ms) {
        LS_WARN("connect on device %d failed: the peer did not answer within %d ms", dev, ls_cfg.giveup_ms);
        ls_comm_free(c);
        err = err != ncclSuccess ? err : ncclSystemError;
    } else {
        return ncclSuccess;
    }
    h.connecting = NULL;
    memcpy(handle, &h, sizeof h);
    return err;
}

/* A connection is accepted once its first stream said HELLO with this listener's token. */
ncclResult_t ls_accept(void *listen_comm, void **recv_comm) {
    ls_listen *l = listen_comm;
    *recv_comm = NULL;
    for (;;) {
        int fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;
        int i = 0;
        while (i < 16 && l->pending[i] >= 0) i++;
        if (i == 16) {
            close(fd);
            break;
        }
        l->pending[i] = fd;
    }
    for (int i = 0; i < 16; i++) {
        int fd = l->pending[i];
        if (fd < 0) continue;
        char buf[sizeof(ls_hdr) + sizeof(ls_hello)];
        ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT | MSG_PEEK);
        if (n < (ssize_t)sizeof buf) {
            if (n == 0 || (n < 0 && errno != EAGAIN)) {
                close(fd);
                l->pending[i] = -1;
            }
            continue;
        }
        n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        l->pending[i] = -1;
        ls_hdr h;
        ls_hello hello;
        memcpy(&h, buf, sizeof h);
        memcpy(&hello, buf + sizeof h, sizeof hello);
        if (n != (ssize_t)sizeof buf || h.type != (LS_MAGIC << 16 | LS_HELLO) || h.a != l->token || h.b != 0) {
            close(fd);
            continue;
        }
        ls_comm *c = ls_comm_new(0, l->dev);
        if (!c) {
            close(fd);
            return ncclSystemError;
        }
        c->listen_token = l->token;
        c->conn_token = hello.conn_token;
        ls_hello_ack ack;
        memset(&ack, 0, sizeof ack);
        ack.nnics = (uint32_t)c->npaths;
        ack.eager_bytes = (uint32_t)ls_cfg.eager_bytes;
        for (int p = 0; p < c->npaths; p++) { /* this comm's own listeners: later streams and paths */
            uint16_t port = 0;
            c->paths[p].listen_fd = ls_sock_listen(&c->device.nics[p], &port);
            ack.listeners[p].addr = c->device.nics[p].addr.s_addr;
            ack.listeners[p].port = c->paths[p].listen_fd >= 0 ? port : 0;
        }
        ls_path *p0 = &c->paths[0];
        p0->streams[0].fd = fd;
        ls_path_up(c, 0);
        ls_queue_ctrl(&p0->streams[0], LS_HELLO_ACK, 0, 0, &ack, sizeof ack);
        c->established = 1;
        if (ls_comm_start(c) != 0) {
            ls_comm_free(c);
            return ncclSystemError;
        }
        *recv_comm = c;
        return ncclSuccess;
    }
    return ncclSuccess;
}

ncclResult_t ls_reg_mr(void *comm, void *data, size_t size, int type, void **mhandle) {
    (void)comm;
    (void)data;
    (void)size;
    if (type != NCCL_PTR_HOST) return ncclInternalError;
    *mhandle = &dummy_mr;
    return ncclSuccess;
}

ncclResult_t ls_dereg_mr(void *comm, void *mhandle) {
    (void)comm;
    (void)mhandle;
    return ncclSuccess;
}

static ls_req *free_req(ls_comm *c) {
    for (int i = 0; i < LS_MAX_REQS; i++)
        if (!c->reqs[i].used) return &c->reqs[i];
    return NULL;
}

/* Where a message of `size` bytes would start in the retransmit ring (never wrapping), or
 * UINT64_MAX while the ring has no room for it. */
static uint64_t ring_place(const ls_comm *c, size_t size) {
    size_t cap = ls_cfg.retransmit_bytes;
    uint64_t start = c->ring_head;
    if (start % cap + size > cap) start += cap - start % cap; /* skip the tail end */
    /* an empty ring holds no padding either (else a message above half the ring could wait for
     * ever behind the skipped tail end) */
    uint64_t tail = c->ring_tail == c->ring_head ? start : c->ring_tail;
    return start + size - tail <= cap ? start : UINT64_MAX;
}

/* A small message (below LOCKSTEP_NCCL_ZEROCOPY_BYTES) that fits the retransmit ring is copied
 * there and cut into chunks; the ring keeps it until acknowledged, for a resend over a standby.
 * Its request is done once its last chunk was handed to a socket: an isend holds a small batch
 * back (conn.c hold_batch), so a stream of them goes with one sendmsg per LS_TXQ frames, and a
 * test() on a send not done writes the batch (latency stays). A full ring or request table is a
 * NULL request, which NCCL retries. A large one
 * (or one larger than the ring) is sent from the caller's buffer, which the plugin references
 * until the receiver acknowledged it: its request completes on that ack (NCCL does not touch a
 * send buffer before test() says done), and a failover resends from that buffer. A copy there
 * cost as much CPU as the kernel's own copy into the socket. */
ncclResult_t ls_isend(void *send_comm, void *data, size_t size, int tag, void **request) {
    ls_comm *c = send_comm;
    *request = NULL;
    if (size > INT_MAX) return ncclInvalidArgument;
    pthread_mutex_lock(&c->lock);
    ncclResult_t rc = c->error;
    int in_ring = ls_cfg.retransmit_bytes && size <= ls_cfg.retransmit_bytes && size < ls_cfg.zerocopy_bytes;
    if (in_ring && !c->ring && ls_cfg.retransmit_bytes && !(c->ring = malloc(ls_cfg.retransmit_bytes)))
        rc = ncclSystemError;
    uint64_t start = in_ring && rc == ncclSuccess ? ring_place(c, size) : 0;
    ls_req *r = rc == ncclSuccess && start != UINT64_MAX && c->next_msg - c->msg_freed < LS_MAX_MSGS ? free_req(c) : NULL;
    if (r) {
        ls_comm *owner = r->comm;
        memset(r, 0, sizeof *r);
        r->comm = owner;
        r->is_send = 1;
        r->used = 1;
        r->size = size;
        ls_msg *m = &c->msgs[c->next_msg++ % LS_MAX_MSGS];
        *m = (ls_msg){.size = size, .tag = tag, .in_ring = in_ring};
        if (in_ring) {
            m->data = c->ring ? c->ring + start % ls_cfg.retransmit_bytes : NULL;
            if (size) memcpy(m->data, data, size);
            if (c->ring_tail == c->ring_head) c->ring_tail = start;
            m->ring_end = c->ring_head = start + size;
        } else {
            m->data = data;
            r->zerocopy = 1;
        }
        m->req = r;
        *request = r;
    }
    /* the new message moves now; a NULL request's retry finds the acks read meanwhile */
    if (!r) c->needs_acks = 1;
    if (rc == ncclSuccess) ls_progress_pass(c, LS_PASS_POST);
    if (c->thread_off_hot && !ls_sender_idle(c, c->active)) { /* data waits: the thread watches again */
        c->thread_off_hot = 0;
        ls_comm_wake(c);
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

ncclResult_t ls_irecv(void *recv_comm, int n, void **data, size_t *sizes, int *tags, void **request) {
    ls_comm *c = recv_comm;
    *request = NULL;
    if (n < 1 || n > LS_MAX_RECVS) return ncclInvalidArgument;
    pthread_mutex_lock(&c->lock);
    ncclResult_t rc = c->error;
    ls_req *old = c->recv_order[c->recv_next % LS_MAX_REQS];
    /* the receive LS_MAX_REQS before this one must be finished: chunks find receives by index */
    int slot_free = !old || !old->used || old->done || old->index != c->recv_next - LS_MAX_REQS;
    ls_req *r = rc == ncclSuccess && slot_free ? free_req(c) : NULL;
    if (r) {
        memset(r, 0, sizeof *r);
        r->comm = c;
        r->used = 1;
        r->n = n;
        r->index = c->recv_next++;
        for (int i = 0; i < n; i++) {
            r->bufs[i] = data[i];
            r->sizes[i] = sizes[i];
            r->tags[i] = tags[i];
        }
        c->recv_order[r->index % LS_MAX_REQS] = r;
        ls_rmatch(c); /* eager chunks already here are copied now; the credits carry the new count */
        /* a receive the eager messages filled needs no credit: the sender takes the receiver's
         * position from the next ack or heartbeat (conn.c on_position), as for a lost credit */
        if (r->ntaken < r->n)
            for (int p = 0; p < c->npaths; p++) ls_queue_credit(c, p, r);
        *request = r;
        ls_progress_pass(c, LS_PASS_POST);
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

ncclResult_t ls_iflush(void *recv_comm, void **request) {
    (void)recv_comm;
    *request = NULL; /* host memory only: nothing to flush */
    return ncclSuccess;
}

/* NCCL calls test() in a tight loop: until the request is done it never waits for the lock (a
 * spinning caller would starve the progress thread); with the lock free it moves data itself,
 * which writes a batch an isend held back. */
ncclResult_t ls_test(void *request, int *done, int *sizes) {
    ls_req *r = request;
    ls_comm *c = r->comm;
    *done = 0;
    if (!__atomic_load_n(&r->done, __ATOMIC_ACQUIRE)) {
        if (pthread_mutex_trylock(&c->lock) == 0) {
            if (r->is_send && r->zerocopy) c->needs_acks = 1; /* it completes on its ack */
            ls_progress_pass(c, LS_PASS_HOT);
            pthread_mutex_unlock(&c->lock);
        }
        if (!__atomic_load_n(&r->done, __ATOMIC_ACQUIRE)) return __atomic_load_n(&c->error, __ATOMIC_ACQUIRE);
    }
    pthread_mutex_lock(&c->lock);
    ncclResult_t rc = ncclSuccess;
    if (r->done) {
        *done = 1;
        if (sizes) {
            if (r->is_send)
                sizes[0] = (int)r->size;
            else
                for (int i = 0; i < r->n; i++) sizes[i] = (int)r->total[i];
        }
        r->used = 0;
        r->done = 0;
    } else {
        rc = c->error;
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

ncclResult_t ls_close_comm(void *comm) {
    ls_comm_free(comm);
    return ncclSuccess;
}

ncclResult_t ls_close_listen(void *listen_comm) {
    ls_listen *l = listen_comm;
    close(l->fd);
    for (int i = 0; i < 16; i++)
        if (l->pending[i] >= 0) close(l->pending[i]);
    free(l);
    return ncclSuccess;
}

ncclResult_t ls_finalize(void *ctx) {
    (void)ctx;
    return ncclSuccess;
}

ncclResult_t ls_set_net_attr(void *ctx, ncclNetAttr_v12_t *attr) {
    (void)ctx;
    (void)attr; /* hints about concurrency: one policy serves them all */
    return ncclSuccess;
}
