/* Connection state and the per-comm progress thread: every socket of a comm is read and
 * written here, with non-blocking I/O, so NCCL's proxy thread only ever takes the comm's lock
 * for a moment (net.c). */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "plugin.h"

#define SEND_FLAGS (MSG_DONTWAIT | MSG_NOSIGNAL)
#define READ_BUDGET (4u << 20) /* bytes per stream per loop, so one busy stream cannot starve the rest */

static void protocol_error(ls_comm *c, ncclResult_t rc, const char *what) {
    if (c->error == ncclSuccess) {
        LS_WARN("%s comm %p: %s", ls_role(c), (void *)c, what);
        __atomic_store_n(&c->error, rc, __ATOMIC_RELEASE); /* test() reads it without the lock */
    }
}

ls_comm *ls_comm_new(int is_send, int dev) {
    ls_comm *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->is_send = is_send;
    c->dev = dev;
    c->device = ls_cfg.devs[dev];
    pthread_mutex_init(&c->lock, NULL);
    c->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    c->netlink_fd = ls_netlink_open();
    c->created_ms = ls_now_ms();
    c->npaths = c->device.nnics;
    for (int p = 0; p < LS_MAX_NICS; p++) {
        ls_path *path = &c->paths[p];
        path->local_nic = p;
        path->nstreams = ls_cfg.streams;
        path->listen_fd = -1;
        path->backoff_ms = ls_cfg.failback_min_ms;
        path->carrier = p < c->npaths ? ls_carrier(c->device.nics[p].name) : 0;
        for (int s = 0; s < LS_MAX_STREAMS; s++) path->streams[s].fd = -1;
    }
    for (size_t i = 0; i < sizeof c->pending_fds / sizeof c->pending_fds[0]; i++) c->pending_fds[i] = -1;
    for (int i = 0; i < LS_MAX_REQS; i++) c->reqs[i].comm = c;
    c->active = 0;
    c->thread_nap_ms = INT_MAX; /* no isend holds data back before the thread has looked */
    return c;
}

void ls_comm_wake(ls_comm *c) {
    uint64_t one = 1;
    ssize_t rc = write(c->wake_fd, &one, sizeof one);
    (void)rc; /* a full counter is already a wake-up */
}

/* ---- control frames ---- */

static int queue_frame(ls_stream *s, const ls_hdr *hp, const void *payload) {
    ls_hdr h = *hp;
    uint32_t len = h.len;
    if (s->fd < 0) return 0;
    if (s->tx_ctrl_off == s->tx_ctrl_len) s->tx_ctrl_off = s->tx_ctrl_len = 0;
    if (s->tx_ctrl_len + sizeof(ls_hdr) + len > sizeof s->tx_ctrl) { /* compact, then give up */
        memmove(s->tx_ctrl, s->tx_ctrl + s->tx_ctrl_off, s->tx_ctrl_len - s->tx_ctrl_off);
        s->tx_ctrl_len -= s->tx_ctrl_off;
        s->tx_ctrl_off = 0;
        if (s->tx_ctrl_len + sizeof(ls_hdr) + len > sizeof s->tx_ctrl) return -1;
    }
    memcpy(s->tx_ctrl + s->tx_ctrl_len, &h, sizeof h);
    if (len) memcpy(s->tx_ctrl + s->tx_ctrl_len + sizeof h, payload, len);
    s->tx_ctrl_len += sizeof h + len;
    return 0;
}

int ls_queue_ctrl(ls_stream *s, uint32_t kind, uint64_t a, uint64_t b, const void *payload, uint32_t len) {
    ls_hdr h = {.type = LS_MAGIC << 16 | kind, .len = len, .a = a, .b = b};
    return queue_frame(s, &h, payload);
}

/* Receiver: the buffers of the receive being filled that its matching gave a message. */
static uint32_t taken_mask(const ls_comm *c) {
    const ls_req *r = c->rrecv < c->recv_next ? c->recv_order[c->rrecv % LS_MAX_REQS] : NULL;
    uint32_t mask = 0;
    if (r && r->used && r->index == c->rrecv)
        for (int j = 0; j < r->n; j++) mask |= (uint32_t)(r->taken[j] != 0) << j;
    return mask;
}

/* Control frames of a path go on its stream 0. A path that cannot take one more has not moved
 * 64 KiB of control frames: it is stuck, and treated as dead so nothing it holds is relied on. */
void ls_queue_on_path(ls_comm *c, int path, uint32_t kind, uint64_t a, const void *payload, uint32_t len) {
    ls_path *p = &c->paths[path];
    if (p->state == LS_PATH_DOWN) return;
    /* a receiver's frames all carry its matching position: how many messages it has matched
     * (that frees eager space), the receive it fills and that receive's buffers taken */
    ls_hdr h = {.type = LS_MAGIC << 16 | kind, .len = len, .a = a};
    if (!c->is_send) {
        h.b = c->rmatched;
        h.c = c->rrecv;
        h.d = taken_mask(c);
    }
    if (queue_frame(&p->streams[0], &h, payload) != 0) ls_path_dead(c, path, "control backlog");
}

void ls_queue_credit(ls_comm *c, int path, const ls_req *r) {
    ls_credit_slot slots[LS_MAX_RECVS];
    memset(slots, 0, sizeof slots);
    for (int i = 0; i < r->n; i++) {
        slots[i].size = r->sizes[i];
        slots[i].tag = r->tags[i];
    }
    ls_queue_on_path(c, path, LS_CREDIT, r->index, slots, (uint32_t)(r->n * (int)sizeof slots[0]));
}

/* ---- streams ---- */

/* A chunk left its stream: written, or the stream closed (a failover sends it again). A ring
 * message's isend is done with its last chunk: its bytes stay in the ring until acknowledged, and
 * a resend comes from there. */
static void chunk_written(ls_comm *c, const ls_chunk *ch) {
    ls_msg *m = &c->msgs[ch->msg % LS_MAX_MSGS];
    m->inflight--;
    if (m->in_ring && m->req && ch->off + ch->len == ch->msg_size) {
        __atomic_store_n(&m->req->done, 1, __ATOMIC_RELEASE);
        m->req = NULL;
    }
    ls_chunk *w = &c->window[ch->seq % LS_WINDOW];
    if (w->seq == ch->seq) w->inflight = 0;
}

/* The eager buffer counts a chunk once however many copies read into it (plugin.h ls_eager). */
static void eager_unref(ls_comm *c, ls_eager *e) {
    if (--e->refs) return;
    c->eager_held -= e->len;
    /* kept for the next eager chunk, within the eager buffer's size: malloc would give large
     * chunks back to the kernel (mmap/trim) and fault fresh zeroed pages in for every one */
    if (!c->stop && c->eager_free_bytes + e->cap <= ls_cfg.eager_bytes) {
        e->next = c->eager_free;
        c->eager_free = e;
        c->eager_free_bytes += e->cap;
        return;
    }
    free(e);
}

/* An eager chunk of `len` bytes: a kept one that fits (and is not more than twice as large), or new. */
static ls_eager *eager_alloc(ls_comm *c, size_t len) {
    for (ls_eager **pe = &c->eager_free; *pe; pe = &(*pe)->next) {
        ls_eager *e = *pe;
        if (e->cap >= len && e->cap <= 2 * len + 4096) {
            *pe = e->next;
            c->eager_free_bytes -= e->cap;
            return e;
        }
    }
    ls_eager *e = malloc(sizeof *e + len);
    if (e) e->cap = len;
    return e;
}

void ls_stream_close(ls_comm *c, ls_stream *s) {
    if (s->fd < 0) return;
    ls_sock_abort(s->fd);
    /* chunks queued or part-written: they are sent again (the receiver drops what it has) */
    for (int i = 0; i < s->tx_n; i++) {
        ls_chunk *ch = &s->tx_chunk[i];
        chunk_written(c, ch);
        if (ch->seq >= c->seq_acked && ch->seq < c->seq_unsent) c->seq_unsent = ch->seq;
    }
    int had = s->tx_n;
    free(s->rx_stage);
    if (s->rx_eager) eager_unref(c, s->rx_eager);
    memset(s, 0, sizeof *s);
    s->fd = -1;
    if (had) ls_msgs_free(c);
}

void ls_stream_open(ls_comm *c, int path, int stream, uint32_t addr, uint16_t port) {
    ls_stream *s = &c->paths[path].streams[stream];
    ls_stream_close(c, s);
    s->fd = ls_sock_connect(&c->device.nics[c->paths[path].local_nic], addr, port);
}

/* Messages leave in order once acknowledged and no stream still writes from them: a ring
 * message gives its space back, a zero-copy one completes its isend. */
void ls_msgs_free(ls_comm *c) {
    while (c->msg_freed < c->next_chunk_msg) {
        ls_msg *m = &c->msgs[c->msg_freed % LS_MAX_MSGS];
        /* kept until the receiver matched it, too: its eager charge and number are still needed */
        if (c->seq_acked <= m->last_seq || m->inflight || c->msg_freed >= c->peer_matched) return;
        if (m->in_ring && m->ring_end > c->ring_tail) c->ring_tail = m->ring_end;
        if (m->req) __atomic_store_n(&m->req->done, 1, __ATOMIC_RELEASE);
        m->req = NULL;
        c->msg_freed++;
    }
    if (c->msg_freed == c->next_msg) c->ring_tail = c->ring_head; /* empty: no padding held */
}

/* The sender matches messages to the receives it was told about (credits), in order, the way
 * the receiver does: a chunk of a matched message names its buffer, so the receiver can place
 * it before it knows the messages ahead of it. */
static int match_credit(ls_comm *c, ls_msg *m) {
    if (c->credit_cur >= c->credits_known) return 0;
    __typeof__(c->credits[0]) *cr = &c->credits[c->credit_cur % (LS_MAX_REQS * 2)];
    int slot = -1;
    for (int j = 0; j < cr->n; j++)
        if (!cr->used[j] && cr->slots[j].tag == m->tag) { slot = j; break; }
    if (slot < 0) {
        protocol_error(c, ncclInvalidUsage, "an isend's tag matches no buffer of the receive posted for it");
        return 0;
    }
    if (m->size > cr->slots[slot].size) {
        protocol_error(c, ncclInvalidUsage, "an isend is larger than the receive buffer posted for it");
        return 0;
    }
    cr->used[slot] = 1;
    m->rindex = (uint32_t)c->credit_cur;
    m->slot = (uint32_t)slot;
    m->matched = 1;
    if (++cr->nused == cr->n) c->credit_cur++;
    return 1;
}

/* Eager: a message whose receive is not known yet is sent anyway while the receiver's eager
 * buffer has room for it (charged whole at its first chunk, until the receiver says it matched
 * it); else it waits for its credit. A message the receiver has matched already (its count can
 * come on another path before the credit) is never charged: its chunks go straight to its
 * buffer there, and a charge made now would never be released. */
static void sender_match(ls_comm *c) {
    while (c->smatched < c->next_msg && match_credit(c, &c->msgs[c->smatched % LS_MAX_MSGS])) c->smatched++;
}

static void make_chunks(ls_comm *c) {
    sender_match(c);
    while (c->next_chunk_msg < c->next_msg && c->seq_next - c->seq_acked < LS_WINDOW) {
        ls_msg *m = &c->msgs[c->next_chunk_msg % LS_MAX_MSGS];
        if (!m->matched && !m->eager && c->next_chunk_msg >= c->peer_matched) {
            uint64_t charge = m->size + LS_EAGER_OVERHEAD;
            if (c->eager_charged + charge > c->peer_eager) return;
            m->eager = 1;
            c->eager_charged += charge;
        }
        size_t len = m->size - m->chunk_off;
        if (len > ls_cfg.chunk_bytes) len = ls_cfg.chunk_bytes;
        ls_chunk *w = &c->window[c->seq_next % LS_WINDOW];
        if (w->inflight) return; /* an older chunk of this slot is still being written */
        *w = (ls_chunk){.seq = c->seq_next, .msg = c->next_chunk_msg, .off = m->chunk_off, .len = len,
                        .msg_size = m->size, .rindex = m->matched ? m->rindex : 0,
                        .slot = m->matched ? m->slot : LS_EAGER, .tag = m->tag};
        m->chunk_off += len;
        m->last_seq = c->seq_next++;
        if (m->chunk_off >= m->size) c->next_chunk_msg++;
    }
}

static int take_chunk(ls_comm *c, ls_stream *s) {
    while (c->seq_unsent < c->seq_next && c->window[c->seq_unsent % LS_WINDOW].inflight) c->seq_unsent++;
    if (c->seq_unsent >= c->seq_next) return 0;
    ls_chunk *w = &c->window[c->seq_unsent % LS_WINDOW];
    if (w->seq < c->seq_acked || w->seq >= c->seq_next) return 0;
    w->inflight = 1;
    c->msgs[w->msg % LS_MAX_MSGS].inflight++;
    int i = s->tx_n++;
    s->tx_chunk[i] = *w;
    s->tx_hdr[i] = (ls_hdr){.type = LS_MAGIC << 16 | LS_DATA, .len = (uint32_t)w->len, .a = w->seq,
                            .b = w->msg_size, .c = w->off, .d = w->rindex, .e = w->slot,
                            .msg = w->msg, .tag = w->tag};
    s->tx_busy = 1;
    c->seq_unsent++;
    return 1;
}

static size_t queued_bytes(const ls_stream *s) {
    size_t n = 0;
    for (int i = 0; i < s->tx_n; i++) n += s->tx_chunk[i].len;
    return n;
}

/* Writes what the stream has with one sendmsg per round: the rest of a part-written data
 * frame, then control frames (a frame boundary), then up to LS_TXQ data frames (connector,
 * active path). Returns -1 when the stream failed (the path is dead then). */
static int stream_write(ls_comm *c, int path, ls_stream *s) {
    ls_path *p = &c->paths[path];
    if (c->is_send && !s->hello_done) {
        int st = ls_sock_connected(s->fd);
        if (st < 0) return -1;
        if (st == 0) return 0;
        ls_hello hello = {.conn_token = c->conn_token, .nnics = (uint32_t)c->npaths};
        int idx = (int)(s - p->streams);
        if (ls_queue_ctrl(s, LS_HELLO, c->listen_token, (uint64_t)path << 32 | (uint32_t)idx, &hello,
                          sizeof hello) != 0)
            return -1;
        s->hello_done = 1;
    }
    for (;;) {
        if (c->is_send && path == c->active && p->state == LS_PATH_UP) /* a bounded share each: the streams take turns */
            while (s->tx_n < LS_TXQ && queued_bytes(s) < 2 * ls_cfg.chunk_bytes && take_chunk(c, s)) {}
        struct iovec iov[2 * LS_TXQ + 2];
        int niov = 0, first = 0;
        if (s->tx_n && s->tx_done) { /* finish the part-written frame first */
            size_t hdr_left = s->tx_done < sizeof(ls_hdr) ? sizeof(ls_hdr) - s->tx_done : 0;
            if (hdr_left) iov[niov++] = (struct iovec){(char *)&s->tx_hdr[0] + s->tx_done, hdr_left};
            size_t pay_done = s->tx_done - (sizeof(ls_hdr) - hdr_left);
            ls_chunk *ch = &s->tx_chunk[0];
            if (ch->len > pay_done)
                iov[niov++] = (struct iovec){c->msgs[ch->msg % LS_MAX_MSGS].data + ch->off + pay_done, ch->len - pay_done};
            first = 1;
        }
        size_t ctrl = s->tx_ctrl_len - s->tx_ctrl_off;
        if (ctrl) iov[niov++] = (struct iovec){s->tx_ctrl + s->tx_ctrl_off, ctrl};
        for (int i = first; i < s->tx_n; i++) {
            ls_chunk *ch = &s->tx_chunk[i];
            iov[niov++] = (struct iovec){&s->tx_hdr[i], sizeof(ls_hdr)};
            if (ch->len) iov[niov++] = (struct iovec){c->msgs[ch->msg % LS_MAX_MSGS].data + ch->off, ch->len};
        }
        if (!niov) return 0;
        size_t total = 0;
        for (int i = 0; i < niov; i++) total += iov[i].iov_len;
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)niov};
        ssize_t sent = sendmsg(s->fd, &mh, SEND_FLAGS);
        if (sent < 0) return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
        size_t n = (size_t)sent;
        int done_frames = 0;
        if (first) { /* the part-written frame */
            size_t left = sizeof(ls_hdr) + s->tx_chunk[0].len - s->tx_done;
            size_t take = n < left ? n : left;
            s->tx_done += take;
            n -= take;
            if (take == left) done_frames = 1, s->tx_done = 0;
        }
        if (!first || done_frames) { /* then the control frames */
            size_t take = n < ctrl ? n : ctrl;
            s->tx_ctrl_off += take;
            n -= take;
            if (s->tx_ctrl_off == s->tx_ctrl_len) s->tx_ctrl_off = s->tx_ctrl_len = 0;
        }
        for (int i = done_frames; i < s->tx_n && n; i++) { /* then whole data frames */
            size_t frame = sizeof(ls_hdr) + s->tx_chunk[i].len;
            if (n >= frame) {
                n -= frame;
                done_frames = i + 1;
            } else {
                s->tx_done = n;
                n = 0;
            }
        }
        for (int i = 0; i < done_frames; i++) chunk_written(c, &s->tx_chunk[i]);
        if (done_frames) {
            memmove(s->tx_chunk, s->tx_chunk + done_frames, (size_t)(s->tx_n - done_frames) * sizeof s->tx_chunk[0]);
            memmove(s->tx_hdr, s->tx_hdr + done_frames, (size_t)(s->tx_n - done_frames) * sizeof s->tx_hdr[0]);
            s->tx_n -= done_frames;
            s->tx_busy = s->tx_n > 0;
            ls_msgs_free(c);
        }
        if ((size_t)sent < total) return 0; /* the socket is full */
    }
}

/* ---- receiving ---- */

static int seen_bit(const ls_comm *c, uint64_t seq) { return c->seen_bits[(seq % LS_WINDOW) / 8] >> (seq % 8) & 1; }

static void req_check_done(ls_req *r) {
    int done = 1;
    for (int i = 0; i < r->n; i++) done &= r->seen[i] && r->got[i] == r->total[i];
    if (done) __atomic_store_n(&r->done, 1, __ATOMIC_RELEASE);
}

static void seq_received(ls_comm *c, uint64_t seq) {
    c->seen_bits[(seq % LS_WINDOW) / 8] |= (uint8_t)(1u << (seq % 8));
    while (seen_bit(c, c->cum)) {
        c->seen_bits[(c->cum % LS_WINDOW) / 8] &= (uint8_t)~(1u << (c->cum % 8));
        c->cum++;
    }
    /* Another stream part-way through a copy of this chunk must not write into the buffer any
     * more: NCCL may reuse it as soon as the receive is done. */
    for (int p = 0; p < c->npaths; p++)
        for (int s = 0; s < LS_MAX_STREAMS; s++) {
            ls_stream *o = &c->paths[p].streams[s];
            if (o->fd >= 0 && o->rx_in_payload && !o->rx_discard && o->rx_hdr.a == seq) {
                o->rx_discard = 1;
                o->rx_dest = NULL;
                if (o->rx_eager) eager_unref(c, o->rx_eager);
                o->rx_eager = NULL;
                c->dup_chunks++;
            }
        }
}

static void place_eager(ls_comm *c, ls_req *r, int slot, ls_eager *e) {
    if (e->len) memcpy((char *)r->bufs[slot] + e->off, e->data, e->len);
    r->got[slot] += e->len;
    eager_unref(c, e);
}

/* Messages are matched in message order to posted receives in posting order (a receive's
 * buffers by tag), exactly as the sender matches them to credits; a message's eager chunks are
 * copied into its buffer then. */
void ls_rmatch(ls_comm *c) {
    while (!c->error && c->rrecv < c->recv_next) {
        uint64_t k = c->rmatched;
        __typeof__(c->rmsgs[0]) *rm = &c->rmsgs[k % LS_MAX_MSGS];
        if (rm->msg1 != k + 1) return;
        ls_req *r = c->recv_order[c->rrecv % LS_MAX_REQS];
        if (!r || !r->used || r->index != c->rrecv) return protocol_error(c, ncclInternalError, "the matched receive is gone");
        int slot = -1;
        for (int j = 0; j < r->n; j++)
            if (!r->taken[j] && r->tags[j] == rm->tag) { slot = j; break; }
        if (slot < 0) return protocol_error(c, ncclInvalidUsage, "a message's tag matches no buffer of the receive posted for it");
        if (rm->size > r->sizes[slot]) return protocol_error(c, ncclInvalidUsage, "a message larger than its receive buffer");
        r->taken[slot] = 1;
        if (++r->ntaken == r->n) c->rrecv++;
        rm->req = r;
        rm->slot = slot;
        r->total[slot] = rm->size;
        r->seen[slot] = 1;
        for (ls_eager *e = rm->head, *next; e; e = next) {
            next = e->next;
            place_eager(c, r, slot, e);
        }
        rm->head = NULL;
        /* a chunk of it still being read goes on into the buffer (the sender frees its charge
         * once told of the match, so nothing of it may stay in the eager buffer) */
        for (int p = 0; p < c->npaths; p++)
            for (int s = 0; s < LS_MAX_STREAMS; s++) {
                ls_stream *o = &c->paths[p].streams[s];
                ls_eager *e = o->rx_eager;
                if (o->fd < 0 || !e || o->rx_hdr.msg != k) continue;
                o->rx_dest = (char *)r->bufs[slot] + e->off;
                if (o->rx_payload_got) memcpy(o->rx_dest, e->data, o->rx_payload_got); /* what this copy read */
                o->rx_eager = NULL;
                eager_unref(c, e);
            }
        c->rmatched++;
        req_check_done(r);
    }
}

/* Another stream's copy of chunk `seq` being read into the eager buffer, if any. */
static ls_eager *eager_being_read(ls_comm *c, uint64_t seq) {
    for (int p = 0; p < c->npaths; p++)
        for (int s = 0; s < LS_MAX_STREAMS; s++) {
            ls_stream *o = &c->paths[p].streams[s];
            if (o->fd >= 0 && o->rx_in_payload && o->rx_eager && o->rx_eager->seq == seq) return o->rx_eager;
        }
    return NULL;
}

static void on_data_header(ls_comm *c, ls_stream *s) {
    ls_hdr *h = &s->rx_hdr;
    uint64_t seq = h->a, k = h->msg;
    s->rx_discard = 1;
    s->rx_dest = NULL;
    if (seq < c->cum || (seq < c->cum + LS_WINDOW && seen_bit(c, seq))) {
        c->dup_chunks++;
        c->ack_now = 1; /* a resend whose ack was lost: without a new one the sender never frees it */
        return;
    }
    if (seq >= c->cum + LS_WINDOW) return protocol_error(c, ncclInternalError, "a chunk beyond the window");
    if (h->b > INT_MAX || h->c > h->b || h->len > h->b - h->c) return protocol_error(c, ncclInternalError, "a bad chunk");
    if (k >= c->rmatched + LS_MAX_MSGS) return protocol_error(c, ncclInternalError, "a chunk beyond the message window");
    ls_req *r = NULL;
    uint32_t slot = 0;
    if (h->e != LS_EAGER) { /* the sender matched it: its buffer is named */
        r = c->recv_order[h->d % LS_MAX_REQS];
        slot = h->e;
        if (!r || !r->used || r->index != h->d || slot >= (uint32_t)r->n)
            return protocol_error(c, ncclInternalError, "a chunk for a receive that was not posted");
        if (h->b > r->sizes[slot]) return protocol_error(c, ncclInvalidUsage, "a message larger than its receive buffer");
    } else if (k < c->rmatched) {
        r = c->rmsgs[k % LS_MAX_MSGS].req;
        slot = (uint32_t)c->rmsgs[k % LS_MAX_MSGS].slot;
        if (c->rmsgs[k % LS_MAX_MSGS].msg1 != k + 1 || !r || !r->used)
            return protocol_error(c, ncclInternalError, "a chunk for a message already done");
    }
    if (r) {
        s->rx_discard = 0;
        s->rx_dest = (char *)r->bufs[slot] + h->c;
        return;
    }
    ls_eager *e = eager_being_read(c, seq);
    if (e) {
        e->refs++; /* the same bytes at the same places: one copy in the buffer */
    } else {
        if (c->eager_held + h->len > ls_cfg.eager_bytes)
            return protocol_error(c, ncclInternalError, "the sender overran the eager buffer");
        if (!(e = eager_alloc(c, h->len))) return protocol_error(c, ncclSystemError, "out of memory for an eager chunk");
        *e = (ls_eager){.seq = seq, .off = h->c, .len = h->len, .cap = e->cap, .refs = 1};
        c->eager_held += h->len;
    }
    s->rx_eager = e;
    s->rx_discard = 0;
    s->rx_dest = e->data;
}

static void on_data_end(ls_comm *c, ls_stream *s) {
    ls_hdr *h = &s->rx_hdr;
    if (s->rx_discard) return;
    uint64_t k = h->msg;
    seq_received(c, h->a);
    c->unacked_bytes += h->len;
    __typeof__(c->rmsgs[0]) *rm = &c->rmsgs[k % LS_MAX_MSGS];
    if (rm->msg1 != k + 1) {
        rm->msg1 = k + 1;
        rm->tag = h->tag;
        rm->size = h->b;
        rm->head = NULL;
        rm->req = NULL;
    }
    ls_eager *e = s->rx_eager; /* (a message matched while its chunk was read was moved to its buffer) */
    s->rx_eager = NULL;
    if (e) {
        e->next = rm->head;
        rm->head = e;
    } else {
        ls_req *r = h->e != LS_EAGER ? c->recv_order[h->d % LS_MAX_REQS] : rm->req;
        int slot = h->e != LS_EAGER ? (int)h->e : rm->slot;
        r->got[slot] += h->len;
        r->total[slot] = h->b;
        r->seen[slot] = 1;
        req_check_done(r);
    }
    ls_rmatch(c);
}

/* The receiver matched messages up to `matched`: their eager charges are free again. */
static void on_matched(ls_comm *c, uint64_t matched) {
    if (matched > c->next_chunk_msg + 1 || matched > c->next_msg)
        return protocol_error(c, ncclInternalError, "a match count beyond what was sent");
    while (c->peer_matched < matched) {
        ls_msg *m = &c->msgs[c->peer_matched % LS_MAX_MSGS];
        if (m->eager) c->eager_charged -= m->size + LS_EAGER_OVERHEAD;
        m->eager = 0;
        c->peer_matched++;
    }
    ls_msgs_free(c);
}

static void on_ack(ls_comm *c, uint64_t cum) {
    if (cum > c->seq_next) return protocol_error(c, ncclInternalError, "an ack beyond what was sent");
    if (cum <= c->seq_acked) return;
    c->seq_acked = cum;
    uint64_t now = ls_now_ms();
    if (c->ack_before_failover_ms) { /* the first data acknowledged since the failover */
        char data[256];
        snprintf(data, sizeof data,
                 "{\"comm\":\"%p\",\"role\":\"send\",\"device\":%d,\"nic\":\"%s\",\"state\":\"carrying\","
                 "\"failover_ms\":%llu,\"since_fault_ms\":%llu}",
                 (void *)c, c->dev, c->active >= 0 ? c->device.nics[c->paths[c->active].local_nic].name : "none",
                 (unsigned long long)(now - c->ack_before_failover_ms),
                 (unsigned long long)(now - c->failover_started_ms));
        ls_event("nccl.path_state", data);
        c->ack_before_failover_ms = 0;
    }
    c->last_ack_ms = now;
    if (c->seq_unsent < cum) c->seq_unsent = cum;
    ls_msgs_free(c);
}

/* A receive whose buffers the receiver's position named before its credit came. */
static void apply_resync(ls_comm *c) {
    __typeof__(c->credits[0]) *cr = &c->credits[c->resync_index % (LS_MAX_REQS * 2)];
    if (!c->resync_pending || cr->index1 != c->resync_index + 1) return;
    for (int j = 0; j < cr->n; j++)
        if (c->resync_taken >> j & 1 && !cr->used[j]) {
            cr->used[j] = 1;
            cr->nused++;
        }
    c->resync_pending = 0;
}

static void on_credit(ls_comm *c, const ls_hdr *h, const char *payload) {
    uint64_t k = h->a;
    if (k < c->credit_cur) return; /* used already, or passed by the receiver's position */
    if (k >= c->credit_cur + LS_MAX_REQS * 2)
        return protocol_error(c, ncclInternalError, "more receives posted than the plugin allows");
    __typeof__(c->credits[0]) *cr = &c->credits[k % (LS_MAX_REQS * 2)];
    if (cr->index1 == k + 1) return; /* a replay over another path, already known */
    int n = (int)(h->len / sizeof(ls_credit_slot));
    if (n < 1 || n > LS_MAX_RECVS) return protocol_error(c, ncclInternalError, "a credit with a bad count");
    memset(cr, 0, sizeof *cr);
    cr->index1 = k + 1;
    cr->n = n;
    memcpy(cr->slots, payload, (size_t)n * sizeof(ls_credit_slot));
    apply_resync(c);
    while (c->credits[c->credits_known % (LS_MAX_REQS * 2)].index1 == c->credits_known + 1) c->credits_known++;
    /* at once: receives of eagerly sent messages complete at once, so their credits come fast */
    sender_match(c);
}

/* The receiver's matching position (every frame of it carries one: plugin.h ls_hdr). Ahead of
 * the sender's own matching, it is taken over: the receiver matched messages sent eagerly
 * whose credits the sender does not have, maybe never will (lost with a path, their receives
 * done since, so no replay brings them back); waiting for them in order would stop every
 * message too large for the eager buffer for good. */
static void on_position(ls_comm *c, uint64_t matched, uint64_t rrecv, uint32_t taken) {
    if (matched <= c->smatched) return;
    if (rrecv < c->credit_cur) return protocol_error(c, ncclInternalError, "a receiver position behind the sender's");
    c->smatched = matched;
    c->credit_cur = rrecv;
    if (c->credits_known < rrecv) c->credits_known = rrecv;
    c->resync_pending = 1;
    c->resync_index = rrecv;
    c->resync_taken = taken;
    apply_resync(c);
    while (c->credits[c->credits_known % (LS_MAX_REQS * 2)].index1 == c->credits_known + 1) c->credits_known++;
    sender_match(c);
}

static void on_hello_ack(ls_comm *c, const ls_hdr *h, const char *payload) {
    if (c->established || h->len != sizeof(ls_hello_ack)) return;
    ls_hello_ack ack;
    memcpy(&ack, payload, sizeof ack);
    if (ack.nnics < 1 || ack.nnics > LS_MAX_NICS) return protocol_error(c, ncclInternalError, "a bad HELLO_ACK");
    for (int p = 0; p < c->npaths; p++) {
        ls_wire_addr *l = &ack.listeners[(uint32_t)p % ack.nnics];
        c->paths[p].peer_addr = l->addr;
        c->paths[p].peer_port = l->port;
    }
    c->peer_eager = ack.eager_bytes;
    c->established = 1;
    for (int s = 1; s < c->paths[0].nstreams; s++) /* the rest of the primary's streams */
        ls_stream_open(c, 0, s, c->paths[0].peer_addr, c->paths[0].peer_port);
    for (int p = 1; p < c->npaths; p++) c->paths[p].retry_at_ms = 0; /* standbys connect now */
}

/* A whole frame arrived (its payload, for control frames, in rx_small). */
static void on_frame(ls_comm *c, int path, ls_stream *s) {
    ls_hdr *h = &s->rx_hdr;
    uint32_t kind = h->type & 0xffff;
    if (c->is_send && c->paths[path].state == LS_PATH_CONNECTING && s == &c->paths[path].streams[0])
        ls_path_up(c, path);
    switch (kind) {
    case LS_DATA: on_data_end(c, s); break;
    case LS_ACK:
    case LS_HEARTBEAT:
    case LS_CREDIT:
        if (!c->is_send) break;
        if (kind != LS_CREDIT) on_ack(c, h->a);
        if (!c->error) on_matched(c, h->b);
        if (!c->error) on_position(c, h->b, h->c, h->d);
        if (!c->error && kind == LS_CREDIT) on_credit(c, h, s->rx_small);
        break;
    case LS_HELLO_ACK: if (c->is_send) on_hello_ack(c, h, s->rx_small); break;
    default: protocol_error(c, ncclInternalError, "an unknown frame");
    }
}

/* A frame's header is complete: sets up where its payload goes. -1: the stream must close. */
static int begin_frame(ls_comm *c, int path, ls_stream *s) {
    if (s->rx_hdr.type >> 16 != LS_MAGIC) {
        protocol_error(c, ncclInternalError, "a frame without the plugin's magic");
        return -1;
    }
    uint32_t kind = s->rx_hdr.type & 0xffff;
    s->rx_in_payload = 1;
    s->rx_left = s->rx_hdr.len;
    s->rx_payload_got = 0;
    s->rx_dest = NULL;
    if (kind == LS_DATA) {
        if (c->is_send) return -1;
        c->ack_path = path;
        on_data_header(c, s);
        if (c->error) return -1;
    } else if (s->rx_hdr.len > sizeof s->rx_small) {
        protocol_error(c, ncclInternalError, "a control frame too long");
        return -1;
    }
    return 0;
}

/* Where the next payload bytes go: the posted buffer, the control buffer, or nowhere (NULL). */
static char *payload_dest(ls_stream *s) {
    if ((s->rx_hdr.type & 0xffff) != LS_DATA) return s->rx_small + s->rx_payload_got;
    return s->rx_dest ? s->rx_dest + s->rx_payload_got : NULL;
}

/* Reads what the stream has: into the stage (many small frames per recv, their payloads copied
 * out), or straight into the posted buffer for the rest of a long payload. Returns -1 when the
 * stream failed or the peer closed it. */
static int stream_read(ls_comm *c, int path, ls_stream *s) {
    if (!s->rx_stage && !(s->rx_stage = malloc(LS_RX_STAGE))) {
        protocol_error(c, ncclSystemError, "out of memory for a read buffer");
        return -1;
    }
    size_t budget = READ_BUDGET;
    int drained = 0; /* the last recv got less than it asked for: the socket is (very likely) empty */
    for (;;) {
        while (s->rx_stage_off < s->rx_stage_len || (s->rx_in_payload && !s->rx_left)) {
            const char *src = s->rx_stage + s->rx_stage_off;
            size_t avail = s->rx_stage_len - s->rx_stage_off;
            if (!s->rx_in_payload) {
                size_t take = sizeof s->rx_hdr - s->rx_hdr_got;
                if (take > avail) take = avail;
                memcpy((char *)&s->rx_hdr + s->rx_hdr_got, src, take);
                s->rx_stage_off += take;
                s->rx_hdr_got += take;
                if (s->rx_hdr_got < sizeof s->rx_hdr) break;
                s->rx_hdr_got = 0;
                if (begin_frame(c, path, s) != 0) return -1;
                continue;
            }
            size_t take = s->rx_left < avail ? s->rx_left : avail;
            char *dst = payload_dest(s);
            if (dst && take) memcpy(dst, src, take);
            s->rx_stage_off += take;
            s->rx_left -= take;
            s->rx_payload_got += take;
            if (s->rx_left) break;
            s->rx_in_payload = 0;
            on_frame(c, path, s);
            if (c->error || s->fd < 0) return c->error ? -1 : 0;
        }
        if (!budget || drained) return 0; /* saves the recv that would only say EAGAIN */
        ssize_t n;
        size_t want;
        char *dst = s->rx_in_payload ? payload_dest(s) : NULL;
        if (dst && (s->rx_hdr.type & 0xffff) == LS_DATA && s->rx_left >= LS_RX_STAGE / 2) {
            want = s->rx_left < budget ? s->rx_left : budget;
            n = recv(s->fd, dst, want, MSG_DONTWAIT);
            if (n > 0) {
                s->rx_left -= (size_t)n;
                s->rx_payload_got += (size_t)n;
            }
        } else {
            s->rx_stage_off = s->rx_stage_len = 0;
            want = LS_RX_STAGE;
            n = recv(s->fd, s->rx_stage, want, MSG_DONTWAIT);
            if (n > 0) s->rx_stage_len = (size_t)n;
        }
        drained = n > 0 && (size_t)n < want;
        if (n == 0) return -1;
        if (n < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
            s->rx_empty_us = ls_now_us();
            return 0;
        }
        s->rx_empty_us = drained ? ls_now_us() : 0;
        c->paths[path].last_rx_ms = ls_now_ms();
        budget -= (size_t)n < budget ? (size_t)n : budget;
    }
}

/* ---- the acceptor's listeners: later streams and paths of this connection ---- */

static void attach_stream(ls_comm *c, int fd, const ls_hdr *h, const ls_hello *hello) {
    uint32_t path = (uint32_t)(h->b >> 32), stream = (uint32_t)h->b;
    if (hello->conn_token != c->conn_token || path >= (uint32_t)c->npaths || stream >= LS_MAX_STREAMS) {
        close(fd);
        return;
    }
    ls_path *p = &c->paths[path];
    ls_stream_close(c, &p->streams[stream]); /* the connector replaced it */
    p->streams[stream].fd = fd;
    if (p->nstreams < (int)stream + 1) p->nstreams = (int)stream + 1;
    p->last_rx_ms = ls_now_ms();
    if (stream == 0) {
        if (p->state != LS_PATH_UP) ls_path_up(c, (int)path);
        /* answer at once (the connector waits for it to call the path up), and replay every
         * receive still open so the connector can rely on this path alone */
        ls_queue_on_path(c, (int)path, LS_HEARTBEAT, c->cum, NULL, 0);
        for (uint64_t k = c->recv_next > LS_MAX_REQS ? c->recv_next - LS_MAX_REQS : 0; k < c->recv_next; k++) {
            ls_req *r = c->recv_order[k % LS_MAX_REQS];
            if (r && r->used && r->index == k && !r->done) ls_queue_credit(c, (int)path, r);
        }
    }
}

static void poll_pending(ls_comm *c, uint64_t now) {
    for (size_t i = 0; i < sizeof c->pending_fds / sizeof c->pending_fds[0]; i++) {
        int fd = c->pending_fds[i];
        if (fd < 0) continue;
        char buf[sizeof(ls_hdr) + sizeof(ls_hello)];
        ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT | MSG_PEEK);
        if (n == (ssize_t)sizeof buf) {
            n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
            ls_hdr h;
            ls_hello hello;
            memcpy(&h, buf, sizeof h);
            memcpy(&hello, buf + sizeof h, sizeof hello);
            c->pending_fds[i] = -1;
            if (n == (ssize_t)sizeof buf && h.type == (LS_MAGIC << 16 | LS_HELLO) && h.len == sizeof hello &&
                h.a == c->listen_token)
                attach_stream(c, fd, &h, &hello);
            else
                close(fd);
        } else if (n == 0 || (n < 0 && errno != EAGAIN) ||
                   now - c->pending_since_ms[i] > (uint64_t)ls_cfg.connect_timeout_ms) {
            close(fd);
            c->pending_fds[i] = -1;
        }
    }
}

static void accept_on(ls_comm *c, int lfd, uint64_t now) {
    for (;;) {
        int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return;
        size_t i = 0;
        while (i < sizeof c->pending_fds / sizeof c->pending_fds[0] && c->pending_fds[i] >= 0) i++;
        if (i == sizeof c->pending_fds / sizeof c->pending_fds[0]) {
            close(fd);
            continue;
        }
        c->pending_fds[i] = fd;
        c->pending_since_ms[i] = now;
    }
}

/* The path data moves on: the sender's active one, where the receiver last got data. */
static int hot_path(const ls_comm *c) { return c->is_send ? c->active : c->ack_path; }

/* One round of non-blocking I/O: read what arrived, cut chunks, write what can be written,
 * acknowledge. NCCL's own calls (isend/irecv/test, `LS_PASS_HOT`) do it on the path data moves
 * on only, which saves a thread wake-up per message and the syscalls on idle standbys; the
 * progress thread does the rest (`LS_PASS_COLD` while NCCL keeps calling, else `LS_PASS_ALL`). */
/* Whether this pass leaves a stream unread. The progress thread reads only what its poll said
 * is readable (a stream it did not watch, or one just opened, it reads). NCCL's calls do not
 * re-read a socket found empty within LS_EMPTY_RETRY_US: an isend or irecv needs nothing from
 * it (the sender's LS_SENDER_READ_US timer excepted), and a spinning test() reads stream 0 each
 * time (its latency) but the other streams, which carry data only while stream 0's socket is
 * full, no more often than that. */
static int skip_read(const ls_stream *st, int which, int s, uint64_t now_us, int timer_due) {
    if (st->rx_stage_off < st->rx_stage_len) return 0; /* bytes read ahead, not parsed yet */
    if (which == LS_PASS_ALL || which == LS_PASS_COLD) return st->thread_polled && !st->thread_ready;
    if (!st->rx_empty_us || now_us - st->rx_empty_us >= LS_EMPTY_RETRY_US) return 0;
    return which == LS_PASS_POST ? !timer_due : s > 0;
}

/* Whether an isend leaves the chunks cut and not yet written for later, to go with the next
 * ones in one sendmsg (a test() on a send not done writes them; so does the progress thread on
 * its next look): while they are fewer than LS_TXQ frames and LS_CORK_BYTES, all of ring
 * messages (a zero-copy one completes on its ack: it goes at once), nothing else waits on the
 * active path (a part-written frame, control frames) and the thread's poll is short, so it looks
 * within ~1 ms. After a pause it sleeps longer, and an isend writes at once. */
static int hold_batch(const ls_comm *c, int hot) {
    if (hot < 0 || c->paths[hot].state != LS_PATH_UP || c->thread_nap_ms > 1) return 0;
    uint64_t n = c->seq_next - c->seq_unsent;
    if (!n || n >= LS_TXQ) return 0;
    for (int s = 0; s < LS_MAX_STREAMS; s++) {
        const ls_stream *st = &c->paths[hot].streams[s];
        if (st->fd >= 0 && (st->tx_busy || st->tx_ctrl_off < st->tx_ctrl_len)) return 0;
    }
    size_t bytes = 0;
    for (uint64_t q = c->seq_unsent; q < c->seq_next; q++) {
        const ls_chunk *w = &c->window[q % LS_WINDOW];
        if (!c->msgs[w->msg % LS_MAX_MSGS].in_ring) return 0;
        bytes += w->len;
    }
    return bytes < LS_CORK_BYTES;
}

void ls_progress_pass(ls_comm *c, int which) {
    uint64_t now_us = ls_now_us();
    int caller = which == LS_PASS_HOT || which == LS_PASS_POST;
    if (caller) __atomic_store_n(&c->caller_pass_us, now_us, __ATOMIC_RELAXED); /* the thread reads it unlocked */
    int hot = hot_path(c);
#define SKIP_PATH(p) ((caller && (p) != hot) || (which == LS_PASS_COLD && (p) == hot))
    /* A sender's isend reads its active path (acks and credits) only when it needs them: its
     * message cannot be cut yet, its ring or table is full (`needs_acks`), or the path was not
     * read for LS_SENDER_READ_US (liveness, ring space): a recv that mostly says EAGAIN per
     * message is the sender's largest per-message cost after its sendmsg. */
    int read_hot = 1, timer_due = now_us - c->hot_read_us >= LS_SENDER_READ_US, refused = c->needs_acks;
    if (c->is_send && caller) {
        make_chunks(c);
        read_hot = c->needs_acks || c->next_chunk_msg < c->next_msg || timer_due;
        c->needs_acks = 0;
    }
    if (read_hot && which != LS_PASS_COLD) c->hot_read_us = now_us;
    /* a receiver writes only on stream 0 of a path (ls_queue_on_path): a sender's own calls read
     * no other stream (their failures show on the next write, or in the progress thread's reads) */
    int streams = c->is_send && caller ? 1 : LS_MAX_STREAMS;
    for (int p = 0; p < c->npaths && !c->error; p++)
        for (int s = 0; s < streams && !SKIP_PATH(p) && (read_hot || p != hot); s++) {
            ls_stream *st = &c->paths[p].streams[s];
            if (st->fd >= 0 && (!c->is_send || st->hello_done) && !skip_read(st, which, s, now_us, timer_due) &&
                stream_read(c, p, st) != 0) {
                if (ls_cfg.debug) LS_INFO("stream %d of path %d: read failed: %s", s, p, strerror(errno));
                if (!c->error) ls_path_dead(c, p, "socket closed or failed");
                break;
            }
        }
    if (c->is_send) make_chunks(c);
    /* write everything that can be written (cheap when nothing is ready), but an isend may hold a
     * small batch back (hold_batch; not the retry of a refused one), and the thread, which leaves
     * the hot path to NCCL's calls, still writes what an isend held */
    int hold = which == LS_PASS_POST && c->is_send && !refused && hold_batch(c, hot);
    int flush = which == LS_PASS_COLD && c->held;
#define SKIP_WRITE(p) ((p) == hot ? hold || (which == LS_PASS_COLD && !flush) : caller)
    for (int p = 0; p < c->npaths && !c->error; p++)
        for (int s = 0; s < LS_MAX_STREAMS && !SKIP_WRITE(p); s++) {
            ls_stream *st = &c->paths[p].streams[s];
            if (st->fd >= 0 && stream_write(c, p, st) != 0) {
                if (ls_cfg.debug) LS_INFO("stream %d of path %d: write failed: %s", s, p, strerror(errno));
                ls_path_dead(c, p, "socket closed or failed");
                break;
            }
        }
    if (hold)
        c->held = 1;
    else if (hot >= 0 && !SKIP_WRITE(hot))
        c->held = 0; /* what was held went (or waits for socket space, which the thread watches) */
#undef SKIP_WRITE
#undef SKIP_PATH
    if (!c->is_send) ls_ack(c, 0);
}

/* Cumulative acks, batched: at once after a duplicate, else every LS_ACK_CHUNKS chunks,
 * LS_ACK_BYTES or LS_ACK_US (they free the sender's ring and complete its zero-copy isends, so
 * a large transfer is acknowledged while it streams), and whenever `flush`.
 * They go where data last arrived; heartbeats carry the same ack on every path. */
void ls_ack(ls_comm *c, int flush) {
    uint64_t now = ls_now_us();
    if (!c->ack_now && ((c->cum == c->acked_sent && c->rmatched == c->rmatched_sent) ||
                        (!flush && c->cum - c->acked_sent < LS_ACK_CHUNKS && c->unacked_bytes < LS_ACK_BYTES &&
                         now - c->acked_sent_us < LS_ACK_US)))
        return;
    int p = c->ack_path;
    if (c->paths[p].state != LS_PATH_UP) p = 0;
    while (p < c->npaths && c->paths[p].state != LS_PATH_UP) p++;
    if (p == c->npaths) return;
    ls_queue_on_path(c, p, LS_ACK, c->cum, NULL, 0);
    c->acked_sent = c->cum;
    c->rmatched_sent = c->rmatched;
    c->acked_sent_us = now;
    c->unacked_bytes = 0;
    c->ack_now = 0;
    if (c->paths[p].streams[0].fd >= 0 && stream_write(c, p, &c->paths[p].streams[0]) != 0)
        ls_path_dead(c, p, "socket closed or failed");
}

/* ---- the loop ---- */

/* A sender with nothing left to cut or write: what its active path brings now is acks, which
 * only free ring space, and NCCL's next isend reads them itself. Chunks an isend holds back for
 * a batch count as nothing: a test() writes them, or the thread on its next (1 ms) look. */
int ls_sender_idle(const ls_comm *c, int hot) {
    if (hot < 0 || c->next_chunk_msg < c->next_msg || (c->seq_unsent < c->seq_next && !c->held)) return 0;
    for (int s = 0; s < LS_MAX_STREAMS; s++) {
        const ls_stream *st = &c->paths[hot].streams[s];
        if (st->fd >= 0 && (st->tx_busy || st->tx_ctrl_off < st->tx_ctrl_len)) return 0;
    }
    return 1;
}

enum { W_WAKE, W_NETLINK, W_LISTEN, W_PENDING, W_STREAM };
#define MAX_PFD (2 + LS_MAX_NICS + LS_MAX_NICS * LS_MAX_STREAMS * 2)

/* The thread takes the lock back after its poll. While NCCL's calls drive the comm (one within
 * LS_CALLER_HOT_US) it does not queue behind them — each such hand-off is a futex wait on one side
 * and a wake on the other, per message — but only tries, and otherwise waits on its wake-up
 * descriptor for 1 ms and looks again; it blocks on the lock at once for what only it handles
 * (a wake-up, netlink, a listener or a pending stream said something) and once its tick (the
 * heartbeats, the liveness check) is LS_THREAD_DEFER_MS late: detection is not delayed by more. */
#define LS_THREAD_DEFER_MS 5
static void thread_lock(ls_comm *c, const struct pollfd *pfd, int n, const int *kind) {
    for (int i = 0; i < n; i++)
        if (pfd[i].revents && kind[i] != W_STREAM) goto block;
    for (uint64_t since = ls_now_ms();;) {
        if (ls_now_us() - __atomic_load_n(&c->caller_pass_us, __ATOMIC_RELAXED) >= LS_CALLER_HOT_US) break;
        if (ls_now_ms() - since >= LS_THREAD_DEFER_MS) break;
        if (pthread_mutex_trylock(&c->lock) == 0) return;
        struct pollfd w = {.fd = c->wake_fd, .events = POLLIN};
        if (poll(&w, 1, 1) > 0) break;
    }
block:
    pthread_mutex_lock(&c->lock);
}

static void *progress(void *arg) {
    ls_comm *c = arg;
    struct pollfd pfd[MAX_PFD];
    struct { int path, stream; } what[MAX_PFD];
    int kind[MAX_PFD];
    pthread_mutex_lock(&c->lock);
    while (!c->stop) {
        int n = 0;
        pfd[n] = (struct pollfd){.fd = c->wake_fd, .events = POLLIN};
        kind[n++] = W_WAKE;
        if (c->netlink_fd >= 0) {
            pfd[n] = (struct pollfd){.fd = c->netlink_fd, .events = POLLIN};
            kind[n++] = W_NETLINK;
        }
        /* While NCCL keeps calling test() on receives it moves the data itself; the thread then
         * stays off that path (no lock hand-offs per message) and keeps time and the standbys.
         * A sender's thread leaves the active path to NCCL's isends and tests only while nothing
         * waits there but a batch an isend held back (hold_batch), which it writes after its
         * short poll: data that waits for eager room, credits or socket space it moves itself. */
        int hot = hot_path(c);
        int caller_driving = ls_now_us() - __atomic_load_n(&c->caller_pass_us, __ATOMIC_RELAXED) < 2000 && (!c->is_send || ls_sender_idle(c, hot));
        int any_pending = 0;
        for (int p = 0; p < c->npaths; p++) {
            if (c->paths[p].listen_fd >= 0) {
                pfd[n] = (struct pollfd){.fd = c->paths[p].listen_fd, .events = POLLIN};
                kind[n] = W_LISTEN;
                what[n++].path = p;
            }
            for (int s = 0; s < LS_MAX_STREAMS; s++) {
                ls_stream *st = &c->paths[p].streams[s];
                st->thread_polled = 0;
                if (st->fd < 0 || (caller_driving && p == hot)) continue;
                st->thread_polled = 1;
                short ev = POLLIN;
                if ((c->is_send && !st->hello_done) || st->tx_busy || st->tx_ctrl_off < st->tx_ctrl_len ||
                    (c->is_send && p == c->active && c->seq_unsent < c->seq_next))
                    ev |= POLLOUT;
                pfd[n] = (struct pollfd){.fd = st->fd, .events = ev};
                kind[n] = W_STREAM;
                what[n].path = p;
                what[n++].stream = s;
            }
        }
        for (size_t i = 0; i < sizeof c->pending_fds / sizeof c->pending_fds[0]; i++)
            if (c->pending_fds[i] >= 0 && n < MAX_PFD) {
                pfd[n] = (struct pollfd){.fd = c->pending_fds[i], .events = POLLIN};
                kind[n++] = W_PENDING;
                any_pending = 1;
            }
        c->thread_off_hot = caller_driving;
        int timeout = caller_driving || c->held ? 1 : ls_cfg.heartbeat_ms / 20; /* the liveness check's granularity */
        c->thread_nap_ms = timeout; /* isends hold data back only while this is short */
        pthread_mutex_unlock(&c->lock);
        poll(pfd, (nfds_t)n, timeout);
        thread_lock(c, pfd, n, kind);
        uint64_t now = ls_now_ms();
        for (int i = 0; i < n && !c->stop; i++) {
            if (!pfd[i].revents) continue;
            if (kind[i] == W_WAKE) {
                uint64_t v;
                ssize_t rc = read(c->wake_fd, &v, sizeof v);
                (void)rc;
            } else if (kind[i] == W_NETLINK) {
                ls_netlink_read(c);
            } else if (kind[i] == W_LISTEN) {
                accept_on(c, pfd[i].fd, now);
            } /* streams: the pass below reads and writes every one of them */
        }
        for (int i = 0; i < n; i++) /* the pass reads only these (a stream the handlers above replaced has thread_polled 0) */
            if (kind[i] == W_STREAM) {
                ls_stream *st = &c->paths[what[i].path].streams[what[i].stream];
                if (st->fd == pfd[i].fd) st->thread_ready = (pfd[i].revents & (POLLIN | POLLERR | POLLHUP | POLLNVAL)) != 0;
                else st->thread_polled = 0;
            }
        if (any_pending) poll_pending(c, now);
        ls_progress_pass(c, caller_driving ? LS_PASS_COLD : LS_PASS_ALL);
        if (!c->is_send) ls_ack(c, 1); /* whatever a pass held back goes now */
        ls_paths_tick(c, ls_now_ms()); /* after the reads: their times are not in the future */
    }
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

int ls_comm_start(ls_comm *c) {
    if (c->wake_fd < 0) return -1;
    if (pthread_create(&c->thread, NULL, progress, c) != 0) return -1;
    c->thread_started = 1;
    return 0;
}

void ls_comm_free(ls_comm *c) {
    if (!c) return;
    if (c->thread_started) {
        pthread_mutex_lock(&c->lock);
        /* isends completed from the ring before the peer had their bytes: closing now would
         * lose them, so a send comm first waits (the progress thread works meanwhile) until
         * every message is acknowledged, or no path is left, or LOCKSTEP_NCCL_GIVEUP_MS */
        uint64_t deadline = ls_now_ms() + (uint64_t)ls_cfg.giveup_ms;
        if (c->is_send && c->established && c->error == ncclSuccess)
            ls_progress_pass(c, LS_PASS_HOT); /* a batch an isend held back goes now */
        while (c->is_send && c->established && c->error == ncclSuccess &&
               (c->next_chunk_msg < c->next_msg || c->seq_acked < c->seq_next) &&
               ls_now_ms() < deadline) {
            pthread_mutex_unlock(&c->lock);
            usleep(1000);
            pthread_mutex_lock(&c->lock);
        }
        c->stop = 1;
        pthread_mutex_unlock(&c->lock);
        ls_comm_wake(c);
        pthread_join(c->thread, NULL);
    }
    for (int p = 0; p < LS_MAX_NICS; p++) {
        for (int s = 0; s < LS_MAX_STREAMS; s++) {
            if (c->paths[p].streams[s].fd >= 0) close(c->paths[p].streams[s].fd);
            free(c->paths[p].streams[s].rx_stage);
            if (c->paths[p].streams[s].rx_eager) eager_unref(c, c->paths[p].streams[s].rx_eager);
        }
        if (c->paths[p].listen_fd >= 0) close(c->paths[p].listen_fd);
    }
    for (size_t i = 0; i < sizeof c->pending_fds / sizeof c->pending_fds[0]; i++)
        if (c->pending_fds[i] >= 0) close(c->pending_fds[i]);
    for (int k = 0; k < LS_MAX_MSGS; k++)
        for (ls_eager *e = c->rmsgs[k].head, *next; e; e = next) {
            next = e->next;
            eager_unref(c, e);
        }
    for (ls_eager *e = c->eager_free, *next; e; e = next) {
        next = e->next;
        free(e);
    }
    free(c->ring);
    if (c->wake_fd >= 0) close(c->wake_fd);
    if (c->netlink_fd >= 0) close(c->netlink_fd);
    pthread_mutex_destroy(&c->lock);
    free(c);
}
