/*
 * lockstep-probed: the probe mesh's hot loop (see agent/probemesh/__init__.py for the design).
 *
 * This header is the helper's whole interface: the wire format every prober and responder
 * speaks (the Python engine, agent/probemesh/wire.py, speaks the same bytes), the control
 * protocol on stdin/stdout, and the state shared by the files of the helper:
 *
 *   main.c       control lines, configuration (re-plans applied in place), the event loop
 *   net.c        sockets: binding to a NIC, SO_TIMESTAMPING, IP_RECVERR, cmsg parsing
 *   prober.c     sending on schedule, echoes, TX stamps, deadlines, loss direction, finalizing
 *   responder.c  answering probes, the per-flow seen masks, follow-ups, receive counts
 *   window.c     per-window accumulators, percentiles, JSON output
 *
 * Control protocol (one line each, fields separated by one space; names never hold spaces):
 *
 *   reset                                      begin a new configuration
 *   opt <key> <integer>                        window_ns interval_ns port deadline_floor_ns
 *                                              deadline_k_milli deadline_max_ns grace_ns margin_ns
 *                                              payload dscp hw (0 software, 1 use hardware stamps
 *                                              when the NIC has them on, 2 also switch them on)
 *                                              txts (1: kernel TX stamps from the error queue)
 *   nic <i> <name> <ifname|-> <address> <sport_first> <sport_count>
 *   peer <i> <nic_i> <name> <address>
 *   commit                                     apply: NICs and peers that did not change keep
 *                                              their sockets, sequence numbers and windows
 *   clock <offset_ns> <synced 0|1>             cluster time = CLOCK_REALTIME + offset when synced
 *   trace <token> <peer_i> <sport_i> <ttl>     one TTL-limited probe of that flow
 *   quit
 *
 * Output: one JSON object per line (`ev`: ready, config, window, hop, stats, error).
 */
#ifndef LOCKSTEP_PROBED_H
#define LOCKSTEP_PROBED_H

#include <stddef.h>
#include <stdint.h>
#include <net/if.h>
#include <netinet/in.h>

#define PM_VERSION_STRING "1"

/* -- wire format (all integers big-endian) ----------------------------------------------- */

#define PM_MAGIC 0x4C53504Du /* "LSPM" */
#define PM_WIRE_VERSION 1

enum pm_type { PM_PROBE = 1, PM_ECHO = 2, PM_TRACE = 3, PM_TRACE_ECHO = 4 };

#define PM_F_SYNCED 0x01   /* the sender's times are cluster time */
#define PM_F_FOLLOWUP 0x02 /* echo: fu_seq / fu_tx_ns hold the kernel TX stamp of an earlier echo */
#define PM_F_HW 0x04       /* echo: rx_hw_ns holds a hardware stamp (and fu_tx_hw_ns with FOLLOWUP) */

/* probe and trace probe: header, then the prober NIC's name, then padding */
#define PM_P_MAGIC 0
#define PM_P_VERSION 4
#define PM_P_TYPE 5
#define PM_P_FLAGS 6
#define PM_P_NAMELEN 7
#define PM_P_SESSION 8
#define PM_P_SEQ 12
#define PM_P_WINDOW 16 /* the prober's window start (ns) this probe counts in */
#define PM_P_TX 24     /* the prober's send time (user space) */
#define PM_P_NAME 32
#define PM_PROBE_HDR 32

/* echo and trace echo */
#define PM_E_SESSION 8
#define PM_E_SEQ 12
#define PM_E_RX 16      /* kernel RX stamp of the probe at the responder */
#define PM_E_TX 24      /* the responder's send time (user space, just before sendmmsg) */
#define PM_E_SEEN 32    /* bit i: the responder had received seq - 1 - i of this session */
#define PM_E_FU_SEQ 40
#define PM_E_FU_TX 48   /* kernel TX stamp of the echo of fu_seq */
#define PM_E_RX_HW 56
#define PM_E_FU_TX_HW 64
#define PM_ECHO_LEN 72

#define PM_NAME_MAX 64
#define PM_PAYLOAD_MAX 8972

/* -- limits --------------------------------------------------------------------------------- */

#define PM_MAX_NICS 16
#define PM_MAX_PEERS 8192
#define PM_MAX_SPORTS 1024
#define PM_SLOTS 8          /* windows in flight per peer and per flow */
#define PM_FLOW_TABLE 8192  /* per NIC, open addressing; at most half used */
#define PM_SENT_RING 4096   /* per NIC: recent echoes, for their TX stamps */
#define PM_MASK_BITS 64

/* -- state ---------------------------------------------------------------------------------- */

struct pm_samples {
    int64_t *v;
    uint32_t n, cap;
};

struct pm_acc { /* one peer, one window */
    int64_t window_ns;
    int used;
    uint32_t seq0, sent;       /* the window's probes are seq0 .. seq0 + sent - 1 */
    uint32_t lost, unres, late, refused, send_errors;
    uint32_t rsent, rlost, rlate;
    uint32_t answered, clock_ok, hw_ok;
    struct pm_samples fwd, rev, rtt;
    uint32_t *sport_lost;      /* [sport][3]: forward, reverse, unresolved; NULL until a loss */
};

struct pm_rec { /* one probe in flight */
    uint32_t seq;
    uint8_t used, final, answered, late, known, b_seen, has_fu, refused;
    uint8_t a_synced, b_synced, hw, send_error;
    uint16_t sport;
    int64_t window_ns;
    int64_t tx_mono, deadline_ns;
    int64_t a_offset;          /* cluster offset at send (0 when not synced) */
    int64_t tx_user, tx_sw, tx_hw;
    int64_t rx_b, tx_b, rx_b_hw, tx_b_hw;
    int64_t rx_a, rx_a_hw;
};

struct pm_nic;

struct pm_peer {
    char name[PM_NAME_MAX + 1];
    uint32_t addr;             /* network order */
    int nic;                   /* index into pm.nics */
    char nic_name[PM_NAME_MAX + 1];
    uint32_t session;
    uint32_t next_seq;
    int64_t next_due;          /* monotonic ns */
    int64_t deadline_ns;
    int64_t rtt_p99_ns;        /* of the last window with answers; 0 before */
    uint32_t sport_step, sport_off;
    uint32_t ring_size;
    struct pm_rec *ring;
    uint32_t final_seq;        /* next seq to finalize */
    struct pm_acc acc[PM_SLOTS];
    int heap_pos;
    uint32_t index;            /* the configuration's peer index */
};

struct pm_flow { /* responder side: one prober session */
    uint32_t addr, session;
    uint8_t used, have;
    char name[PM_NAME_MAX + 1];
    uint32_t max_seq;
    uint64_t seen;
    int64_t last_mono;
    uint32_t fu_seq;
    int64_t fu_tx, fu_tx_hw;
    uint8_t fu_ready;
    struct { int64_t window_ns; uint32_t n; } rx[PM_SLOTS];
};

struct pm_sock {
    int fd;
    int nic;
    int kind;                  /* PM_SOCK_RESPONDER or PM_SOCK_PROBER */
    int sport;                 /* index of the source port (prober) */
};
enum { PM_SOCK_RESPONDER = 1, PM_SOCK_PROBER = 2 };

struct pm_nic {
    char name[PM_NAME_MAX + 1];
    char ifname[IFNAMSIZ];
    uint32_t addr;
    uint16_t sport_first, sport_count;
    struct pm_sock *resp;
    struct pm_sock **sports;
    int hw;                    /* hardware stamps in use */
    int64_t next_emit;         /* start of the next window to emit (0: none yet) */
    uint64_t rx_late, rx_stateless;
    struct pm_flow *flows;     /* PM_FLOW_TABLE entries */
    uint32_t nflows;
    struct { uint32_t session, seq; int32_t flow; } *sent_ring;
    char errors[512];
    uint32_t index;
};

struct pm_opts {
    int64_t window_ns, interval_ns, deadline_floor_ns, deadline_k_milli, deadline_max_ns;
    int64_t grace_ns, margin_ns;
    int port, payload, dscp, hw, txts;
};

struct pm_stats {
    uint64_t sent, echoes, answered_probes, stale_echoes, tx_stamps, send_errors, skipped;
    uint64_t bad_packets, traces, hops, windows, windows_skipped, out_dropped;
};

struct pm_state {
    struct pm_opts opts;
    struct pm_nic *nics[PM_MAX_NICS];
    int nnics;
    struct pm_peer **peers;
    int npeers;
    struct pm_peer **heap;
    int nheap;
    int epfd;
    int64_t clock_offset;
    int synced;
    struct pm_stats st;
    int running;
};

extern struct pm_state pm;

/* -- helpers (net.c) ------------------------------------------------------------------------- */

int64_t pm_now_mono(void);
int64_t pm_now_real(void);
int64_t pm_window_clock(void); /* realtime + cluster offset when synced */
void pm_put32(uint8_t *p, uint32_t v);
void pm_put64(uint8_t *p, uint64_t v);
uint32_t pm_get32(const uint8_t *p);
uint64_t pm_get64(const uint8_t *p);
int pm_open_socket(struct pm_nic *nic, uint16_t port, char *err, size_t errlen);
int pm_hw_available(const char *ifname, int enable);
struct pm_stamps {
    int64_t sw, hw;            /* 0 when absent */
    int have_err;              /* an IP_RECVERR / timestamping extended error was attached */
    uint32_t ee_errno;
    uint8_t ee_origin, ee_type, ee_code;
    uint32_t offender;         /* network order, 0 when none */
};
void pm_parse_cmsgs(void *msghdr, struct pm_stamps *out);
const uint8_t *pm_find_magic(const uint8_t *buf, size_t len, size_t *rest);

/* -- prober.c ---------------------------------------------------------------------------------- */

void pm_prober_send_due(int64_t now);
void pm_prober_read(struct pm_sock *s);
void pm_prober_errqueue(struct pm_sock *s);
void pm_prober_tick(int64_t now);
void pm_heap_rebuild(void);
int64_t pm_heap_next_due(void);
void pm_peer_free(struct pm_peer *p);
struct pm_peer *pm_peer_by_session(uint32_t session);
void pm_sessions_rebuild(void);
void pm_trace(uint32_t token, int peer, int sport, int ttl);

/* -- responder.c ----------------------------------------------------------------------------- */

void pm_responder_read(struct pm_sock *s);
void pm_responder_errqueue(struct pm_sock *s);
void pm_flows_expire(struct pm_nic *nic, int64_t now);

/* -- window.c ----------------------------------------------------------------------------------- */

struct pm_acc *pm_acc_for(struct pm_peer *p, int64_t window_ns);
void pm_acc_clear(struct pm_acc *a);
void pm_acc_free(struct pm_acc *a);
void pm_samples_add(struct pm_samples *s, int64_t v);
void pm_emit_windows(int64_t now_window);
void pm_out(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void pm_out_json_str(const char *s);
void pm_out_flush(void);
int pm_out_pending(void);

#endif
