/* The responder: echoes every probe at once with its kernel RX stamp, the sequence numbers it
 * has seen from that prober session, the kernel TX stamp of its previous echo (follow-up), and
 * counts the probes it received per prober window. */
#include "probed.h"

#include <errno.h>
#include <linux/errqueue.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define BATCH 32
#define CTRL_LEN 512

static uint32_t flow_hash(uint32_t addr, uint32_t session)
{
    uint64_t k = ((uint64_t)addr << 32) ^ session;
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return (uint32_t)k & (PM_FLOW_TABLE - 1);
}

static int valid_name(const uint8_t *s, size_t n)
{
    if (n == 0 || n > PM_NAME_MAX)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] <= ' ' || s[i] > '~' || s[i] == '"' || s[i] == '\\')
            return 0;
    return 1;
}

static struct pm_flow *flow_of(struct pm_nic *nic, uint32_t addr, uint32_t session, const uint8_t *name,
                               size_t nlen, int64_t now)
{
    if (!nic->flows)
        return NULL;
    uint32_t h = flow_hash(addr, session);
    for (uint32_t probes = 0; probes < PM_FLOW_TABLE; probes++) {
        struct pm_flow *f = &nic->flows[h];
        if (!f->used) {
            if (nic->nflows >= PM_FLOW_TABLE / 2 || !valid_name(name, nlen))
                return NULL; /* full, or a name we will not report: answered without state */
            memset(f, 0, sizeof *f);
            f->used = 1;
            f->addr = addr;
            f->session = session;
            memcpy(f->name, name, nlen);
            f->name[nlen] = 0;
            f->last_mono = now;
            nic->nflows++;
            return f;
        }
        if (f->addr == addr && f->session == session)
            return f;
        h = (h + 1) & (PM_FLOW_TABLE - 1);
    }
    return NULL;
}

/* Drop sessions silent for 30 s (a prober re-planned or gone): rebuild the table. */
void pm_flows_expire(struct pm_nic *nic, int64_t now)
{
    if (!nic->flows || !nic->nflows)
        return;
    uint32_t stale = 0;
    for (uint32_t i = 0; i < PM_FLOW_TABLE; i++)
        if (nic->flows[i].used && now - nic->flows[i].last_mono > 30000000000LL)
            stale++;
    if (!stale)
        return;
    struct pm_flow *old = nic->flows;
    struct pm_flow *fresh = calloc(PM_FLOW_TABLE, sizeof *fresh);
    if (!fresh)
        return;
    nic->flows = fresh;
    nic->nflows = 0;
    for (uint32_t i = 0; i < PM_FLOW_TABLE; i++) {
        if (!old[i].used || now - old[i].last_mono > 30000000000LL)
            continue;
        uint32_t h = flow_hash(old[i].addr, old[i].session);
        while (fresh[h].used)
            h = (h + 1) & (PM_FLOW_TABLE - 1);
        fresh[h] = old[i];
        nic->nflows++;
    }
    free(old);
    if (nic->sent_ring)
        memset(nic->sent_ring, 0xff, sizeof(*nic->sent_ring) * PM_SENT_RING); /* flow indexes moved */
}

static void count_rx(struct pm_nic *nic, struct pm_flow *f, int64_t window)
{
    if (nic->next_emit && window < nic->next_emit) {
        nic->rx_late++; /* that window was already reported */
        return;
    }
    int free_slot = -1, oldest = 0;
    for (int i = 0; i < PM_SLOTS; i++) {
        if (f->rx[i].n && f->rx[i].window_ns == window) {
            f->rx[i].n++;
            return;
        }
        if (!f->rx[i].n && free_slot < 0)
            free_slot = i;
        if (f->rx[i].window_ns < f->rx[oldest].window_ns)
            oldest = i;
    }
    if (free_slot < 0) { /* a window far ahead or behind (clocks apart): keep the newest */
        nic->rx_late += f->rx[oldest].n;
        free_slot = oldest;
    }
    f->rx[free_slot].window_ns = window;
    f->rx[free_slot].n = 1;
}

static void update_seen(struct pm_flow *f, uint32_t seq)
{
    if (!f->have) {
        f->have = 1;
        f->max_seq = seq;
        f->seen = 0;
        return;
    }
    int32_t d = (int32_t)(seq - f->max_seq);
    if (d > 0) {
        uint32_t shift = (uint32_t)d;
        uint64_t seen = shift < 64 ? f->seen << shift : 0;
        if (shift - 1 < 64)
            seen |= 1ULL << (shift - 1); /* the previous highest */
        f->seen = seen;
        f->max_seq = seq;
    } else if (d < 0 && -d <= 64) {
        f->seen |= 1ULL << (-d - 1); /* arrived out of order */
    }
}

static uint64_t seen_before(const struct pm_flow *f, uint32_t seq)
{
    int32_t d = (int32_t)(f->max_seq - seq);
    if (d < 0 || d >= 64)
        return 0;
    return f->seen >> d;
}

void pm_responder_read(struct pm_sock *s)
{
    static uint8_t bufs[BATCH][PM_PAYLOAD_MAX + 64];
    static uint8_t ctrl[BATCH][CTRL_LEN];
    struct pm_nic *nic = pm.nics[s->nic];
    struct mmsghdr msgs[BATCH], out[BATCH];
    struct iovec iov[BATCH], oiov[BATCH];
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
        int64_t now = pm_now_mono(), rx_user = pm_now_real();
        int64_t offset = pm.synced ? pm.clock_offset : 0;
        int nout = 0;
        for (int i = 0; i < n; i++) {
            uint8_t *m = bufs[i];
            size_t len = msgs[i].msg_len;
            if (len < PM_ECHO_LEN || pm_get32(m) != PM_MAGIC || m[PM_P_VERSION] != PM_WIRE_VERSION
                || (m[PM_P_TYPE] != PM_PROBE && m[PM_P_TYPE] != PM_TRACE)
                || (size_t)PM_PROBE_HDR + m[PM_P_NAMELEN] > len) {
                pm.st.bad_packets++;
                continue;
            }
            struct pm_stamps st;
            pm_parse_cmsgs(&msgs[i].msg_hdr, &st);
            int64_t rx = (st.sw ? st.sw : rx_user) + offset;
            uint32_t session = pm_get32(m + PM_P_SESSION), seq = pm_get32(m + PM_P_SEQ);
            int trace = m[PM_P_TYPE] == PM_TRACE;
            struct pm_flow *f = NULL;
            uint64_t seen = 0;
            if (!trace) {
                f = flow_of(nic, from[i].sin_addr.s_addr, session, m + PM_P_NAME, m[PM_P_NAMELEN], now);
                if (f) {
                    f->last_mono = now;
                    update_seen(f, seq);
                    seen = seen_before(f, seq);
                    count_rx(nic, f, (int64_t)pm_get64(m + PM_P_WINDOW));
                } else {
                    nic->rx_stateless++;
                }
                pm.st.answered_probes++;
            }
            /* the echo is written over the probe, keeping its length (and so its MTU) */
            uint8_t flags = (uint8_t)((pm.synced ? PM_F_SYNCED : 0) | (st.hw ? PM_F_HW : 0));
            memset(m + PM_P_FLAGS, 0, PM_ECHO_LEN - PM_P_FLAGS);
            m[PM_P_TYPE] = trace ? PM_TRACE_ECHO : PM_ECHO;
            pm_put32(m + PM_E_SESSION, session);
            pm_put32(m + PM_E_SEQ, seq);
            pm_put64(m + PM_E_RX, (uint64_t)rx);
            pm_put64(m + PM_E_SEEN, seen);
            pm_put64(m + PM_E_RX_HW, (uint64_t)st.hw);
            if (f && f->fu_ready) {
                flags |= PM_F_FOLLOWUP;
                pm_put32(m + PM_E_FU_SEQ, f->fu_seq);
                pm_put64(m + PM_E_FU_TX, (uint64_t)f->fu_tx);
                pm_put64(m + PM_E_FU_TX_HW, (uint64_t)f->fu_tx_hw);
                f->fu_ready = 0;
            }
            m[PM_P_FLAGS] = flags;
            if (len > PM_ECHO_LEN)
                memset(m + PM_ECHO_LEN, 0, len - PM_ECHO_LEN);
            oiov[nout].iov_base = m;
            oiov[nout].iov_len = len;
            memset(&out[nout], 0, sizeof out[nout]);
            out[nout].msg_hdr.msg_iov = &oiov[nout];
            out[nout].msg_hdr.msg_iovlen = 1;
            out[nout].msg_hdr.msg_name = &from[i];
            out[nout].msg_hdr.msg_namelen = sizeof from[i];
            if (f && nic->sent_ring) {
                uint32_t k = (session * 2654435761u ^ seq) & (PM_SENT_RING - 1);
                nic->sent_ring[k].session = session;
                nic->sent_ring[k].seq = seq;
                nic->sent_ring[k].flow = (int32_t)(f - nic->flows);
            }
            nout++;
        }
        if (nout) {
            int64_t tx = pm_now_real() + offset;
            for (int i = 0; i < nout; i++)
                pm_put64((uint8_t *)oiov[i].iov_base + PM_E_TX, (uint64_t)tx);
            int sent = 0;
            while (sent < nout) {
                int r = sendmmsg(s->fd, out + sent, (unsigned)(nout - sent), MSG_DONTWAIT);
                if (r < 0 && errno == EINTR)
                    continue;
                if (r <= 0) {
                    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS)) {
                        pm.st.send_errors += (uint64_t)(nout - sent);
                        break;
                    }
                    pm.st.send_errors++; /* that prober is unreachable: skip its echo */
                    sent++;
                    continue;
                }
                sent += r;
            }
        }
        if (n < BATCH)
            return;
    }
}

static void responder_error(struct pm_nic *nic, struct msghdr *msg, const uint8_t *buf, size_t n)
{
    struct pm_stamps st;
    pm_parse_cmsgs(msg, &st);
    if (!st.have_err || st.ee_origin != SO_EE_ORIGIN_TIMESTAMPING)
        return; /* an ICMP error about an echo (the prober went away): nothing to do */
    size_t rest = 0;
    const uint8_t *m = pm_find_magic(buf, n, &rest);
    if (!m || rest < PM_ECHO_LEN || m[PM_P_TYPE] != PM_ECHO || !nic->flows || !nic->sent_ring)
        return;
    uint32_t session = pm_get32(m + PM_E_SESSION), seq = pm_get32(m + PM_E_SEQ);
    uint32_t k = (session * 2654435761u ^ seq) & (PM_SENT_RING - 1);
    if (nic->sent_ring[k].session != session || nic->sent_ring[k].seq != seq || nic->sent_ring[k].flow < 0)
        return;
    struct pm_flow *f = &nic->flows[nic->sent_ring[k].flow];
    if (!f->used || f->session != session)
        return;
    int64_t offset = pm.synced ? pm.clock_offset : 0;
    f->fu_seq = seq;
    f->fu_tx = st.sw ? st.sw + offset : (int64_t)pm_get64(m + PM_E_TX);
    f->fu_tx_hw = st.hw;
    f->fu_ready = 1;
    pm.st.tx_stamps++;
}

void pm_responder_errqueue(struct pm_sock *s)
{
    enum { EQ = 32 };
    static uint8_t bufs[EQ][512];
    static uint8_t ctrl[EQ][CTRL_LEN];
    struct pm_nic *nic = pm.nics[s->nic];
    struct mmsghdr msgs[EQ];
    struct iovec iov[EQ];
    for (int rounds = 0; rounds < 64; rounds++) {
        for (int i = 0; i < EQ; i++) {
            iov[i].iov_base = bufs[i];
            iov[i].iov_len = sizeof bufs[i];
            memset(&msgs[i], 0, sizeof msgs[i]);
            msgs[i].msg_hdr.msg_iov = &iov[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
            msgs[i].msg_hdr.msg_control = ctrl[i];
            msgs[i].msg_hdr.msg_controllen = CTRL_LEN;
        }
        int n = recvmmsg(s->fd, msgs, EQ, MSG_ERRQUEUE | MSG_DONTWAIT, NULL);
        if (n <= 0)
            return;
        for (int i = 0; i < n; i++)
            responder_error(nic, &msgs[i].msg_hdr, bufs[i], msgs[i].msg_len);
        if (n < EQ)
            return;
    }
}
