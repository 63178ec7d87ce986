/*
 * Internal interface of libnccl-net-lockstep.so, shared by its files:
 *
 *   abi.c        the exported ncclNetPlugin_v8..v12 tables; v8..v11 are shims over the v12 calls
 *   net.c        the one implementation: init, devices, properties, listen/connect/accept,
 *                isend/irecv/test, close, finalize (called on NCCL's proxy thread; never blocks)
 *   config.c     LOCKSTEP_NCCL_* variables, device discovery (LOCKSTEP_NCCL_NICS, PCIe affinity,
 *                every up interface), logging through NCCL's logger
 *   transport.c  TCP sockets bound to a NIC, non-blocking connect/accept, the wire frames
 *   conn.c       connection state and the per-comm progress thread: streams, chunks, acks,
 *                credits, receive placement and dedup
 *   failover.c   path health (heartbeats, socket errors, netlink carrier), failover, failback
 *                probing with back-off, giving up when no path is left
 *   events.c     failover/failback/path-state events to the local agent socket (non-blocking)
 *
 * Design in one paragraph (nccl_plugin/README.md has the long form): a connection is a set of
 * paths, one per NIC of the device (primary first, then standbys); each path has several TCP
 * streams. Data moves only over the active path as sequence-numbered chunks; the receiver acks
 * cumulatively and drops duplicates, so when the active path dies every unacknowledged chunk is
 * resent over the next live path. The receiver tells the sender about each posted receive
 * (a credit: sizes and tags); a message sent before its receive is known waits in the
 * receiver's bounded eager buffer (the sender charges it there until the receiver says it
 * matched it), so every socket is read all the time, which keeps heartbeats flowing under load.
 */
#ifndef LOCKSTEP_NCCL_PLUGIN_H
#define LOCKSTEP_NCCL_PLUGIN_H

#include <net/if.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <stddef.h>

#include "lockstep_nccl_net.h"

#define LS_MAX_DEVS 16
#define LS_MAX_NICS 4      /* per device: primary + standbys */
#define LS_MAX_STREAMS 8   /* per path */
#define LS_MAX_RECVS 8     /* buffers of one grouped receive */
#define LS_MAX_REQS NCCL_NET_MAX_REQUESTS
#define LS_WINDOW 1024     /* chunks in flight (sent, not yet acknowledged) per comm */
#define LS_MAX_MSGS 1024   /* isends posted and not yet acknowledged, per comm */
#define LS_TXQ 16          /* data frames one stream writes with one sendmsg */
#define LS_CORK_BYTES (64u << 10) /* an isend holds ring messages back below LS_TXQ frames and this (test() writes them) */
#define LS_RX_STAGE 32768  /* a stream's read buffer: many small frames per recv */
#define LS_ACK_CHUNKS 32   /* the receiver acks at least every this many chunks ... */
#define LS_ACK_US 200      /* ... or this often while chunks arrive */
#define LS_ACK_BYTES (256u << 10) /* ... or every this many bytes: a zero-copy isend waits for its ack */
#define LS_SENDER_READ_US 500 /* a sender's isends read its active path at least this often */
#define LS_CALLER_HOT_US 200  /* NCCL called this recently: the progress thread does not queue on the lock behind it */
#define LS_EMPTY_RETRY_US 20  /* NCCL's calls skip re-reading a socket found empty this recently (not test() on stream 0) */

/* ---- config.c ---- */
typedef struct {
    char name[IF_NAMESIZE];
    int ifindex;
    struct in_addr addr;
    char pci_path[256]; /* realpath of /sys/class/net/<name>/device, "" for virtual NICs */
    int speed_mbps;
} ls_nic;

typedef struct {
    int nnics; /* nics[0] is the primary */
    ls_nic nics[LS_MAX_NICS];
} ls_device;

typedef struct {
    int ndevs;
    ls_device devs[LS_MAX_DEVS];
    int heartbeat_ms;
    int streams;
    size_t chunk_bytes;
    size_t retransmit_bytes;
    size_t eager_bytes;
    size_t zerocopy_bytes; /* isends of at least this many bytes go from NCCL's buffer, done on the ack */
    int giveup_ms;
    int connect_timeout_ms;
    int failback_min_ms;
    int failback_max_ms;
    int failback_stable_ms;
    char agent_socket[108];
    int debug;
} ls_config;

extern ls_config ls_cfg;
ncclResult_t ls_config_load(ncclDebugLogger_t logger);
void ls_log(ncclDebugLogLevel level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define LS_WARN(...) ls_log(NCCL_LOG_WARN, __FILE__, __LINE__, __VA_ARGS__)
#define LS_INFO(...) ls_log(NCCL_LOG_INFO, __FILE__, __LINE__, __VA_ARGS__)
uint64_t ls_now_ms(void);
uint64_t ls_now_us(void);

/* ---- transport.c: the wire ---- */
enum {
    LS_HELLO = 1,     /* connector -> acceptor, first frame of every stream */
    LS_HELLO_ACK = 2, /* acceptor -> connector on path 0 stream 0: its per-NIC listeners */
    LS_DATA = 3,
    LS_ACK = 4,       /* a: every seq below it was received */
    LS_CREDIT = 5,    /* a: receive index; payload: n x ls_credit_slot */
    LS_HEARTBEAT = 6, /* a: the receiver's cumulative ack (0 from a sender) */
};
#define LS_MAGIC 0x4c53u /* "LS" in the top half of `type` */

typedef struct {
    uint32_t type;   /* LS_MAGIC << 16 | kind */
    uint32_t len;    /* payload bytes after the header */
    uint64_t a;      /* DATA: seq; ACK/HEARTBEAT: cumulative ack; CREDIT: receive index; HELLO: token */
    uint64_t b;      /* DATA: message size; HELLO: path << 32 | stream */
    uint64_t c;      /* DATA: offset of the chunk in the message; from a receiver: the receive its
                      * matching fills (every one below is full) */
    uint32_t d;      /* DATA: receive index; from a receiver: that receive's buffers taken (bits) */
    uint32_t e;      /* DATA: buffer of that receive; LS_EAGER: not matched when it was cut */
    uint64_t msg;    /* DATA: message number */
    int32_t tag;     /* DATA: the message's tag */
    uint32_t pad;
} ls_hdr;
#define LS_EAGER UINT32_MAX
#define LS_EAGER_OVERHEAD 256 /* charged per eager message on top of its bytes (bounds the count) */

typedef struct {
    uint64_t size;
    int32_t tag;
    int32_t pad;
} ls_credit_slot;

typedef struct {
    uint32_t addr; /* network order */
    uint16_t port; /* network order */
    uint16_t pad;
} ls_wire_addr;

typedef struct {
    uint64_t conn_token; /* names the connection on every later stream */
    uint32_t nnics;
    uint32_t pad;
} ls_hello;

typedef struct {
    uint32_t nnics;
    uint32_t eager_bytes; /* the acceptor's eager buffer: what the connector may send ahead of receives */
    ls_wire_addr listeners[LS_MAX_NICS];
} ls_hello_ack;

/* The 128-byte connection handle listen() fills and connect() reads. */
typedef struct {
    uint32_t magic;
    uint32_t addr; /* the listener's primary address, network order */
    uint16_t port;
    uint16_t pad;
    uint32_t pad2;
    uint64_t listen_token;
    char pad3[40];
    void *connecting; /* connect()'s comm while it is being established (the connector's copy) */
} ls_handle;

int ls_sock_listen(const ls_nic *nic, uint16_t *port_out);
int ls_sock_connect(const ls_nic *local, uint32_t addr, uint16_t port); /* non-blocking; -1 on error */
int ls_sock_connected(int fd); /* 1 connected, 0 in progress, -1 failed */
void ls_sock_abort(int fd);    /* close with RST: nothing queued is delivered later */
uint64_t ls_random64(void);

/* ---- conn.c ---- */
struct ls_comm;

typedef struct {
    struct ls_comm *comm;
    int is_send;
    int used;
    int done;
    /* send */
    size_t size;
    int zerocopy;       /* done on its ack; a ring message's once its last chunk was written */
    /* recv */
    int n;
    uint64_t index;
    void *bufs[LS_MAX_RECVS];
    size_t sizes[LS_MAX_RECVS];
    int tags[LS_MAX_RECVS];
    size_t got[LS_MAX_RECVS];
    size_t total[LS_MAX_RECVS];
    int seen[LS_MAX_RECVS];
    int taken[LS_MAX_RECVS]; /* the receiver's own matching: buffers given a message */
    int ntaken;
} ls_req;

/* A posted isend. Its bytes are in the retransmit ring (`req` completes once its last chunk was
 * handed to a socket, or its stream closed: the ring resends it) or, for a large message, in the
 * caller's buffer (`req` completes on the acks). */
typedef struct {
    char *data;
    size_t size;
    int tag;
    ls_req *req;         /* until it completes (NULL after: NCCL may reuse the request) */
    int in_ring;
    uint64_t ring_end;   /* ring counter past its bytes: the ring is free up to here once it is acked */
    size_t chunk_off;    /* next byte to cut into a chunk */
    int matched;
    int eager;           /* charged to the peer's eager buffer (cut before its receive was known
                          * and before the receiver matched it); released once, on the match */
    uint32_t rindex, slot;
    uint64_t last_seq;   /* valid once every chunk is cut */
    int inflight;        /* its chunks being written right now (its bytes must stay) */
} ls_msg;

typedef struct {
    uint64_t seq;
    uint64_t msg;        /* message number */
    size_t off, len;
    int inflight;        /* being written on an open stream: not taken again until that ends */
    uint64_t msg_size;
    uint32_t rindex, slot;
    int tag;
} ls_chunk;

/* Receiver: a chunk that arrived before its message was matched to a posted receive. Two
 * copies of one chunk read at once (a resend over another stream while the first copy is still
 * coming) share it, so the eager buffer holds each chunk once, as the sender charged it. */
typedef struct ls_eager {
    struct ls_eager *next;
    uint64_t seq;
    size_t off, len;
    size_t cap;             /* bytes of data[] (a kept chunk is reused for a shorter one) */
    int refs;               /* streams reading into it, plus its message's list once complete */
    char data[];
} ls_eager;

typedef struct {
    int fd;
    int hello_done;         /* connector: connect finished, HELLO queued */
    /* rx */
    ls_hdr rx_hdr;
    size_t rx_hdr_got;
    int rx_in_payload;
    char *rx_dest;          /* NULL: into rx_small (control) or discarded */
    size_t rx_left, rx_payload_got;
    int rx_discard;
    ls_eager *rx_eager;     /* the eager chunk being read, NULL when the payload goes elsewhere */
    char rx_small[sizeof(ls_hello_ack) + LS_MAX_RECVS * sizeof(ls_credit_slot)];
    char *rx_stage;         /* LS_RX_STAGE bytes read ahead, [rx_stage_off, rx_stage_len) not parsed yet */
    size_t rx_stage_off, rx_stage_len;
    uint64_t rx_empty_us;   /* the last read found the socket empty (EAGAIN or short) then; 0: it had more */
    int thread_polled;      /* the progress thread's last poll watched this fd for reading ... */
    int thread_ready;       /* ... and it said readable (or error/hang-up) */
    /* tx: control frames at frame boundaries, data frames queued (one sendmsg writes several) */
    char tx_ctrl[65536];
    size_t tx_ctrl_len, tx_ctrl_off;
    int tx_busy;            /* data frames queued */
    int tx_n;
    ls_hdr tx_hdr[LS_TXQ];
    ls_chunk tx_chunk[LS_TXQ];
    size_t tx_done;         /* bytes of tx_chunk[0]'s header + payload written */
} ls_stream;

enum { LS_PATH_DOWN = 0, LS_PATH_CONNECTING, LS_PATH_UP };

typedef struct {
    int state;
    int nstreams;
    ls_stream streams[LS_MAX_STREAMS];
    int local_nic;          /* index into the device's NICs */
    uint32_t peer_addr;     /* connector: the peer listener of this path */
    uint16_t peer_port;
    uint64_t last_rx_ms;
    uint64_t last_hb_ms;
    uint64_t up_since_ms;
    uint64_t retry_at_ms;
    uint64_t connect_started_ms;
    int backoff_ms;
    int carrier;            /* local carrier, from netlink (and sysfs while it is down) */
    uint64_t carrier_checked_ms;
    int listen_fd;          /* acceptor: this path's listener */
    uint16_t listen_port;
} ls_path;

typedef struct ls_comm {
    int is_send;
    int dev;
    ls_device device;
    pthread_t thread;
    int thread_started;
    pthread_mutex_t lock;
    int wake_fd;            /* eventfd: new work for the progress thread */
    int netlink_fd;
    volatile int stop;
    int established;        /* connector: HELLO_ACK seen; acceptor: always */
    ncclResult_t error;     /* sticky: reported by every later call */
    uint64_t created_ms;
    uint64_t conn_token;
    uint64_t listen_token;  /* connector: sent in the first HELLO */
    int npaths;
    ls_path paths[LS_MAX_NICS];
    int active;             /* connector: the path carrying data, -1 while none is up */
    uint64_t no_path_since_ms;
    uint64_t last_tick_ms;  /* the progress thread's previous tick: a longer gap means it was starved */
    uint64_t failover_started_ms;
    uint64_t last_ack_ms;        /* connector: when the cumulative ack last moved */
    uint64_t ack_before_failover_ms; /* set at a failover; 0 once data moves again */
    ls_req reqs[LS_MAX_REQS];
    /* connector */
    ls_msg msgs[LS_MAX_MSGS];
    uint64_t next_msg;      /* isends posted */
    uint64_t next_chunk_msg;/* the message being cut into chunks */
    uint64_t msg_freed;     /* messages before it are acknowledged and gone */
    char *ring;             /* the retransmit ring (LOCKSTEP_NCCL_RETRANSMIT_BYTES), allocated on first use */
    uint64_t ring_head, ring_tail; /* byte counters: [tail, head) holds unacknowledged messages */
    uint64_t seq_next, seq_acked, seq_unsent;
    ls_chunk window[LS_WINDOW];
    uint64_t credits_known;
    struct {
        uint64_t index1;    /* receive index + 1 once known (credits may come out of order) */
        int n;
        ls_credit_slot slots[LS_MAX_RECVS];
        int used[LS_MAX_RECVS];
        int nused;
    } credits[LS_MAX_REQS * 2];
    uint64_t credit_cur;
    uint64_t smatched;      /* messages matched to credits (in order) */
    int resync_pending;     /* the receiver's position named buffers of a credit not known yet */
    uint64_t resync_index;
    uint32_t resync_taken;
    uint64_t peer_eager;    /* the receiver's eager buffer (HELLO_ACK) */
    uint64_t eager_charged; /* bytes of eager messages the receiver has not matched yet */
    uint64_t peer_matched;  /* messages the receiver has matched (ACK/HEARTBEAT/CREDIT `b`) */
    /* acceptor */
    uint64_t recv_next;     /* receives posted */
    uint64_t cum;           /* every seq below was received */
    uint64_t acked_sent;
    uint64_t acked_sent_us;
    uint64_t unacked_bytes; /* payload bytes stored since the last ack */
    int ack_path;           /* where data last arrived: acks go there */
    int ack_now;            /* a duplicate arrived: ack at once (its earlier ack may have been lost) */
    uint8_t seen_bits[LS_WINDOW / 8];
    ls_req *recv_order[LS_MAX_REQS];
    /* eager: messages are matched to receives in message order, as the sender does with credits */
    uint64_t rmatched;      /* messages matched */
    uint64_t rrecv;         /* the receive being filled by the matching */
    size_t eager_held;      /* bytes in eager chunks */
    ls_eager *eager_free;   /* chunks kept for reuse (at most LOCKSTEP_NCCL_EAGER_BYTES of them) */
    size_t eager_free_bytes;
    uint64_t rmatched_sent; /* the count the last ack told the sender */
    struct {
        uint64_t msg1;      /* message number + 1 once its tag and size are known */
        int tag;
        uint64_t size;
        ls_eager *head;     /* its eager chunks */
        ls_req *req;        /* once matched */
        int slot;
    } rmsgs[LS_MAX_MSGS];
    int pending_fds[LS_MAX_NICS * LS_MAX_STREAMS]; /* accepted, HELLO not yet read */
    uint64_t pending_since_ms[LS_MAX_NICS * LS_MAX_STREAMS];
    /* statistics */
    uint64_t caller_pass_us; /* NCCL's last call that moved data itself */
    uint64_t hot_read_us;    /* the hot path was last read (sender: isends skip reads they do not need) */
    int needs_acks;          /* sender: an isend was refused (ring or table full): read the acks */
    int held;                /* sender: an isend held cut chunks back for a batch (hold_batch); none written since */
    int thread_nap_ms;       /* the progress thread's poll timeout now: isends hold chunks back only while it is short */
    int thread_off_hot;      /* the progress thread left the hot path to NCCL's calls in its last poll */
    uint64_t failovers, failbacks, resent_chunks, dup_chunks;
} ls_comm;

ls_comm *ls_comm_new(int is_send, int dev);
int ls_comm_start(ls_comm *c);     /* starts the progress thread */
void ls_comm_free(ls_comm *c);     /* stops the thread, closes everything */
void ls_comm_wake(ls_comm *c);
void ls_msgs_free(ls_comm *c);     /* acknowledged messages give their ring space back */
void ls_rmatch(ls_comm *c);        /* receiver: match known messages to posted receives, copy eager chunks */
enum { LS_PASS_ALL, LS_PASS_HOT, LS_PASS_COLD, LS_PASS_POST }; /* POST: isend/irecv's HOT pass */
void ls_progress_pass(ls_comm *c, int which); /* with the lock held */
int ls_sender_idle(const ls_comm *c, int hot); /* nothing waits to be cut or written on path `hot` */
void ls_ack(ls_comm *c, int flush); /* receiver: the cumulative ack, when due (or pending and `flush`) */
int ls_queue_ctrl(ls_stream *s, uint32_t kind, uint64_t a, uint64_t b, const void *payload, uint32_t len);
void ls_queue_on_path(ls_comm *c, int path, uint32_t kind, uint64_t a, const void *payload, uint32_t len);
void ls_queue_credit(ls_comm *c, int path, const ls_req *r);
void ls_stream_open(ls_comm *c, int path, int stream, uint32_t addr, uint16_t port);
void ls_stream_close(ls_comm *c, ls_stream *s);

/* ---- failover.c ---- */
int ls_netlink_open(void);
void ls_netlink_read(ls_comm *c);
int ls_carrier(const char *ifname);
void ls_path_dead(ls_comm *c, int path, const char *reason);
void ls_path_up(ls_comm *c, int path);
void ls_paths_tick(ls_comm *c, uint64_t now);  /* heartbeats, liveness, reconnects, failback, give-up */
void ls_path_start_connect(ls_comm *c, int path);

/* ---- events.c ---- */
void ls_event(const char *kind, const char *data_json);
void ls_event_path_state(const ls_comm *c, int path, const char *state, const char *reason);
const char *ls_role(const ls_comm *c);

#endif
