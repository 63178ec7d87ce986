/*
 * Throughput and latency of libnccl-net-lockstep.so against plain TCP between the same two
 * namespaces, with the same message sizes and depth (NCCL's 32 outstanding requests).
 *
 *   tput plugin LIB DIR a|b SIZE ITERS bw|lat     (b: the far side; handles go through DIR)
 *   tput tcp ADDR PORT a|b SIZE ITERS bw|lat      (b listens on ADDR:PORT, a connects)
 *
 * bw: a sends ITERS messages, b answers one byte after the last; a prints MB/s (after an untimed
 * warm-up of ITERS/10 messages or 32 MiB, answered the same way).
 * lat: ping-pong of SIZE bytes ITERS times; a prints the median one-way time in us.
 * The plugin connection is two comms (a->b, b->a), as NCCL uses one per direction.
 */
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "lockstep_nccl_net.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void die(const char *what) {
    fprintf(stderr, "tput: %s\n", what);
    exit(1);
}

#define CHECK(call) do { if ((call) != ncclSuccess) die(#call); } while (0)

static const ncclNet_v12_t *net;

static void wait_req(void *req) {
    int done = 0, size[8];
    while (!done) CHECK(net->test(req, &done, size));
}

static void *post_send(void *comm, void *buf, size_t size) {
    void *req = NULL;
    while (!req) CHECK(net->isend(comm, buf, size, 1, NULL, NULL, &req));
    return req;
}

static void *post_recv(void *comm, void *buf, size_t size) {
    void *req = NULL;
    int tag = 1;
    void *mh = NULL;
    while (!req) CHECK(net->irecv(comm, 1, &buf, &size, &tag, &mh, NULL, &req));
    return req;
}

static void handle_io(const char *dir, const char *name, char *handle, int write) {
    char path[512], tmp[520];
    snprintf(path, sizeof path, "%s/handle.%s", dir, name);
    if (write) {
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        FILE *f = fopen(tmp, "wb");
        if (!f || fwrite(handle, 1, NCCL_NET_HANDLE_MAXSIZE, f) != NCCL_NET_HANDLE_MAXSIZE) die("write handle");
        fclose(f);
        rename(tmp, path);
        return;
    }
    for (;;) {
        FILE *f = fopen(path, "rb");
        if (f) {
            size_t n = fread(handle, 1, NCCL_NET_HANDLE_MAXSIZE, f);
            fclose(f);
            if (n == NCCL_NET_HANDLE_MAXSIZE) return;
        }
        usleep(1000);
    }
}

/* bw: a sends `iters` messages with NCCL's 32 outstanding requests, b receives them and answers
 * one byte after the last. */
static void plugin_bw(void *scomm, void *rcomm, char *buf, char *small, int is_a, size_t size, int iters) {
    void *reqs[NCCL_NET_MAX_REQUESTS];
    int posted = 0, done = 0;
    while (done < iters) {
        while (posted < iters && posted - done < NCCL_NET_MAX_REQUESTS) {
            reqs[posted % NCCL_NET_MAX_REQUESTS] = is_a ? post_send(scomm, buf, size) : post_recv(rcomm, buf, size);
            posted++;
        }
        wait_req(reqs[done % NCCL_NET_MAX_REQUESTS]);
        done++;
    }
    wait_req(is_a ? post_recv(rcomm, small, 64) : post_send(scomm, small, 1));
}

/* Both transports first move a tenth of the data, and at least 32 MiB, untimed: buffers, the
 * plugin's 16 MiB ring and sockets reach their steady state (first-touch page faults, TCP
 * windows), as in a long NCCL job. */
static int warmup_iters(int iters, size_t size) {
    size_t by_bytes = (32u << 20) / (size ? size : 1);
    return (int)((size_t)iters / 10 > by_bytes ? (size_t)iters / 10 : by_bytes);
}

static void run_plugin(const char *lib, const char *dir, int is_a, size_t size, int iters, int lat) {
    void *dl = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!dl) die(dlerror());
    net = dlsym(dl, "ncclNetPlugin_v12");
    if (!net) die("no ncclNetPlugin_v12");
    void *ctx = NULL;
    CHECK(net->init(&ctx, 1, NULL, NULL, NULL));
    char mine[NCCL_NET_HANDLE_MAXSIZE], theirs[NCCL_NET_HANDLE_MAXSIZE];
    void *lcomm = NULL, *scomm = NULL, *rcomm = NULL;
    CHECK(net->listen(ctx, 0, mine, &lcomm));
    handle_io(dir, is_a ? "a" : "b", mine, 1);
    handle_io(dir, is_a ? "b" : "a", theirs, 0);
    while (!scomm || !rcomm) {
        if (!scomm) CHECK(net->connect(ctx, 0, theirs, &scomm, NULL));
        if (!rcomm) CHECK(net->accept(lcomm, &rcomm, NULL));
    }
    CHECK(net->closeListen(lcomm));
    char *buf = malloc(size ? size : 1), *small = malloc(64);
    memset(buf, 0x5a, size ? size : 1);
    if (!lat) {
        plugin_bw(scomm, rcomm, buf, small, is_a, size, warmup_iters(iters, size)); /* untimed */
        double t0 = now_s();
        plugin_bw(scomm, rcomm, buf, small, is_a, size, iters);
        if (is_a)
            printf("{\"mode\":\"plugin\",\"size\":%zu,\"iters\":%d,\"MBps\":%.1f}\n", size, iters,
                   (double)size * iters / (now_s() - t0) / 1e6);
    } else {
        double *rtt = calloc((size_t)iters, sizeof *rtt);
        for (int i = 0; i < iters; i++) {
            double t0 = now_s();
            if (is_a) {
                void *r = post_recv(rcomm, buf, size); /* posted first, as NCCL does */
                wait_req(post_send(scomm, buf, size));
                wait_req(r);
            } else {
                wait_req(post_recv(rcomm, buf, size));
                wait_req(post_send(scomm, buf, size));
            }
            rtt[i] = now_s() - t0;
        }
        if (is_a) {
            qsort(rtt, (size_t)iters, sizeof *rtt, cmp_double);
            printf("{\"mode\":\"plugin\",\"size\":%zu,\"iters\":%d,\"one_way_us\":%.1f}\n", size, iters,
                   rtt[iters / 2] / 2 * 1e6);
        }
        free(rtt);
    }
    usleep(200000); /* let the last acks land before the far side closes */
    CHECK(net->closeSend(scomm));
    CHECK(net->closeRecv(rcomm));
    CHECK(net->finalize(ctx));
    free(buf);
    free(small);
    dlclose(dl);
}

static void full(int fd, char *buf, size_t len, int rx) {
    while (len) {
        ssize_t n = rx ? recv(fd, buf, len, 0) : send(fd, buf, len, MSG_NOSIGNAL);
        if (n <= 0) die(rx ? "recv" : "send");
        buf += n;
        len -= (size_t)n;
    }
}

static void run_tcp(const char *addr, int port, int is_a, size_t size, int iters, int lat) {
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, addr, &sa.sin_addr);
    int fd, one = 1;
    if (is_a) {
        for (;;) {
            fd = socket(AF_INET, SOCK_STREAM, 0);
            if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) break;
            close(fd);
            usleep(10000);
        }
    } else {
        int l = socket(AF_INET, SOCK_STREAM, 0);
        setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(l, (struct sockaddr *)&sa, sizeof sa) || listen(l, 1)) die("listen");
        fd = accept(l, NULL, NULL);
        close(l);
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    char *buf = malloc(size ? size : 1), small[1] = {1};
    memset(buf, 0x5a, size ? size : 1);
    if (!lat) {
        for (int i = 0; i < warmup_iters(iters, size); i++) full(fd, buf, size, !is_a); /* untimed */
        full(fd, small, 1, is_a);
        double t0 = now_s();
        for (int i = 0; i < iters; i++) full(fd, buf, size, !is_a);
        full(fd, small, 1, is_a);
        if (is_a)
            printf("{\"mode\":\"tcp\",\"size\":%zu,\"iters\":%d,\"MBps\":%.1f}\n", size, iters,
                   (double)size * iters / (now_s() - t0) / 1e6);
    } else {
        double *rtt = calloc((size_t)iters, sizeof *rtt);
        for (int i = 0; i < iters; i++) {
            double t0 = now_s();
            full(fd, buf, size, !is_a);
            full(fd, buf, size, is_a);
            rtt[i] = now_s() - t0;
        }
        if (is_a) {
            qsort(rtt, (size_t)iters, sizeof *rtt, cmp_double);
            printf("{\"mode\":\"tcp\",\"size\":%zu,\"iters\":%d,\"one_way_us\":%.1f}\n", size, iters,
                   rtt[iters / 2] / 2 * 1e6);
        }
        free(rtt);
    }
    close(fd);
    free(buf);
}

int main(int argc, char **argv) {
    if (argc != 8) die("usage: tput plugin LIB DIR a|b SIZE ITERS bw|lat | tput tcp ADDR PORT a|b SIZE ITERS bw|lat");
    int is_a = strcmp(argv[4], "a") == 0, lat = strcmp(argv[7], "lat") == 0;
    size_t size = (size_t)atol(argv[5]);
    int iters = atoi(argv[6]);
    if (strcmp(argv[1], "plugin") == 0)
        run_plugin(argv[2], argv[3], is_a, size, iters, lat);
    else
        run_tcp(argv[2], atoi(argv[3]), is_a, size, iters, lat);
    return 0;
}
