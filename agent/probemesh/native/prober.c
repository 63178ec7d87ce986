/* The prober: probes on schedule, echoes, TX stamps, deadlines, the direction of each loss. */
#include "probed.h"

#include <arpa/inet.h>
#include <errno.h>
#include <linux/errqueue.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define BATCH 8 /* one socket per source port: few echoes wait on each */
#define CTRL_LEN 512

/* -- sessions: echo and TX stamp -> peer --------------------------------------------------- */

static struct pm_peer **sessions;
static uint32_t session_cap;

void pm_sessions_rebuild(void)
{
    free(sessions);
    session_cap = 16;
    while (session_cap < (uint32_t)pm.npeers * 2 + 2)
        session_cap <<= 1;
    sessions = calloc(session_cap, sizeof *sessions);
    if (!sessions) {
        session_cap = 0;
        return;
    }
    for (int i = 0; i < pm.npeers; i++) {
        uint32_t h = (pm.peers[i]->session * 2654435761u) & (session_cap - 1);
        while (sessions[h])
            h = (h + 1) & (session_cap - 1);
        sessions[h] = pm.peers[i];
    }
}

struct pm_peer *pm_peer_by_session(uint32_t session)
{
    if (!session_cap)
        return NULL;
    uint32_t h = (session * 2654435761u) & (session_cap - 1);
    while (sessions[h]) {
        if (sessions[h]->session == session)
            return sessions[h];
        h = (h + 1) & (session_cap - 1);
    }
    return NULL;
}

/* -- the schedule: a binary heap of peers by next_due --------------------------------------- */

static void heap_swap(int a, int b)
{
    struct pm_peer *t = pm.heap[a];
    pm.heap[a] = pm.heap[b];
    pm.heap[b] = t;
    pm.heap[a]->heap_pos = a;
    pm.heap[b]->heap_pos = b;
}

static void heap_down(int i)
{
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < pm.nheap && pm.heap[l]->next_due < pm.heap[m]->next_due)
            m = l;
        if (r < pm.nheap && pm.heap[r]->next_due < pm.heap[m]->next_due)
            m = r;
        if (m == i)
            return;
        heap_swap(i, m);
        i = m;
    }
}

void pm_heap_rebuild(void)
{
    free(pm.heap);
    pm.heap = calloc((size_t)pm.npeers + 1, sizeof *pm.heap);
    pm.nheap = 0;
    if (!pm.heap)
        return;
    for (int i = 0; i < pm.npeers; i++) {
        struct pm_peer *p = pm.peers[i];
        struct pm_nic *nic = pm.nics[p->nic];
        if (!nic->sports || !nic->sport_count)
            continue; /* this NIC could not open its sockets: nothing to send from */
        p->heap_pos = pm.nheap;
        pm.heap[pm.nheap++] = p;
    }
    for (int i = pm.nheap / 2 - 1; i >= 0; i--)
        heap_down(i);
}

int64_t pm_heap_next_due(void)
{
    return pm.nheap ? pm.heap[0]->next_due : INT64_MAX;
}

void pm_peer_free(struct pm_peer *p)
{
    if (!p)
        return;
    for (int i = 0; i < PM_SLOTS; i++)
        pm_acc_free(&p->acc[i]);
    free(p->ring);
    free(p);
}

/* -- sending ---------------------------------------------------------------------------------- */

static size_t probe_len(const struct pm_nic *nic)
{
    size_t len = PM_PROBE_HDR + strlen(nic->name);
    if (len < PM_ECHO_LEN)
        len = PM_ECHO_LEN; /* the echo is as long as the probe */
    if ((size_t)pm.opts.payload > len)
        len = (size_t)pm.opts.payload;
    return len;
}

static void finalize(struct pm_peer *p, struct pm_rec *r);

static int send_probe(struct pm_peer *p, int64_t now)
{
    struct pm_nic *nic = pm.nics[p->nic];
    uint32_t seq = p->next_seq;
    uint16_t sport = (uint16_t)(((uint64_t)seq * p->sport_step + p->sport_off) % nic->sport_count);
    struct pm_sock *s = nic->sports[sport];
    if (!s)
        return 0;
    struct pm_rec *r = &p->ring[seq & (p->ring_size - 1)];
    if (r->used && !r->final)
        finalize(p, r); /* the ring is sized so this does not happen; never lose a count if it does */
    uint8_t buf[PM_PAYLOAD_MAX];
    size_t len = probe_len(nic), nlen = strlen(nic->name);
    memset(buf, 0, len);
    int64_t wclock = pm_window_clock();
    int64_t window = wclock - (wclock % pm.opts.window_ns);
    int64_t tx_user = pm_now_real();
    pm_put32(buf + PM_P_MAGIC, PM_MAGIC);
    buf[PM_P_VERSION] = PM_WIRE_VERSION;
    buf[PM_P_TYPE] = PM_PROBE;
    buf[PM_P_FLAGS] = pm.synced ? PM_F_SYNCED : 0;
    buf[PM_P_NAMELEN] = (uint8_t)nlen;
    pm_put32(buf + PM_P_SESSION, p->session);
    pm_put32(buf + PM_P_SEQ, seq);
    pm_put64(buf + PM_P_WINDOW, (uint64_t)window);
    pm_put64(buf + PM_P_TX, (uint64_t)(tx_user + (pm.synced ? pm.clock_offset : 0)));
    memcpy(buf + PM_P_NAME, nic->name, nlen);
    struct sockaddr_in to;
    memset(&to, 0, sizeof to);
    to.sin_family = AF_INET;
    to.sin_port = htons((uint16_t)pm.opts.port);
    to.sin_addr.s_addr = p->addr;
    ssize_t n = sendto(s->fd, buf, len, 0, (struct sockaddr *)&to, sizeof to);
    int send_error = 0;
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS || errno == EINTR) {
            pm.st.skipped++; /* local congestion: not sent, tried again at the next slot */
            return 0;
        }
        /* EPERM (this host's own filter), ENETUNREACH, ENETDOWN...: it never reached the wire,
         * which is loss on this NIC's path */
        send_error = 1;
        pm.st.send_errors++;
    }
    memset(r, 0, sizeof *r);
    r->used = 1;
    r->seq = seq;
    r->sport = sport;
    r->window_ns = window;
    r->tx_mono = now;
    r->deadline_ns = p->deadline_ns;
    r->a_synced = (uint8_t)pm.synced;
    r->a_offset = pm.synced ? pm.clock_offset : 0;
    r->tx_user = tx_user;
    r->send_error = (uint8_t)send_error;
    struct pm_acc *a = pm_acc_for(p, window);
    if (a) {
        if (!a->sent)
            a->seq0 = seq;
        a->sent++;
    }
    p->next_seq = seq + 1;
    pm.st.sent++;
    return 1;
}

void pm_prober_send_due(int64_t now)
{
    while (pm.nheap && pm.heap[0]->next_due <= now) {
        struct pm_peer *p = pm.heap[0];
        int64_t interval = pm.opts.interval_ns;
        if (now - p->next_due > 2 * interval + 20000000LL) {
            /* far behind (the helper was not scheduled): skip the missed slots rather than
             * bursting them, so a busy host does not probe in bursts */
            int64_t missed = (now - p->next_due) / interval;
            pm.st.skipped += (uint64_t)missed;
            p->next_due += missed * interval;
        }
        send_probe(p, now);
        p->next_due += interval;
        heap_down(0);
    }
}

/* -- receiving echoes ------------------------------------------------------------------------- */

static struct pm_rec *rec_of(struct pm_peer *p, uint32_t seq)
{
    struct pm_rec *r = &p->ring[seq & (p->ring_size - 1)];
    return (r->used && r->seq == seq) ? r : NULL;
}

static void emit_hop(uint32_t token, int has_token, int ttl, uint32_t from, const char *kind, int code,
                     const struct pm_sock *s, uint32_t dst)
{
    char a[INET_ADDRSTRLEN] = "", d[INET_ADDRSTRLEN] = "";
    inet_ntop(AF_INET, &from, a, sizeof a);
    inet_ntop(AF_INET, &dst, d, sizeof d);
    if (has_token)
        pm_out("{\"ev\":\"hop\",\"token\":%u,\"ttl\":%d,\"from\":\"%s\",\"kind\":\"%s\",\"code\":%d,"
               "\"nic\":%u,\"sport\":%d,\"dst\":\"%s\"}\n", token, ttl, a, kind, code, pm.nics[s->nic]->index, s->sport, d);
    else
        pm_out("{\"ev\":\"hop\",\"token\":null,\"ttl\":null,\"from\":\"%s\",\"kind\":\"%s\",\"code\":%d,"
               "\"nic\":%u,\"sport\":%d,\"dst\":\"%s\"}\n", a, kind, code, pm.nics[s->nic]->index, s->sport, d);
    pm.st.hops++;
}

static void handle_echo(const uint8_t *m, size_t len, const struct pm_stamps *st, int64_t rx_user)
{
    if (len < PM_ECHO_LEN) {
        pm.st.bad_packets++;
        return;
    }
    struct pm_peer *p = pm_peer_by_session(pm_get32(m + PM_E_SESSION));
    if (!p) {
        pm.st.stale_echoes++;
        return;
    }
    uint32_t seq = pm_get32(m + PM_E_SEQ);
    uint8_t flags = m[PM_P_FLAGS];
    /* the responder's seen mask resolves, for every earlier probe still open, whether the
     * probe reached it (so a lost one is the echo's loss) or not (the probe's loss) */
    uint64_t seen = pm_get64(m + PM_E_SEEN);
    for (uint32_t i = 0; i < PM_MASK_BITS; i++) {
        struct pm_rec *q = rec_of(p, seq - 1 - i);
        if (q && !q->final) {
            q->known = 1;
            if (seen & (1ULL << i))
                q->b_seen = 1;
        }
    }
    if (flags & PM_F_FOLLOWUP) {
        struct pm_rec *q = rec_of(p, pm_get32(m + PM_E_FU_SEQ));
        if (q && !q->final && q->answered) {
            q->tx_b = (int64_t)pm_get64(m + PM_E_FU_TX);
            q->tx_b_hw = (int64_t)pm_get64(m + PM_E_FU_TX_HW);
            q->has_fu = 1;
        }
    }
    struct pm_rec *r = rec_of(p, seq);
    if (!r || r->final) {
        pm.st.stale_echoes++;
        return;
    }
    if (r->answered || r->late)
        return; /* a duplicate */
    r->known = 1;
    r->b_seen = 1;
    r->answered = 1; /* an echo came; whether within the deadline is decided when final */
    r->rx_a = st->sw ? st->sw : rx_user;
    r->rx_a_hw = st->hw;
    r->rx_b = (int64_t)pm_get64(m + PM_E_RX);
    r->tx_b = (int64_t)pm_get64(m + PM_E_TX);
    r->rx_b_hw = (flags & PM_F_HW) ? (int64_t)pm_get64(m + PM_E_RX_HW) : 0;
    r->b_synced = (flags & PM_F_SYNCED) ? 1 : 0;
    pm.st.echoes++;
}

void pm_prober_read(struct pm_sock *s)
{
    static uint8_t bufs[BATCH][PM_PAYLOAD_MAX + 64];
    static uint8_t ctrl[BATCH][CTRL_LEN];
    struct mmsghdr msgs[BATCH];
    struct iovec iov[BATCH];
    struct sockaddr_in from[BATCH];
    for (;;) {
        for (int i = 0; i < BATCH; i++) {
            iov[i].iov_base = bufs[i];
            iov[i].iov_len = sizeof bufs[i];
            memset(&msgs[i], 0, sizeof msgs[i]);
            msgs[i].msg_hdr.msg_iov = &iov[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
            msgs[i].msg_hdr.msg_control = ctrl[i];
            msgs[i].msg_hdr.msg_controllen = CTRL_LEN;
            msgs[i].msg_hdr.msg_name = &from[i];
            msgs[i].msg_hdr.msg_namelen = sizeof from[i];
        }
        int n = recvmmsg(s->fd, msgs, BATCH, MSG_DONTWAIT, NULL);
        if (n <= 0)
            return;
        int64_t rx_user = pm_now_real();
        for (int i = 0; i < n; i++) {
            const uint8_t *m = bufs[i];
            size_t len = msgs[i].msg_len;
            if (len < PM_PROBE_HDR || pm_get32(m) != PM_MAGIC || m[PM_P_VERSION] != PM_WIRE_VERSION) {
                pm.st.bad_packets++;
                continue;
            }
            struct pm_stamps st;
            pm_parse_cmsgs(&msgs[i].msg_hdr, &st);
            if (m[PM_P_TYPE] == PM_ECHO)
                handle_echo(m, len, &st, rx_user);
            else if (m[PM_P_TYPE] == PM_TRACE_ECHO)
                emit_hop(pm_get32(m + PM_E_SESSION), 1, (int)pm_get32(m + PM_E_SEQ), from[i].sin_addr.s_addr,
                         "reached", 0, s, from[i].sin_addr.s_addr);
            else
                pm.st.bad_packets++;
        }
        if (n < BATCH)
            return;
    }
}

static void prober_error(struct pm_sock *s, struct msghdr *msg, const uint8_t *buf, size_t n,
                         const struct sockaddr_in *dst)
{
    struct pm_stamps st;
    pm_parse_cmsgs(msg, &st);
    size_t rest = 0;
    const uint8_t *m = pm_find_magic(buf, n, &rest);
    uint32_t dst_addr = msg->msg_namelen >= sizeof(struct sockaddr_in) ? dst->sin_addr.s_addr : 0;
    if (st.have_err && st.ee_origin == SO_EE_ORIGIN_TIMESTAMPING) {
        if (m && m[PM_P_TYPE] == PM_PROBE) {
            struct pm_peer *p = pm_peer_by_session(pm_get32(m + PM_P_SESSION));
            struct pm_rec *r = p ? rec_of(p, pm_get32(m + PM_P_SEQ)) : NULL;
            if (r && !r->final) {
                if (st.sw)
                    r->tx_sw = st.sw;
                if (st.hw)
                    r->tx_hw = st.hw;
                pm.st.tx_stamps++;
            }
        }
        return;
    }
    if (!st.have_err || st.ee_origin != SO_EE_ORIGIN_ICMP)
        return;
    const char *kind = st.ee_type == 11 ? "ttl" : (st.ee_type == 3 ? "unreach" : "icmp");
    if (m && m[PM_P_TYPE] == PM_TRACE) {
        emit_hop(pm_get32(m + PM_P_SESSION), 1, (int)pm_get32(m + PM_P_SEQ), st.offender, kind, st.ee_code, s,
                 dst_addr);
    } else if (m && m[PM_P_TYPE] == PM_PROBE) {
        struct pm_peer *p = pm_peer_by_session(pm_get32(m + PM_P_SESSION));
        struct pm_rec *r = p ? rec_of(p, pm_get32(m + PM_P_SEQ)) : NULL;
        if (r && !r->final && st.ee_type == 3)
            r->refused = 1; /* nothing listens there (port), or no route (host/net) */
    } else if (!m && st.ee_type == 11) {
        /* a switch that quotes only the UDP header: the trace is matched by flow */
        emit_hop(0, 0, 0, st.offender, kind, st.ee_code, s, dst_addr);
    }
}

void pm_prober_errqueue(struct pm_sock *s)
{
    enum { EQ = 16 };
    static uint8_t bufs[EQ][512];
    static uint8_t ctrl[EQ][CTRL_LEN];
    struct mmsghdr msgs[EQ];
    struct iovec iov[EQ];
    struct sockaddr_in dst[EQ];
    for (int rounds = 0; rounds < 64; rounds++) {
        for (int i = 0; i < EQ; i++) {
            iov[i].iov_base = bufs[i];
            iov[i].iov_len = sizeof bufs[i];
            memset(&msgs[i], 0, sizeof msgs[i]);
            msgs[i].msg_hdr.msg_iov = &iov[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
            msgs[i].msg_hdr.msg_control = ctrl[i];
            msgs[i].msg_hdr.msg_controllen = CTRL_LEN;
            msgs[i].msg_hdr.msg_name = &dst[i];
            msgs[i].msg_hdr.msg_namelen = sizeof dst[i];
        }
        /* one call takes every queued stamp and error (fewer than EQ: the queue is empty) */
        int n = recvmmsg(s->fd, msgs, EQ, MSG_ERRQUEUE | MSG_DONTWAIT, NULL);
        if (n <= 0)
            return;
        for (int i = 0; i < n; i++)
            prober_error(s, &msgs[i].msg_hdr, bufs[i], msgs[i].msg_len, &dst[i]);
        if (n < EQ)
            return;
    }
}

/* -- deadlines and finalizing ----------------------------------------------------------------- */

static void sport_count(struct pm_acc *a, uint16_t sport, int which, uint16_t count)
{
    if (!a->sport_lost) {
        a->sport_lost = calloc((size_t)count * 3, sizeof *a->sport_lost);
        if (!a->sport_lost)
            return;
    }
    if (sport < count)
        a->sport_lost[sport * 3 + (uint32_t)which]++;
}

static void finalize(struct pm_peer *p, struct pm_rec *r)
{
    r->final = 1;
    struct pm_acc *a = pm_acc_for(p, r->window_ns);
    if (!a)
        return; /* its window was already emitted (a stall longer than the windows in flight) */
    uint16_t count = pm.nics[p->nic]->sport_count;
    if (r->send_error) {
        a->lost++;
        a->send_errors++;
        sport_count(a, r->sport, 0, count);
        return;
    }
    int64_t tx_a = r->tx_sw ? r->tx_sw : r->tx_user;
    if (r->answered) {
        int64_t elapsed = r->rx_a - tx_a;
        int clock = r->a_synced && r->b_synced;
        int64_t fwd = r->rx_b - (tx_a + r->a_offset);
        int64_t rev = (r->rx_a + r->a_offset) - r->tx_b;
        /* late is judged on the network's round trip: the responder's own turnaround (a busy
         * host answering slowly) is not the network's */
        int64_t rtt = elapsed - (r->tx_b - r->rx_b);
        if (rtt <= r->deadline_ns) {
            int hw = r->tx_hw && r->rx_a_hw && r->rx_b_hw && r->tx_b_hw && r->has_fu;
            if (hw)
                rtt = (r->rx_a_hw - r->tx_hw) - (r->tx_b_hw - r->rx_b_hw);
            if (rtt < 0)
                rtt = 0;
            a->answered++;
            a->rsent++;
            a->hw_ok += (uint32_t)hw;
            pm_samples_add(&a->rtt, rtt);
            if (clock) {
                a->clock_ok++;
                pm_samples_add(&a->fwd, fwd < 0 ? 0 : fwd);
                pm_samples_add(&a->rev, rev < 0 ? 0 : rev);
            }
        } else if (clock && rev > fwd) {
            a->rsent++; /* late, and the echo's way was the slow one */
            a->rlost++;
            a->rlate++;
            sport_count(a, r->sport, 1, count);
        } else {
            a->lost++; /* late; without synchronized clocks the probe's way is blamed */
            a->late++;
            sport_count(a, r->sport, 0, count);
        }
        return;
    }
    if (r->refused) {
        a->lost++;
        a->refused++;
        sport_count(a, r->sport, 0, count);
    } else if (r->known && r->b_seen) {
        a->rsent++; /* the responder had it: the echo was lost */
        a->rlost++;
        sport_count(a, r->sport, 1, count);
    } else if (r->known) {
        a->lost++; /* a later echo says the responder never had it */
        sport_count(a, r->sport, 0, count);
    } else {
        a->lost++; /* no later echo came: which way is not known */
        a->unres++;
        sport_count(a, r->sport, 2, count);
    }
}

void pm_prober_tick(int64_t now)
{
    int64_t grace = pm.opts.grace_ns;
    for (int i = 0; i < pm.npeers; i++) {
        struct pm_peer *p = pm.peers[i];
        while (p->final_seq != p->next_seq) {
            struct pm_rec *r = &p->ring[p->final_seq & (p->ring_size - 1)];
            if (r->used && r->seq == p->final_seq && !r->final) {
                if (now < r->tx_mono + r->deadline_ns + grace)
                    break;
                finalize(p, r);
            }
            p->final_seq++;
        }
    }
}

/* Finalize every open probe of windows up to `window` (before that window is emitted). */
void pm_prober_close_window(struct pm_nic *nic, int64_t window);
void pm_prober_close_window(struct pm_nic *nic, int64_t window)
{
    for (int i = 0; i < pm.npeers; i++) {
        struct pm_peer *p = pm.peers[i];
        if (pm.nics[p->nic] != nic)
            continue;
        while (p->final_seq != p->next_seq) {
            struct pm_rec *r = &p->ring[p->final_seq & (p->ring_size - 1)];
            if (r->used && r->seq == p->final_seq && !r->final) {
                if (r->window_ns > window)
                    break;
                finalize(p, r);
            }
            p->final_seq++;
        }
    }
}

/* -- path discovery: one TTL-limited probe of a flow ---------------------------------------- */

void pm_trace(uint32_t token, int peer, int sport, int ttl)
{
    if (peer < 0 || peer >= pm.npeers || ttl < 1 || ttl > 64)
        return;
    struct pm_peer *p = pm.peers[peer];
    struct pm_nic *nic = pm.nics[p->nic];
    if (!nic->sports || sport < 0 || sport >= nic->sport_count || !nic->sports[sport])
        return;
    uint8_t buf[PM_PAYLOAD_MAX];
    size_t len = probe_len(nic), nlen = strlen(nic->name);
    memset(buf, 0, len);
    pm_put32(buf + PM_P_MAGIC, PM_MAGIC);
    buf[PM_P_VERSION] = PM_WIRE_VERSION;
    buf[PM_P_TYPE] = PM_TRACE;
    buf[PM_P_NAMELEN] = (uint8_t)nlen;
    pm_put32(buf + PM_P_SESSION, token);
    pm_put32(buf + PM_P_SEQ, (uint32_t)ttl);
    pm_put64(buf + PM_P_TX, (uint64_t)pm_now_real());
    memcpy(buf + PM_P_NAME, nic->name, nlen);
    struct sockaddr_in to;
    memset(&to, 0, sizeof to);
    to.sin_family = AF_INET;
    to.sin_port = htons((uint16_t)pm.opts.port);
    to.sin_addr.s_addr = p->addr;
    struct iovec iov = {buf, len};
    union {
        char b[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } c;
    memset(&c, 0, sizeof c);
    struct msghdr msg;
    memset(&msg, 0, sizeof msg);
    msg.msg_name = &to;
    msg.msg_namelen = sizeof to;
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = c.b;
    msg.msg_controllen = sizeof c.b;
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = IPPROTO_IP;
    cm->cmsg_type = IP_TTL;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &ttl, sizeof ttl);
    if (sendmsg(nic->sports[sport]->fd, &msg, 0) >= 0)
        pm.st.traces++;
}
