/* Windows: per-peer accumulators, percentiles, the JSON lines on stdout. */
#include "probed.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define OUT_MAX (16u << 20) /* beyond this the reader is gone or stuck: lines are dropped */

void pm_prober_close_window(struct pm_nic *nic, int64_t window);

/* -- output -------------------------------------------------------------------------------- */

static char *out_buf;
static size_t out_len, out_cap, line_start;

static int out_reserve(size_t more)
{
    if (out_len + more <= out_cap)
        return 1;
    size_t cap = out_cap ? out_cap : 65536;
    while (cap < out_len + more)
        cap *= 2;
    char *b = realloc(out_buf, cap);
    if (!b)
        return 0;
    out_buf = b;
    out_cap = cap;
    return 1;
}

/* Appends to the output; a line is dropped whole (counted) when the output is over its bound. */
void pm_out(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char tmp[512];
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n >= sizeof tmp) {
        if (!out_reserve((size_t)n + 1))
            return;
        va_start(ap, fmt);
        vsnprintf(out_buf + out_len, (size_t)n + 1, fmt, ap);
        va_end(ap);
    } else {
        if (!out_reserve((size_t)n + 1))
            return;
        memcpy(out_buf + out_len, tmp, (size_t)n);
    }
    out_len += (size_t)n;
    if (n && out_buf[out_len - 1] == '\n') {
        if (out_len > OUT_MAX) { /* drop the line just written */
            out_len = line_start;
            pm.st.out_dropped++;
        }
        line_start = out_len;
    }
}

void pm_out_json_str(const char *s)
{
    pm_out("\"");
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            pm_out("\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            pm_out("\\u%04x", (unsigned char)*s);
        else
            pm_out("%c", *s);
    }
    pm_out("\"");
}

void pm_out_flush(void)
{
    size_t done = 0;
    while (done < line_start) {
        ssize_t n = write(STDOUT_FILENO, out_buf + done, line_start - done);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                pm.running = 0; /* the agent is gone */
            break;
        }
        done += (size_t)n;
    }
    if (done) {
        memmove(out_buf, out_buf + done, out_len - done);
        out_len -= done;
        line_start -= done;
    }
}

int pm_out_pending(void)
{
    return line_start > 0;
}

/* -- accumulators -------------------------------------------------------------------------- */

void pm_samples_add(struct pm_samples *s, int64_t v)
{
    if (s->n == s->cap) {
        uint32_t cap = s->cap ? s->cap * 2 : 128;
        int64_t *nv = realloc(s->v, cap * sizeof *nv);
        if (!nv)
            return;
        s->v = nv;
        s->cap = cap;
    }
    s->v[s->n++] = v;
}

void pm_acc_clear(struct pm_acc *a)
{
    struct pm_samples f = a->fwd, r = a->rev, t = a->rtt;
    free(a->sport_lost);
    memset(a, 0, sizeof *a);
    f.n = r.n = t.n = 0;
    a->fwd = f;
    a->rev = r;
    a->rtt = t;
}

void pm_acc_free(struct pm_acc *a)
{
    free(a->fwd.v);
    free(a->rev.v);
    free(a->rtt.v);
    free(a->sport_lost);
    memset(a, 0, sizeof *a);
}

struct pm_acc *pm_acc_for(struct pm_peer *p, int64_t window_ns)
{
    struct pm_nic *nic = pm.nics[p->nic];
    if (nic->next_emit && window_ns < nic->next_emit)
        return NULL;
    uint64_t slot = (uint64_t)(window_ns / pm.opts.window_ns) % PM_SLOTS;
    struct pm_acc *a = &p->acc[slot];
    if (a->used && a->window_ns == window_ns)
        return a;
    pm_acc_clear(a); /* an older window that can no longer be emitted */
    a->used = 1;
    a->window_ns = window_ns;
    return a;
}

static int cmp64(const void *x, const void *y)
{
    int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
    return (a > b) - (a < b);
}

/* nearest-rank percentile q of sorted values */
static int64_t rank(const struct pm_samples *s, double q)
{
    double k = q * s->n;
    uint32_t i = (uint32_t)k;
    if ((double)i < k)
        i++;
    return s->v[i ? i - 1 : 0];
}

static void out_pcts(const char *key, struct pm_samples *s, int halve)
{
    if (!s->n) {
        pm_out(",\"%s\":null", key);
        return;
    }
    qsort(s->v, s->n, sizeof *s->v, cmp64);
    int64_t p50 = rank(s, 0.5), p99 = rank(s, 0.99);
    if (halve) {
        p50 /= 2;
        p99 /= 2;
    }
    pm_out(",\"%s\":[%lld,%lld,%u]", key, (long long)p50, (long long)p99, s->n);
}

static void new_deadline(struct pm_peer *p, struct pm_samples *rtt)
{
    if (!rtt->n)
        return; /* no answers: keep the deadline (a dark peer must not stretch it) */
    p->rtt_p99_ns = rank(rtt, 0.99);
    int64_t d = p->rtt_p99_ns * pm.opts.deadline_k_milli / 1000;
    if (d < pm.opts.deadline_floor_ns)
        d = pm.opts.deadline_floor_ns;
    if (d > pm.opts.deadline_max_ns)
        d = pm.opts.deadline_max_ns;
    p->deadline_ns = d;
}

static void emit_window(struct pm_nic *nic, int64_t w)
{
    pm_prober_close_window(nic, w);
    pm_out("{\"ev\":\"window\",\"nic\":%u,\"start_ns\":%lld,\"window_ns\":%lld,\"synced\":%d,\"peers\":[",
           nic->index, (long long)w, (long long)pm.opts.window_ns, pm.synced);
    int first = 1;
    for (int i = 0; i < pm.npeers; i++) {
        struct pm_peer *p = pm.peers[i];
        if (pm.nics[p->nic] != nic)
            continue;
        struct pm_acc *a = NULL;
        for (int k = 0; k < PM_SLOTS; k++)
            if (p->acc[k].used && p->acc[k].window_ns == w)
                a = &p->acc[k];
        if (!a || !a->sent)
            continue;
        int clock = a->answered && a->clock_ok == a->answered;
        pm_out("%s{\"i\":%u,\"seq0\":%u,\"sent\":%u,\"lost\":%u,\"unres\":%u,\"late\":%u,\"refused\":%u,"
               "\"send_errors\":%u,\"rsent\":%u,\"rlost\":%u,\"rlate\":%u,\"answered\":%u,\"basis\":\"%s\","
               "\"hw\":%d,\"deadline_ns\":%lld,\"sport_step\":%u,\"sport_off\":%u",
               first ? "" : ",", p->index, a->seq0, a->sent, a->lost, a->unres, a->late, a->refused,
               a->send_errors, a->rsent, a->rlost, a->rlate, a->answered, clock ? "clock" : "half_rtt",
               a->answered && a->hw_ok == a->answered, (long long)p->deadline_ns, p->sport_step, p->sport_off);
        first = 0;
        if (clock) {
            out_pcts("fwd", &a->fwd, 0);
            out_pcts("rev", &a->rev, 0);
        }
        out_pcts("rtt", &a->rtt, 0);
        new_deadline(p, &a->rtt);
        if (a->sport_lost) {
            pm_out(",\"sports\":[");
            int sf = 1;
            for (uint32_t s = 0; s < nic->sport_count; s++) {
                uint32_t *c = a->sport_lost + s * 3;
                if (c[0] || c[1] || c[2]) {
                    pm_out("%s[%u,%u,%u,%u]", sf ? "" : ",", s, c[0], c[1], c[2]);
                    sf = 0;
                }
            }
            pm_out("]");
        }
        pm_out("}");
        pm_acc_clear(a);
    }
    pm_out("],\"rx\":[");
    first = 1;
    if (nic->flows) {
        for (uint32_t i = 0; i < PM_FLOW_TABLE; i++) {
            struct pm_flow *f = &nic->flows[i];
            if (!f->used)
                continue;
            for (int k = 0; k < PM_SLOTS; k++) {
                if (f->rx[k].n && f->rx[k].window_ns >= w && f->rx[k].window_ns < w + pm.opts.window_ns) {
                    pm_out("%s[", first ? "" : ",");
                    pm_out_json_str(f->name);
                    pm_out(",%lld,%u]", (long long)f->rx[k].window_ns, f->rx[k].n);
                    first = 0;
                    f->rx[k].n = 0;
                } else if (f->rx[k].n && f->rx[k].window_ns < w) {
                    nic->rx_late += f->rx[k].n; /* left from before a stall */
                    f->rx[k].n = 0;
                }
            }
        }
    }
    pm_out("],\"rx_late\":%llu,\"rx_stateless\":%llu}\n", (unsigned long long)nic->rx_late,
           (unsigned long long)nic->rx_stateless);
    pm.st.windows++;
}

void pm_emit_windows(int64_t now_window)
{
    int64_t W = pm.opts.window_ns;
    int64_t dmax[PM_MAX_NICS] = {0};
    for (int i = 0; i < pm.npeers; i++)
        if (pm.peers[i]->deadline_ns > dmax[pm.peers[i]->nic])
            dmax[pm.peers[i]->nic] = pm.peers[i]->deadline_ns;
    for (int n = 0; n < pm.nnics; n++) {
        struct pm_nic *nic = pm.nics[n];
        if (!nic->next_emit) {
            nic->next_emit = now_window - (now_window % W);
            continue;
        }
        int64_t delay = dmax[n] + pm.opts.grace_ns + pm.opts.margin_ns;
        int64_t behind = (now_window - delay - nic->next_emit) / W;
        if (behind > PM_SLOTS - 2) { /* a long stall: what is left of those windows is lost */
            pm.st.windows_skipped += (uint64_t)(behind - 1);
            nic->next_emit += (behind - 1) * W;
        }
        while (now_window >= nic->next_emit + W + delay) {
            emit_window(nic, nic->next_emit);
            nic->next_emit += W;
        }
    }
}
