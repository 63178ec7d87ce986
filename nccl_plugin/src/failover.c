/* Path health and the failover policy: a path dies on a socket error, on carrier loss seen
 * through netlink, or when nothing arrived on it for LOCKSTEP_NCCL_HEARTBEAT_MS; the connector
 * then moves data to the first live path (unacknowledged chunks are resent), reconnects dead
 * paths with back-off for ever, and fails back to a better path once it stayed up for
 * LOCKSTEP_NCCL_FAILBACK_STABLE_MS. No path at all for LOCKSTEP_NCCL_GIVEUP_MS is the only
 * fault NCCL hears of (ncclSystemError). */
#include <errno.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "plugin.h"

#ifndef IFF_LOWER_UP
#define IFF_LOWER_UP 0x10000 /* linux/if.h: the driver signals carrier (net/if.h lacks it) */
#endif

int ls_netlink_open(void) {
    int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, NETLINK_ROUTE);
    if (fd < 0) return -1;
    struct sockaddr_nl sa = {.nl_family = AF_NETLINK, .nl_groups = RTMGRP_LINK};
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

int ls_carrier(const char *ifname) {
    char path[128], buf[8] = "";
    snprintf(path, sizeof path, "/sys/class/net/%s/carrier", ifname);
    FILE *f = fopen(path, "r");
    if (!f) return 1; /* unknown: assume up, sockets will tell */
    int up = fgets(buf, sizeof buf, f) && buf[0] == '1';
    fclose(f);
    return up;
}

void ls_netlink_read(ls_comm *c) {
    char buf[8192] __attribute__((aligned(4)));
    for (;;) {
        ssize_t n = recv(c->netlink_fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n <= 0) return;
        for (struct nlmsghdr *h = (struct nlmsghdr *)(void *)buf; NLMSG_OK(h, (unsigned)n); h = NLMSG_NEXT(h, n)) {
            if (h->nlmsg_type != RTM_NEWLINK && h->nlmsg_type != RTM_DELLINK) continue;
            struct ifinfomsg *ifi = NLMSG_DATA(h);
            int up = h->nlmsg_type == RTM_NEWLINK && (ifi->ifi_flags & IFF_UP) && (ifi->ifi_flags & IFF_LOWER_UP);
            for (int p = 0; p < c->npaths; p++) {
                if (c->device.nics[c->paths[p].local_nic].ifindex != ifi->ifi_index) continue;
                int was = c->paths[p].carrier;
                c->paths[p].carrier = up;
                if (was && !up) ls_path_dead(c, p, "carrier lost");
                if (!was && up) c->paths[p].retry_at_ms = 0; /* try it now */
            }
        }
    }
}

static const char *nic_name(const ls_comm *c, int path) {
    return path < 0 ? "none" : c->device.nics[c->paths[path].local_nic].name;
}

static void emit_switch(ls_comm *c, const char *kind, int from, int to, const char *reason) {
    char data[512];
    uint64_t now = ls_now_ms();
    /* silent_ms: how long the old path had been quiet when it was given up (detection time) */
    uint64_t silent = from >= 0 && c->paths[from].last_rx_ms && now > c->paths[from].last_rx_ms
                          ? now - c->paths[from].last_rx_ms : 0;
    snprintf(data, sizeof data,
             "{\"comm\":\"%p\",\"role\":\"%s\",\"device\":%d,\"from\":\"%s\",\"to\":\"%s\",\"reason\":\"%s\","
             "\"unacked_chunks\":%llu,\"silent_ms\":%llu}",
             (void *)c, ls_role(c), c->dev, nic_name(c, from), nic_name(c, to), reason,
             (unsigned long long)(c->seq_next - c->seq_acked), (unsigned long long)silent);
    ls_event(kind, data);
}

static int best_up_path(const ls_comm *c, int except) {
    for (int p = 0; p < c->npaths; p++)
        if (p != except && c->paths[p].state == LS_PATH_UP) return p;
    return -1;
}

void ls_path_dead(ls_comm *c, int path, const char *reason) {
    ls_path *p = &c->paths[path];
    if (p->state == LS_PATH_DOWN) return;
    for (int s = 0; s < LS_MAX_STREAMS; s++) ls_stream_close(c, &p->streams[s]);
    int was_up = p->state == LS_PATH_UP;
    p->state = LS_PATH_DOWN;
    uint64_t now = ls_now_ms();
    p->retry_at_ms = now + (uint64_t)p->backoff_ms;
    p->backoff_ms = p->backoff_ms * 2 > ls_cfg.failback_max_ms ? ls_cfg.failback_max_ms : p->backoff_ms * 2;
    if (ls_cfg.debug && !was_up) LS_INFO("%s comm %p: path %d attempt failed (%s)", ls_role(c), (void *)c, path, reason);
    if (was_up) {
        LS_INFO("%s comm %p: path %s down (%s)", ls_role(c), (void *)c, nic_name(c, path), reason);
        ls_event_path_state(c, path, "down", reason);
    }
    if (c->is_send && path == c->active) {
        int to = best_up_path(c, path);
        c->active = to;
        c->seq_unsent = c->seq_acked; /* everything unacknowledged goes again, over `to` */
        c->held = 0;                  /* (not held back for a batch: the thread writes it) */
        c->resent_chunks += c->seq_next - c->seq_acked;
        c->failovers++;
        c->failover_started_ms = now;
        if (c->seq_next > c->seq_acked) /* data was waiting: time the gap until it moves again */
            c->ack_before_failover_ms = c->last_ack_ms ? c->last_ack_ms : now;
        LS_INFO("send comm %p: failover %s -> %s (%s)", (void *)c, nic_name(c, path), nic_name(c, to), reason);
        emit_switch(c, "nccl.failover", path, to, reason);
    }
    if (best_up_path(c, -1) < 0) {
        if (!c->no_path_since_ms) c->no_path_since_ms = now;
        /* no path at all: every path is tried again at the shortest back-off until one is up */
        for (int i = 0; i < c->npaths; i++) {
            c->paths[i].backoff_ms = ls_cfg.failback_min_ms;
            if (c->paths[i].state == LS_PATH_DOWN && c->paths[i].retry_at_ms > now + (uint64_t)ls_cfg.failback_min_ms)
                c->paths[i].retry_at_ms = now + (uint64_t)ls_cfg.failback_min_ms;
        }
    }
}

void ls_path_up(ls_comm *c, int path) {
    ls_path *p = &c->paths[path];
    p->state = LS_PATH_UP;
    p->up_since_ms = p->last_rx_ms = ls_now_ms();
    c->no_path_since_ms = 0;
    LS_INFO("%s comm %p: path %s up", ls_role(c), (void *)c, nic_name(c, path));
    ls_event_path_state(c, path, "up", "connected");
    if (c->is_send && c->active < 0) {
        c->active = path;
        c->seq_unsent = c->seq_acked;
        c->held = 0;
        emit_switch(c, "nccl.failover", -1, path, "path up");
    }
}

void ls_path_start_connect(ls_comm *c, int path) {
    ls_path *p = &c->paths[path];
    if (!p->peer_port) return;
    p->state = LS_PATH_CONNECTING;
    p->connect_started_ms = ls_now_ms();
    int nstreams = c->established ? p->nstreams : 1; /* before the HELLO_ACK only the listener is known */
    for (int s = 0; s < nstreams; s++) ls_stream_open(c, path, s, p->peer_addr, p->peer_port);
    if (ls_cfg.debug) LS_INFO("%s comm %p: connecting path %d", ls_role(c), (void *)c, path);
    if (p->streams[0].fd < 0) ls_path_dead(c, path, "connect failed");
}

/* Time from t to now; 0 when t is later (a path that died or came up within this tick stamps
 * the clock after `now` was read: unsigned, that would be an age of 584 million years, and an
 * instant give-up). */
static uint64_t since(uint64_t now, uint64_t t) { return now > t ? now - t : 0; }

void ls_paths_tick(ls_comm *c, uint64_t now) {
    /* Heartbeats every quarter of LOCKSTEP_NCCL_HEARTBEAT_MS; a path that was silent (no data,
     * ack or heartbeat) for three quarters of it is dead, so with the poll granularity and a
     * late wake-up detection still fits in the configured time. */
    uint64_t hb_every = (uint64_t)ls_cfg.heartbeat_ms / 4, silent_max = (uint64_t)ls_cfg.heartbeat_ms * 3 / 4;
    /* Time this thread did not run (a starved process: poll returns every 1/20 of the threshold
     * otherwise) is not silence of the paths: their stamps move on by it. What arrived meanwhile
     * was read by the pass just before; only a peer that sent nothing counts. */
    uint64_t gap = since(now, c->last_tick_ms);
    if (c->last_tick_ms && gap > hb_every)
        for (int i = 0; i < c->npaths; i++)
            if (c->paths[i].state == LS_PATH_UP) c->paths[i].last_rx_ms += gap - hb_every;
    c->last_tick_ms = now;
    for (int i = 0; i < c->npaths; i++) {
        ls_path *p = &c->paths[i];
        if (p->state == LS_PATH_UP) {
            if (since(now, p->last_rx_ms) > silent_max) {
                ls_path_dead(c, i, "heartbeat missed");
                continue;
            }
            if (since(now, p->last_hb_ms) >= hb_every) {
                p->last_hb_ms = now;
                ls_queue_on_path(c, i, LS_HEARTBEAT, c->is_send ? 0 : c->cum, NULL, 0);
            }
            if (since(now, p->up_since_ms) >= (uint64_t)ls_cfg.failback_stable_ms) p->backoff_ms = ls_cfg.failback_min_ms;
        } else if (p->state == LS_PATH_CONNECTING) {
            if (since(now, p->connect_started_ms) > (uint64_t)ls_cfg.connect_timeout_ms) ls_path_dead(c, i, "connect timed out");
        } else if (c->is_send && !p->carrier && since(now, p->carrier_checked_ms) >= 500) {
            /* netlink may have dropped the "up" (a full socket buffer while links flap): ask sysfs */
            p->carrier_checked_ms = now;
            p->carrier = ls_carrier(c->device.nics[p->local_nic].name);
        } else if (c->is_send && p->carrier && now >= p->retry_at_ms && (c->established || i == 0)) {
            ls_path_start_connect(c, i);
        }
    }
    if (c->is_send && c->active > 0) { /* fail back to a better path that has stayed up */
        for (int i = 0; i < c->active; i++) {
            ls_path *p = &c->paths[i];
            if (p->state == LS_PATH_UP && since(now, p->up_since_ms) >= (uint64_t)ls_cfg.failback_stable_ms) {
                int from = c->active;
                c->active = i;
                c->failbacks++;
                LS_INFO("send comm %p: failback %s -> %s", (void *)c, nic_name(c, from), nic_name(c, i));
                emit_switch(c, "nccl.failback", from, i, "path stable");
                break;
            }
        }
    }
    int none = best_up_path(c, -1) < 0;
    if (none && c->no_path_since_ms && since(now, c->no_path_since_ms) > (uint64_t)ls_cfg.giveup_ms &&
        c->error == ncclSuccess) {
        LS_WARN("%s comm %p: no path left for %d ms; giving up", ls_role(c), (void *)c, ls_cfg.giveup_ms);
        ls_event_path_state(c, -1, "failed", "no path left");
        c->error = ncclSystemError;
    }
}
