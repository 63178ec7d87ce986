/* lockstep-probed: control lines on stdin, the event loop. */
#include "probed.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

struct pm_state pm;

#define TICK_NS 1000000LL /* the loop's period */

/* -- the configuration being staged (between reset and commit) ---------------------------- */

struct staged_nic {
    char name[PM_NAME_MAX + 1], ifname[IFNAMSIZ];
    uint32_t addr;
    int sport_first, sport_count;
};
struct staged_peer {
    int nic;
    char name[PM_NAME_MAX + 1];
    uint32_t addr;
};

static struct {
    int active;
    struct pm_opts opts;
    struct staged_nic nics[PM_MAX_NICS];
    int nnics;
    struct staged_peer *peers;
    int npeers, cap;
    char error[256];
} stage;

static int commit_pending;

static void error_line(const char *what)
{
    pm_out("{\"ev\":\"error\",\"msg\":");
    pm_out_json_str(what);
    pm_out("}\n");
}

static uint32_t random32(void)
{
    uint32_t v = 0;
    if (getrandom(&v, sizeof v, 0) != sizeof v)
        v = (uint32_t)pm_now_mono() * 2654435761u;
    return v;
}

static int parse_name(const char *s, char *out)
{
    size_t n = strlen(s);
    if (n == 0 || n > PM_NAME_MAX)
        return 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] <= ' ' || (unsigned char)s[i] > '~' || s[i] == '"' || s[i] == '\\')
            return 0;
    memcpy(out, s, n + 1);
    return 1;
}

static void stage_error(const char *msg)
{
    if (!stage.error[0])
        snprintf(stage.error, sizeof stage.error, "%s", msg);
}

static void handle_opt(const char *key, long long v)
{
    struct pm_opts *o = &stage.opts;
    if (!strcmp(key, "window_ns"))
        o->window_ns = v;
    else if (!strcmp(key, "interval_ns"))
        o->interval_ns = v;
    else if (!strcmp(key, "port"))
        o->port = (int)v;
    else if (!strcmp(key, "deadline_floor_ns"))
        o->deadline_floor_ns = v;
    else if (!strcmp(key, "deadline_k_milli"))
        o->deadline_k_milli = v;
    else if (!strcmp(key, "deadline_max_ns"))
        o->deadline_max_ns = v;
    else if (!strcmp(key, "grace_ns"))
        o->grace_ns = v;
    else if (!strcmp(key, "margin_ns"))
        o->margin_ns = v;
    else if (!strcmp(key, "payload"))
        o->payload = (int)v;
    else if (!strcmp(key, "dscp"))
        o->dscp = (int)v;
    else if (!strcmp(key, "hw"))
        o->hw = (int)v;
    else if (!strcmp(key, "txts"))
        o->txts = (int)v;
    else
        stage_error("unknown opt");
}

static int opts_valid(const struct pm_opts *o)
{
    return o->window_ns >= 1000000 && o->interval_ns >= 100000 && o->port > 0 && o->port < 65536
           && o->deadline_floor_ns > 0 && o->deadline_max_ns >= o->deadline_floor_ns && o->deadline_k_milli > 0
           && o->grace_ns >= 0 && o->margin_ns >= 0 && o->payload >= 0 && o->payload <= PM_PAYLOAD_MAX
           && o->dscp >= 0 && o->dscp < 64 && o->hw >= 0 && o->hw <= 2 && (o->txts == 0 || o->txts == 1);
}

/* -- applying a configuration in place ------------------------------------------------------- */

static void close_sock(struct pm_sock *s)
{
    if (!s)
        return;
    epoll_ctl(pm.epfd, EPOLL_CTL_DEL, s->fd, NULL);
    close(s->fd);
    free(s);
}

static void nic_free(struct pm_nic *nic)
{
    if (!nic)
        return;
    close_sock(nic->resp);
    if (nic->sports)
        for (int i = 0; i < nic->sport_count; i++)
            close_sock(nic->sports[i]);
    free(nic->sports);
    free(nic->flows);
    free(nic->sent_ring);
    free(nic);
}

static struct pm_sock *add_sock(struct pm_nic *nic, uint16_t port, int kind, int sport, int nic_index)
{
    int fd = pm_open_socket(nic, port, nic->errors, sizeof nic->errors);
    if (fd < 0)
        return NULL;
    struct pm_sock *s = calloc(1, sizeof *s);
    if (!s) {
        close(fd);
        return NULL;
    }
    s->fd = fd;
    s->nic = nic_index;
    s->kind = kind;
    s->sport = sport;
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = s};
    epoll_ctl(pm.epfd, EPOLL_CTL_ADD, fd, &ev);
    return s;
}

static struct pm_nic *nic_new(const struct staged_nic *sn, int index)
{
    struct pm_nic *nic = calloc(1, sizeof *nic);
    if (!nic)
        return NULL;
    memcpy(nic->name, sn->name, sizeof nic->name);
    memcpy(nic->ifname, sn->ifname, sizeof nic->ifname);
    nic->addr = sn->addr;
    nic->sport_first = (uint16_t)sn->sport_first;
    nic->sport_count = (uint16_t)sn->sport_count;
    nic->index = (uint32_t)index;
    nic->hw = pm.opts.hw ? pm_hw_available(nic->ifname, pm.opts.hw == 2) : 0;
    nic->flows = calloc(PM_FLOW_TABLE, sizeof *nic->flows);
    nic->sent_ring = malloc(sizeof(*nic->sent_ring) * PM_SENT_RING);
    if (nic->sent_ring)
        memset(nic->sent_ring, 0xff, sizeof(*nic->sent_ring) * PM_SENT_RING);
    nic->resp = add_sock(nic, (uint16_t)pm.opts.port, PM_SOCK_RESPONDER, -1, index);
    nic->sports = calloc(nic->sport_count ? nic->sport_count : 1, sizeof *nic->sports);
    int opened = 0;
    for (int i = 0; nic->sports && i < nic->sport_count; i++) {
        nic->sports[i] = add_sock(nic, (uint16_t)(nic->sport_first + i), PM_SOCK_PROBER, i, index);
        opened += nic->sports[i] != NULL;
    }
    if (opened < nic->sport_count) {
        /* a partial port set would skew the rotation: probe from none of them */
        for (int i = 0; nic->sports && i < nic->sport_count; i++) {
            close_sock(nic->sports[i]);
            nic->sports[i] = NULL;
        }
        free(nic->sports);
        nic->sports = NULL;
    }
    return nic;
}

static uint32_t gcd32(uint32_t a, uint32_t b)
{
    while (b) {
        uint32_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

static uint32_t ring_size_for(const struct pm_opts *o)
{
    /* a probe stays open for deadline + grace; later ones resolve it for 64 sequence numbers */
    int64_t open = (o->deadline_max_ns + o->grace_ns) / o->interval_ns + 2 * PM_MASK_BITS + 16;
    uint32_t size = 256;
    while ((int64_t)size < open && size < (1u << 20))
        size <<= 1;
    return size;
}

static struct pm_peer *peer_new(const struct staged_peer *sp, struct pm_nic *nic, int nic_index, int64_t now)
{
    struct pm_peer *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    memcpy(p->name, sp->name, sizeof p->name);
    memcpy(p->nic_name, nic->name, sizeof p->nic_name);
    p->addr = sp->addr;
    p->nic = nic_index;
    do
        p->session = random32();
    while (!p->session || pm_peer_by_session(p->session));
    p->next_seq = random32() & 0xffffff;
    p->final_seq = p->next_seq;
    p->deadline_ns = pm.opts.deadline_max_ns; /* until a window has measured the RTT */
    p->ring_size = ring_size_for(&pm.opts);
    p->ring = calloc(p->ring_size, sizeof *p->ring);
    uint32_t count = nic->sport_count ? nic->sport_count : 1;
    p->sport_off = random32() % count;
    p->sport_step = 1;
    if (count > 2) {
        do
            p->sport_step = 1 + random32() % (count - 1);
        while (gcd32(p->sport_step, count) != 1);
    }
    p->next_due = now + (int64_t)(random32() % (uint32_t)(pm.opts.interval_ns > 0 ? pm.opts.interval_ns : 1));
    if (!p->ring) {
        free(p);
        return NULL;
    }
    return p;
}

static int same_opts_for_peers(const struct pm_opts *a, const struct pm_opts *b)
{
    return a->window_ns == b->window_ns && a->interval_ns == b->interval_ns && a->deadline_max_ns == b->deadline_max_ns
           && a->grace_ns == b->grace_ns;
}

static int same_opts_for_sockets(const struct pm_opts *a, const struct pm_opts *b)
{
    return a->port == b->port && a->dscp == b->dscp && a->hw == b->hw && a->txts == b->txts;
}

static void apply_commit(void)
{
    commit_pending = 0;
    if (stage.error[0] || !opts_valid(&stage.opts)) {
        error_line(stage.error[0] ? stage.error : "invalid options");
        stage.active = 0;
        return;
    }
    struct pm_opts old_opts = pm.opts;
    int had_config = pm.opts.window_ns != 0;
    int keep_sockets = had_config && same_opts_for_sockets(&old_opts, &stage.opts);
    int keep_peers = had_config && same_opts_for_peers(&old_opts, &stage.opts) && keep_sockets;
    pm.opts = stage.opts;
    int64_t now = pm_now_mono();

    struct pm_nic *nics[PM_MAX_NICS] = {0};
    int kept[PM_MAX_NICS] = {0};
    for (int i = 0; keep_sockets && i < stage.nnics; i++) {
        const struct staged_nic *sn = &stage.nics[i];
        for (int j = 0; j < pm.nnics; j++) {
            struct pm_nic *o = pm.nics[j];
            if (o && !strcmp(o->name, sn->name) && !strcmp(o->ifname, sn->ifname) && o->addr == sn->addr
                && o->sport_first == sn->sport_first && o->sport_count == sn->sport_count) {
                nics[i] = o;
                kept[i] = 1;
                pm.nics[j] = NULL;
                break;
            }
        }
    }
    for (int j = 0; j < pm.nnics; j++) {
        nic_free(pm.nics[j]); /* changed or gone: closed before new sockets bind the same ports */
        pm.nics[j] = NULL;
    }
    for (int i = 0; i < stage.nnics; i++) {
        if (!nics[i])
            nics[i] = nic_new(&stage.nics[i], i);
        if (!nics[i]) {
            error_line("out of memory");
            continue;
        }
        if (!keep_peers)
            nics[i]->next_emit = 0;
    }
    int nnics = 0;
    for (int i = 0; i < stage.nnics; i++) {
        if (!nics[i])
            continue;
        struct pm_nic *nic = pm.nics[nnics] = nics[i];
        nic->index = (uint32_t)i; /* the configuration's index, as the agent numbered it */
        if (nic->resp)
            nic->resp->nic = nnics;
        for (int k = 0; nic->sports && k < nic->sport_count; k++)
            if (nic->sports[k])
                nic->sports[k]->nic = nnics;
        nnics++;
    }
    pm.nnics = nnics;

    struct pm_peer **peers = calloc((size_t)stage.npeers + 1, sizeof *peers);
    int npeers = 0;
    for (int i = 0; peers && i < stage.npeers; i++) {
        const struct staged_peer *sp = &stage.peers[i];
        if (sp->nic < 0 || sp->nic >= stage.nnics || !nics[sp->nic])
            continue;
        int nic_index = -1;
        for (int k = 0; k < pm.nnics; k++)
            if (pm.nics[k] == nics[sp->nic])
                nic_index = k;
        struct pm_peer *p = NULL;
        for (int j = 0; keep_peers && kept[sp->nic] && j < pm.npeers; j++) {
            struct pm_peer *o = pm.peers[j];
            if (o && o->addr == sp->addr && !strcmp(o->name, sp->name) && !strcmp(o->nic_name, nics[sp->nic]->name)) {
                p = o;
                pm.peers[j] = NULL;
                break;
            }
        }
        if (!p)
            p = peer_new(sp, nics[sp->nic], nic_index, now);
        if (!p)
            continue;
        p->nic = nic_index;
        p->index = (uint32_t)i;
        peers[npeers++] = p;
    }
    for (int j = 0; j < pm.npeers; j++)
        pm_peer_free(pm.peers[j]);
    free(pm.peers);
    pm.peers = peers;
    pm.npeers = npeers;
    pm_sessions_rebuild();
    pm_heap_rebuild();
    stage.active = 0;

    pm_out("{\"ev\":\"config\",\"peers\":%d,\"nics\":[", pm.npeers);
    for (int i = 0; i < pm.nnics; i++) {
        struct pm_nic *nic = pm.nics[i];
        int sockets = (nic->resp ? 1 : 0) + (nic->sports ? nic->sport_count : 0);
        pm_out("%s{\"i\":%d,\"hw\":%d,\"responder\":%s,\"probing\":%s,\"sockets\":%d,\"errors\":", i ? "," : "", i,
               nic->hw, nic->resp ? "true" : "false", nic->sports ? "true" : "false", sockets);
        pm_out_json_str(nic->errors);
        pm_out("}");
    }
    pm_out("]}\n");
}

/* -- control lines ------------------------------------------------------------------------- */

static void handle_line(char *line)
{
    char *argv[8];
    int argc = 0;
    for (char *tok = strtok(line, " "); tok && argc < 8; tok = strtok(NULL, " "))
        argv[argc++] = tok;
    if (!argc)
        return;
    const char *cmd = argv[0];
    if (!strcmp(cmd, "reset")) {
        free(stage.peers);
        memset(&stage, 0, sizeof stage);
        stage.active = 1;
        stage.opts = pm.opts;
    } else if (!strcmp(cmd, "opt") && argc == 3 && stage.active) {
        handle_opt(argv[1], strtoll(argv[2], NULL, 10));
    } else if (!strcmp(cmd, "nic") && argc == 7 && stage.active) {
        int i = atoi(argv[1]);
        if (i != stage.nnics || i >= PM_MAX_NICS) {
            stage_error("nic lines must come in order, at most 16");
            return;
        }
        struct staged_nic *n = &stage.nics[i];
        memset(n, 0, sizeof *n);
        if (!parse_name(argv[2], n->name))
            stage_error("bad nic name");
        if (strcmp(argv[3], "-") && strlen(argv[3]) < IFNAMSIZ)
            snprintf(n->ifname, sizeof n->ifname, "%s", argv[3]);
        if (inet_pton(AF_INET, argv[4], &n->addr) != 1)
            stage_error("bad nic address");
        n->sport_first = atoi(argv[5]);
        n->sport_count = atoi(argv[6]);
        if (n->sport_first < 1 || n->sport_count < 1 || n->sport_count > PM_MAX_SPORTS
            || n->sport_first + n->sport_count > 65536)
            stage_error("bad source ports");
        stage.nnics++;
    } else if (!strcmp(cmd, "peer") && argc == 5 && stage.active) {
        if (atoi(argv[1]) != stage.npeers || stage.npeers >= PM_MAX_PEERS) {
            stage_error("peer lines must come in order, at most 8192");
            return;
        }
        if (stage.npeers == stage.cap) {
            int cap = stage.cap ? stage.cap * 2 : 64;
            struct staged_peer *np = realloc(stage.peers, (size_t)cap * sizeof *np);
            if (!np) {
                stage_error("out of memory");
                return;
            }
            stage.peers = np;
            stage.cap = cap;
        }
        struct staged_peer *p = &stage.peers[stage.npeers];
        memset(p, 0, sizeof *p);
        p->nic = atoi(argv[2]);
        if (p->nic < 0 || p->nic >= stage.nnics)
            stage_error("peer of an unknown nic");
        if (!parse_name(argv[3], p->name))
            stage_error("bad peer name");
        if (inet_pton(AF_INET, argv[4], &p->addr) != 1)
            stage_error("bad peer address");
        stage.npeers++;
    } else if (!strcmp(cmd, "commit") && stage.active) {
        commit_pending = 1;
    } else if (!strcmp(cmd, "clock") && argc == 3) {
        pm.clock_offset = strtoll(argv[1], NULL, 10);
        pm.synced = atoi(argv[2]) ? 1 : 0;
    } else if (!strcmp(cmd, "trace") && argc == 5) {
        pm_trace((uint32_t)strtoul(argv[1], NULL, 10), atoi(argv[2]), atoi(argv[3]), atoi(argv[4]));
    } else if (!strcmp(cmd, "quit")) {
        pm.running = 0;
    } else {
        char msg[96];
        snprintf(msg, sizeof msg, "bad control line: %.60s", cmd);
        error_line(msg);
    }
}

static char in_buf[1 << 16];
static size_t in_len;

static void read_stdin(void)
{
    for (;;) {
        ssize_t n = read(STDIN_FILENO, in_buf + in_len, sizeof in_buf - in_len);
        if (n == 0) {
            pm.running = 0; /* the agent closed the pipe */
            return;
        }
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return;
        }
        in_len += (size_t)n;
        size_t start = 0;
        for (size_t i = 0; i < in_len; i++) {
            if (in_buf[i] == '\n') {
                in_buf[i] = 0;
                handle_line(in_buf + start);
                start = i + 1;
            }
        }
        memmove(in_buf, in_buf + start, in_len - start);
        in_len -= start;
        if (in_len == sizeof in_buf) {
            error_line("control line too long");
            in_len = 0;
        }
    }
}

static void emit_stats(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    long long cpu_ns = (long long)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000000LL
                       + (long long)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1000LL;
    pm_out("{\"ev\":\"stats\",\"sent\":%llu,\"echoes\":%llu,\"answered_probes\":%llu,\"stale_echoes\":%llu,"
           "\"tx_stamps\":%llu,\"send_errors\":%llu,\"skipped\":%llu,\"bad_packets\":%llu,\"traces\":%llu,"
           "\"hops\":%llu,\"windows\":%llu,\"windows_skipped\":%llu,\"out_dropped\":%llu,\"cpu_ns\":%lld,"
           "\"peers\":%d,\"nics\":%d}\n",
           (unsigned long long)pm.st.sent, (unsigned long long)pm.st.echoes,
           (unsigned long long)pm.st.answered_probes, (unsigned long long)pm.st.stale_echoes,
           (unsigned long long)pm.st.tx_stamps, (unsigned long long)pm.st.send_errors,
           (unsigned long long)pm.st.skipped, (unsigned long long)pm.st.bad_packets,
           (unsigned long long)pm.st.traces, (unsigned long long)pm.st.hops, (unsigned long long)pm.st.windows,
           (unsigned long long)pm.st.windows_skipped, (unsigned long long)pm.st.out_dropped, cpu_ns, pm.npeers,
           pm.nnics);
}

static void raise_fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--version")) {
        printf("lockstep-probed %s wire %d\n", PM_VERSION_STRING, PM_WIRE_VERSION);
        return 0;
    }
    signal(SIGPIPE, SIG_IGN);
    raise_fd_limit();
    pm.running = 1;
    pm.epfd = epoll_create1(EPOLL_CLOEXEC);
    if (pm.epfd < 0) {
        perror("epoll_create1");
        return 1;
    }
    fcntl(STDIN_FILENO, F_SETFL, fcntl(STDIN_FILENO, F_GETFL) | O_NONBLOCK);
    fcntl(STDOUT_FILENO, F_SETFL, fcntl(STDOUT_FILENO, F_GETFL) | O_NONBLOCK);
    static int stdin_tag, stdout_tag;
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &stdin_tag};
    epoll_ctl(pm.epfd, EPOLL_CTL_ADD, STDIN_FILENO, &ev);
    pm_out("{\"ev\":\"ready\",\"version\":\"%s\",\"wire\":%d,\"pid\":%d}\n", PM_VERSION_STRING, PM_WIRE_VERSION,
           (int)getpid());
    int out_watched = 0;
    int64_t next_stats = pm_now_mono() + 1000000000LL, next_expire = next_stats, next_tick = pm_now_mono();
    enum { MAX_EVENTS = 1024 };
    static struct epoll_event events[MAX_EVENTS];
    while (pm.running) {
        pm_out_flush();
        if (pm_out_pending() != out_watched) {
            struct epoll_event oe = {.events = EPOLLOUT, .data.ptr = &stdout_tag};
            epoll_ctl(pm.epfd, out_watched ? EPOLL_CTL_DEL : EPOLL_CTL_ADD, STDOUT_FILENO, &oe);
            out_watched = !out_watched;
        }
        /* The loop runs once per tick (TICK_NS), asleep in between: packets wait in their
         * sockets and are all taken at once, probes go out in the tick they fall due. Every
         * time that matters is a kernel stamp, so this costs no accuracy (a responder's wait
         * is its turnaround, taken out of the round trip) and saves a wakeup per packet. */
        int64_t now = pm_now_mono();
        if (next_tick > now) {
            struct timespec until = {(time_t)(next_tick / 1000000000LL), (long)(next_tick % 1000000000LL)};
            clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &until, NULL);
        }
        /* every socket that is ready is read before any probe is finalized: an echo waiting in
         * a socket must not be counted lost because another socket was served first */
        for (int round = 0; round < 16; round++) {
            struct timespec to = {0, 0};
            int n = epoll_pwait2(pm.epfd, events, MAX_EVENTS, &to, NULL);
            if (n < 0) {
                if (errno == EINTR)
                    break;
                perror("epoll_pwait2");
                return 1;
            }
            /* TX stamps and errors before data, so an echo finds its probe's stamp */
            for (int i = 0; i < n; i++) {
                void *tag = events[i].data.ptr;
                if (tag == &stdin_tag || tag == &stdout_tag)
                    continue;
                struct pm_sock *s = tag;
                if (events[i].events & EPOLLERR) {
                    if (s->kind == PM_SOCK_PROBER)
                        pm_prober_errqueue(s);
                    else
                        pm_responder_errqueue(s);
                }
            }
            for (int i = 0; i < n; i++) {
                void *tag = events[i].data.ptr;
                if (tag == &stdin_tag) {
                    read_stdin();
                    continue;
                }
                if (tag == &stdout_tag)
                    continue;
                struct pm_sock *s = tag;
                if (events[i].events & EPOLLIN) {
                    if (s->kind == PM_SOCK_PROBER)
                        pm_prober_read(s);
                    else
                        pm_responder_read(s);
                }
            }
            if (commit_pending)
                apply_commit(); /* outside the event batch: sockets may close */
            if (n < MAX_EVENTS)
                break;
        }
        now = pm_now_mono();
        pm_prober_send_due(now);
        pm_prober_tick(now);
        if (pm.opts.window_ns)
            pm_emit_windows(pm_window_clock());
        next_tick += TICK_NS;
        if (next_tick <= now)
            next_tick = now + TICK_NS; /* we were not scheduled for a while: no catch-up ticks */
        if (now >= next_stats) {
            emit_stats();
            next_stats = now + 1000000000LL;
        }
        if (now >= next_expire) {
            for (int i = 0; i < pm.nnics; i++)
                pm_flows_expire(pm.nics[i], now);
            next_expire = now + 5000000000LL;
        }
    }
    pm_out_flush();
    return 0;
}
