/* Native softswitch runtime: tables, registers, counters, PRE, AF_PACKET I/O (a receive
 * ring per port, batched sends, the ports shared out among one or more lanes).
 *
 * Not compiled on its own: the C emitter writes one translation unit per program
 * that defines SS_NFIELDS, SS_NHEADERS, SS_NTABLES, SS_NREGS, SS_NCTRS, SS_MAXHDR
 * and SS_MAXCELLS, includes this file, then defines ss_setup(), ss_ingress(),
 * ss_egress() and ss_replica() (a multicast or clone copy's state: only the fields
 * egress names) (and ss_keep(), ss_reset_meta(), ss_set_instance() for clone, resubmit
 * and recirculate; and, with SS_PREPARED, ss_prepare() and ss_replica_shared(): the
 * headers every copy of a multicast deparses alike, deparsed once, frontend/prepared.py).
 * One unit lets the compiler inline table lookups into the pipeline.
 *
 * Every array access is bounds-checked: the generated code checks its indices
 * against the sizes it was built with, ss_setup's sizes are checked here (1 to
 * SS_MAXCELLS cells, allocations that fail make ss_new fail), and every control-plane
 * call checks the table, register, counter, entry and output it is given.
 *
 * The file is the types, the values' helpers and the packet path; it includes
 * mmsg.c (a port's send socket), control.c (tables, registers, counters, PRE, and the
 * control-plane calls) and io.c (the AF_PACKET rings, sends and lanes) where their
 * definitions belong.
 *
 * Locks. Every control-plane call holds ctx->mu (recursive, so Python can hold it
 * across several calls for a consistent read or a multi-update write) and, from the
 * outermost hold, ctx->dp for writing: the data plane never sees half a change. A
 * data-plane batch holds ctx->dp for reading. Where the front end proved register
 * state shardable by a header field (frontend/shards.py), the printed parser ends
 * with ss_shards_take: the frame holds the lock of its field's share of the cells
 * (ctx->shard[field % nshards]) to its end, so lanes run the pipeline in parallel and
 * two frames that can touch one cell never do so at once. Where it did not
 * (nshards 0), a batch holds ctx->dp for writing: one lane at a time. Counters,
 * statistics and the random generator are atomic; the output queues have a lock
 * each (ss_outq). Lock order: dp, shards in ascending order, an output queue.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "mmsg.c"                  /* the context holds a send socket a port */

#define SS_EXPORT __attribute__((visibility("default")))
#define SS_SLOT 16384            /* a receive slot: frames up to SS_SLOT - 4 bytes (room to put
                                    back a VLAN tag); larger ones are dropped */
#define SS_BATCH 64
#define SS_RING_FRAMES 256       /* a port's receive ring (ss_ring_open) */
#define SS_RING_BLOCK (1 << 17)
#define SS_RESERVE 4             /* room before each ring frame to put back a VLAN tag */
#define SS_PORT_TXMAX 128        /* frames staged for sending per port (twice: one stage
                                    fills while the other is sent) */
#define SS_MAXPORTS 512
#define SS_MAXLANES 16           /* I/O threads (ss_io_start) */
#define SS_SHARDS 64             /* locks of register shares, at most (ss_shards_take) */
#define SS_OUTMAX 64             /* outputs kept by ss_process (control-plane tests) */
#define SS_SESSIONS 32768        /* clone session ids (PI's: 1 to 32767) */
#define SS_PASSES 32             /* clones, resubmits and recirculations per received frame */
#ifndef PACKET_IGNORE_OUTGOING
#define PACKET_IGNORE_OUTGOING 23
#endif

typedef struct {
    int nk, nd, scan;            /* scan: ternary/LPM/range (priority order), else exact hash */
    uint8_t *ranged;             /* range tables: which keys are ranges (mask: high bound) */
    int cap, used, nlive, nfree;
    uint64_t *key, *mask, *data;
    int32_t *action, *prio, *freel;
    uint32_t *seq;
    uint8_t *live;
    uint64_t *pkts, *bytes;
    int32_t *index;              /* exact: hash slots -> entry; scan: entries in order */
    uint32_t icap;
    uint32_t next_seq;
    int32_t def_action;
    uint64_t *def_data;
} ss_table;

typedef struct {
    int n;
    uint16_t *port, *rid;
} ss_group;

typedef struct {
    uint64_t f[SS_NFIELDS + 1];
    uint8_t v[SS_NHEADERS + 1];
    uint32_t clone;              /* session | 0x8000 once a clone was asked for, else 0 */
    uint32_t clone_fl, resub_fl, recirc_fl;   /* field list ids (0: none) */
    int parse_only;              /* an I2E clone's parse of the original packet */
    const uint8_t *prep;         /* a multicast copy: its shared headers' bytes (ss_prepare) */
    uint32_t nprep;
    const uint8_t *pkt;
    uint64_t plen, off, plen_reg, in_len;
    int abort;                   /* a division by zero or a stack index past the stack: the packet is dropped */
} ss_state;

typedef struct {
    uint8_t *buf;
    uint32_t len;
} ss_txslot;

/* Frames staged for one port. */
typedef struct {
    ss_txslot tx[SS_PORT_TXMAX];
    uint32_t n;
} ss_stage;

/* A port's way out: lanes append to one stage (under mu) while one lane at a time
 * sends the other (without it), so a port's frames leave in the order they were
 * appended, whichever lanes made them. Order guaranteed: the frames one lane makes
 * for a port leave in the order it made them; the frames made under one share's lock
 * (every result of one slot) leave each port in the order they were made, as the
 * share's lock is held until the frame's outputs are appended. A worker's loss
 * detection reads a result that overtakes an earlier one of its slot as a loss. */
typedef struct {
    pthread_mutex_t mu;
    ss_stage st[2];
    int fill;                    /* the stage the pipeline fills */
    int busy;                    /* a lane is sending the other */
} ss_outq;

/* An I/O thread and the ports it receives on (port k is lane k % nlanes's). Most of
 * a frame's cost is the kernel's (a send runs the receiver's stack on the sending
 * core), so lanes send in parallel; the pipeline itself runs under ctx->mu. */
typedef struct {
    struct ss_ctx *c;
    int index;
    pthread_t thread;
    uint8_t *rxbuf;
    uint8_t *txbuf;              /* egress writes an output to a missing port here */
} ss_lane;

/* A port's PACKET_RX_RING (TPACKET_V2): the kernel copies each frame into the next
 * free slot, and the loop reads it there, with no system call per frame. */
typedef struct {
    uint8_t *map;
    size_t size;
    uint32_t frames, per_block, frame_size, head;
} ss_ring;

typedef struct ss_ctx {
    pthread_mutex_t mu;
    pthread_rwlock_t dp;
    int cp_depth;                /* holds of mu: the outermost takes dp for writing */
    int nshards;                 /* 0: one lane at a time; else a power of two */
    pthread_mutex_t shard[SS_SHARDS];
    ss_table t[SS_NTABLES + 1];
    uint64_t *reg[SS_NREGS + 1];         /* a register's cells; of one up to 32 bits wide,
                                            the block ss_free frees (cells: reg32) */
    uint32_t *reg32[SS_NREGS + 1];       /* cells of a register up to 32 bits wide: half
                                            the memory a frame's reads and writes move */
    uint8_t reg_narrow[SS_NREGS + 1];
    uint32_t reg_size[SS_NREGS + 1];
    uint32_t reg_stride[SS_NREGS + 1];   /* registers stored side by side: cell i at [i * stride] */
    uint8_t reg_lane[SS_NREGS + 1];      /* 1: reg points into another register's block */
    uint64_t *cpk[SS_NCTRS + 1], *cby[SS_NCTRS + 1];
    uint32_t ctr_size[SS_NCTRS + 1];
    ss_group *groups[65536];
    ss_group *sessions[SS_SESSIONS];
    uint64_t rng;
    uint64_t drop_port;
    /* ss_process: the outputs of the last call */
    uint8_t *outbuf;
    uint32_t nout, out_port[SS_OUTMAX], out_len[SS_OUTMAX];
    /* I/O */
    ss_lane lane[SS_MAXLANES];
    int nlanes;
    ss_outq *outq;               /* by port index (noutq of them, nports in use) */
    int noutq;
    volatile int stop, running;
    int nports, port_no[SS_MAXPORTS], rxfd[SS_MAXPORTS], txfd[SS_MAXPORTS];
    int port_index[SS_MAXPORTS];
    uint8_t sees_outgoing[SS_MAXPORTS];  /* no PACKET_IGNORE_OUTGOING (kernels before 4.20) */
    ss_ring ring[SS_MAXPORTS];
    struct ss_xsk *xsk;          /* by port index: AF_XDP sends (io.c, xsk.c), fd -1: sendmmsg */
    int tx_xdp, tx_state[SS_MAXPORTS];   /* asked for AF_XDP; each port's (ss_io_tx) */
    struct ss_mmsg mmsg[SS_MAXPORTS];   /* by port index: linear sendmmsg sends (mmsg.c) */
    uint64_t stat_rx, stat_tx, stat_drop, stat_txerr, stat_asserts;
    /* frames lost outside the pipeline's own drops: the receive rings' (the kernel's
     * tp_drops), outputs with no send slot left, outputs to a port or multicast
     * group the switch does not have */
    uint64_t stat_ring_drops, stat_no_room, stat_no_port;
    int failed;                  /* ss_setup could not allocate or was given a bad size */
} ss_ctx;

#define SS_COUNT(x, n) __atomic_add_fetch(&(x), (n), __ATOMIC_RELAXED)

static __thread int ss_passes;          /* left for the frame this thread processes */
static __thread uint64_t ss_held;       /* the shares' locks it holds (ss_shards_take) */
static __thread uint8_t *ss_txbuf;      /* its lane's spare output buffer (ss_tx_slot) */

static void ss_cp_lock(ss_ctx *c) {
    pthread_mutex_lock(&c->mu);
    if (c->cp_depth++ == 0) pthread_rwlock_wrlock(&c->dp);
}

static void ss_cp_unlock(ss_ctx *c) {
    if (--c->cp_depth == 0) pthread_rwlock_unlock(&c->dp);
    pthread_mutex_unlock(&c->mu);
}

/* A batch: beside other lanes where the state is sharded, else alone. */
static void ss_dp_lock(ss_ctx *c) {
    if (c->nshards) pthread_rwlock_rdlock(&c->dp);
    else pthread_rwlock_wrlock(&c->dp);
}

/* The locks of the shares in ``mask``, in ascending order (at most one frame's worth
 * of them, taken once a frame, after its parser). One lane takes none: only lanes
 * share the cells (a control-plane call's frame runs with ctx->dp held for writing). */
static void ss_shards_take(ss_ctx *c, uint64_t mask) {
    if (ss_held || c->nlanes < 2) return;
    ss_held = mask;
    for (uint64_t m = mask; m; m &= m - 1) pthread_mutex_lock(&c->shard[__builtin_ctzll(m)]);
}

static void ss_shards_give(ss_ctx *c) {
    for (uint64_t m = ss_held; m; m &= m - 1) pthread_mutex_unlock(&c->shard[__builtin_ctzll(m)]);
    ss_held = 0;
}

static void ss_setup(ss_ctx *c);
SS_EXPORT void ss_free(ss_ctx *c);
static void ss_ingress(ss_ctx *c, ss_state *S);
static int64_t ss_egress(ss_ctx *c, ss_state *S, uint32_t port, int has_rid, uint32_t rid,
                         uint32_t instance, uint8_t *out, uint32_t cap, ss_state *e2e);
static void ss_keep(ss_state *dst, const ss_state *src, uint32_t field_list);
static void ss_replica(ss_state *dst, const ss_state *src);
#ifdef SS_PREPARED
static void ss_replica_shared(ss_state *dst, const ss_state *src);
static int64_t ss_prepare(const ss_state *S, uint8_t *out, uint32_t cap);
#endif
static void ss_reset_meta(ss_state *S);
static void ss_set_instance(ss_state *S, uint64_t instance);
static uint64_t ss_spec(const ss_state *S);
static uint64_t ss_mcast(const ss_state *S);

/* ------------------------------------------------------------------ values */

static inline uint64_t ss_sext(uint64_t v, int w) {
    if (w >= 64) return v;
    uint64_t m = 1ULL << (w - 1);
    v &= (m << 1) - 1;
    return (v ^ m) - m;
}

/* 32-bit lanes (frontend/widths.py): values modulo 2^32, so a loop of them vectorizes
 * in twice the lanes of uint64_t. ss_sat32s/u clamp a + b (sub: a - b) of exact
 * 32-bit operands, as sat_cast/usat_cast to 32 bits of the exact result would. */
static inline uint32_t ss_sext32(uint32_t v, int w) {
    uint32_t m = 1U << (w - 1);
    v &= w >= 32 ? ~0U : (m << 1) - 1;
    return (v ^ m) - m;
}

static inline uint32_t ss_sat32s(uint32_t a, uint32_t b, int sub) {
    uint32_t r = sub ? a - b : a + b;
    uint32_t over = sub ? (a ^ b) & (a ^ r) : ~(a ^ b) & (a ^ r);
    uint32_t clamp = (uint32_t)((int32_t)a >> 31) ^ 0x7fffffffU;
    return (int32_t)over < 0 ? clamp : r;
}

static inline uint32_t ss_sat32u(uint32_t a, uint32_t b, int sub) {
    return sub ? (a < b ? 0U : a - b) : (a + b < a ? ~0U : a + b);
}

static inline uint64_t ss_get(const uint8_t *p, uint32_t bitoff, int w) {
    const uint8_t *q = p + (bitoff >> 3);
    uint32_t first = bitoff & 7, nbytes = (first + w + 7) >> 3;
    unsigned __int128 acc = 0;
    for (uint32_t i = 0; i < nbytes; i++) acc = (acc << 8) | q[i];
    acc >>= nbytes * 8 - first - w;
    return (uint64_t)acc & (w >= 64 ? ~0ULL : ((1ULL << w) - 1));
}

static inline void ss_put(uint8_t *p, uint32_t bitoff, int w, uint64_t v) {
    uint8_t *q = p + (bitoff >> 3);
    uint32_t first = bitoff & 7, nbytes = (first + w + 7) >> 3, shift = nbytes * 8 - first - w;
    unsigned __int128 m = (w >= 64 ? (unsigned __int128)~0ULL : ((1ULL << w) - 1));
    unsigned __int128 acc = 0;
    for (uint32_t i = 0; i < nbytes; i++) acc = (acc << 8) | q[i];
    acc = (acc & ~(m << shift)) | (((unsigned __int128)v & m) << shift);
    for (int i = (int)nbytes - 1; i >= 0; i--) { q[i] = (uint8_t)acc; acc >>= 8; }
}

static inline uint64_t ss_ld8(const uint8_t *p) { return p[0]; }
static inline uint64_t ss_ld16(const uint8_t *p) { uint16_t x; memcpy(&x, p, 2); return __builtin_bswap16(x); }
static inline uint64_t ss_ld32(const uint8_t *p) { uint32_t x; memcpy(&x, p, 4); return __builtin_bswap32(x); }
static inline uint64_t ss_ld64(const uint8_t *p) { uint64_t x; memcpy(&x, p, 8); return __builtin_bswap64(x); }
static inline void ss_st8(uint8_t *p, uint64_t v) { p[0] = (uint8_t)v; }
static inline void ss_st16(uint8_t *p, uint64_t v) { uint16_t x = __builtin_bswap16((uint16_t)v); memcpy(p, &x, 2); }
static inline void ss_st32(uint8_t *p, uint64_t v) { uint32_t x = __builtin_bswap32((uint32_t)v); memcpy(p, &x, 4); }
static inline void ss_st64(uint8_t *p, uint64_t v) { uint64_t x = __builtin_bswap64(v); memcpy(p, &x, 8); }

/* A run of n like fields (a header of values): one loop each way, which the compiler
 * vectorizes; the parser and deparser call them for runs the printer finds. */
#define SS_RUN(w)                                                                          \
    static __attribute__((noinline, unused)) void ss_ld##w##n(                              \
        uint64_t *restrict f, const uint8_t *restrict p, uint32_t n) {                     \
        for (uint32_t i = 0; i < n; i++) f[i] = ss_ld##w(p + i * (w / 8));                 \
    }                                                                                      \
    static __attribute__((noinline, unused)) void ss_st##w##n(                              \
        uint8_t *restrict p, const uint64_t *restrict f, uint32_t n) {                     \
        for (uint32_t i = 0; i < n; i++) ss_st##w(p + i * (w / 8), f[i]);                  \
    }
SS_RUN(8)
SS_RUN(16)
SS_RUN(32)
SS_RUN(64)
#undef SS_RUN

/* ss_calc: BMv2's hash algorithms over a then b (a calculation's fields, then the payload), in
 * validate.HASH_ALGORITHMS' order: csum16, cksum16, crc16, crc16_custom, crc32,
 * crc32_custom, crcCCITT, crc8_custom, crc64_custom, identity, xor16, xor32 (the custom
 * CRCs with BMv2's default parameters). */
#define SS_BYTE(i) ((i) < na ? a[i] : b[(i) - na])

static uint64_t ss_crc(const uint8_t *a, uint32_t na, const uint8_t *b, uint32_t nb, int width,
                       uint64_t poly, uint64_t init, uint64_t xorout, int reflected) {
    uint64_t m = width == 64 ? ~0ULL : (1ULL << width) - 1, reg = init;
    if (reflected) {                  /* the reflected register: poly and bits reversed */
        uint64_t rpoly = 0;
        for (int i = 0; i < width; i++) if (poly >> i & 1) rpoly |= 1ULL << (width - 1 - i);
        for (uint32_t i = 0; i < na + nb; i++) {
            reg ^= SS_BYTE(i);
            for (int k = 0; k < 8; k++) reg = reg & 1 ? (reg >> 1) ^ rpoly : reg >> 1;
        }
    } else {
        for (uint32_t i = 0; i < na + nb; i++) {
            reg ^= (uint64_t)SS_BYTE(i) << (width - 8);
            for (int k = 0; k < 8; k++)
                reg = (reg >> (width - 1) & 1) ? ((reg << 1) ^ poly) & m : (reg << 1) & m;
        }
    }
    return (reg ^ xorout) & m;
}

static uint64_t ss_calc(int algo, const uint8_t *a, uint32_t na, const uint8_t *b, uint32_t nb) {
    uint32_t n = na + nb;
    uint64_t out = 0;
    switch (algo) {
    case 0: case 1: {
        uint64_t sum = 0;
        uint32_t i = 0;
        for (; i + 1 < na; i += 2) sum += (uint32_t)a[i] << 8 | a[i + 1];
        for (; i < n; i++) sum += (uint64_t)SS_BYTE(i) << (i & 1 ? 0 : 8);
        while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
        return (uint16_t)~sum;
    }
    case 2: case 3: return ss_crc(a, na, b, nb, 16, 0x8005, 0, 0, 1);
    case 4: case 5: return ss_crc(a, na, b, nb, 32, 0x04c11db7, 0xffffffff, 0xffffffff, 1);
    case 6: return ss_crc(a, na, b, nb, 16, 0x1021, 0xffff, 0, 0);
    case 7: return ss_crc(a, na, b, nb, 8, 0x07, 0, 0, 0);
    case 8: return ss_crc(a, na, b, nb, 64, 0x1b, 0, 0, 1);
    case 9:
        for (uint32_t i = 0; i < n && i < 8; i++) out = out << 8 | SS_BYTE(i);
        return out;
    default: {                        /* xor16, xor32: words, the last one padded with zeros */
        int w = algo == 10 ? 2 : 4;
        for (uint32_t i = 0; i < n; i++) out ^= (uint64_t)SS_BYTE(i) << (8 * (w - 1 - i % w));
        return out;
    }
    }
}
#undef SS_BYTE

static inline uint64_t ss_random(ss_ctx *c, uint64_t lo, uint64_t hi) {
    uint64_t x = __atomic_load_n(&c->rng, __ATOMIC_RELAXED), y;   /* xorshift64* */
    do {
        y = x;
        y ^= y >> 12; y ^= y << 25; y ^= y >> 27;
    } while (!__atomic_compare_exchange_n(&c->rng, &x, y, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    x = y;
    x *= 0x2545F4914F6CDD1DULL;
    uint64_t span = hi - lo;
    return span == ~0ULL ? x : lo + x % (span + 1);
}

static inline uint64_t ss_div(ss_state *S, uint64_t a, uint64_t b, int mod) {
    if (!b) { S->abort = 1; return 0; }
    return mod ? a % b : a / b;
}

/* A header stack element by a computed index: past the stack BMv2 throws (and ends),
   here the packet is dropped. */
static inline uint64_t ss_index(ss_state *S, uint64_t i, uint64_t n) {
    if (i >= n) { S->abort = 1; return 0; }
    return i;
}

#include "control.c"

/* ------------------------------------------------------------------ packet path */

/* An output: ``slot`` gives the buffer egress writes it in, ``emit`` then sends it,
 * or with n < 0 gives the buffer back unsent; every slot is emitted once. */
typedef void (*ss_emit_fn)(ss_ctx *c, uint32_t port, uint8_t *frame, int64_t n);

typedef uint8_t *(*ss_slot_fn)(ss_ctx *c, uint32_t port, uint32_t *cap);

/* Another pass for a copy of the frame (clone, resubmit, recirculate), or none left:
 * simple_switch would loop for ever, here the copy is dropped. */
static int ss_another(ss_ctx *c) {
    if (ss_passes <= 0) { SS_COUNT(c->stat_drop, 1); return 0; }
    ss_passes--;
    return 1;
}

static void ss_pass(ss_ctx *c, const uint8_t *pkt, uint32_t len, uint32_t port,
                    uint32_t instance, const ss_state *from, uint32_t field_list,
                    ss_slot_fn slot, ss_emit_fn emit);

/* Egress on S, then (simple_switch's order) the frame sent or recirculated, then the
 * E2E clone egress made of S before its drop check. */
static void ss_egress_out(ss_ctx *c, ss_state *S, uint32_t port, int has_rid, uint32_t rid,
                          uint32_t instance, ss_slot_fn slot, ss_emit_fn emit) {
    uint32_t cap;
    uint8_t *out = slot(c, port, &cap);
    if (!out) { SS_COUNT(c->stat_no_room, 1); return; }   /* its E2E clones are never made */
    ss_state K;
    S->clone = S->resub_fl = S->recirc_fl = 0;
    int64_t n = ss_egress(c, S, port, has_rid, rid, instance, out, cap, &K);
    if (n >= 0 && !S->recirc_fl) {
        emit(c, port, out, n);
    } else if (n >= 0 && n <= SS_SLOT && ss_another(c)) {
        uint8_t *frame = malloc((size_t)n + 1);    /* the slot is given back */
        if (frame) memcpy(frame, out, (size_t)n);
        emit(c, port, out, -1);
        if (frame) {
            ss_pass(c, frame, (uint32_t)n, 0, 4, S, S->recirc_fl, slot, emit);
            free(frame);
        } else {
            SS_COUNT(c->stat_drop, 1);
        }
    } else {
        emit(c, port, out, -1);
    }
    /* An egress that aborted made no E2E state (K): its clones are dropped with it. */
    ss_group *g = S->clone && !S->abort ? c->sessions[S->clone & 0x7FFF] : NULL;
    for (int i = 0; g && i < g->n && ss_another(c); i++) {
        ss_state E;
        ss_replica(&E, &K);
        ss_egress_out(c, &E, g->port[i], 1, g->rid[i], 2, slot, emit);
    }
}

/* One pass through ingress, then simple_switch's order: the I2E clone (the original
 * packet parsed again, its metadata reset but for the field list), a resubmit
 * (instead of forwarding), multicast, unicast. */
static void ss_pass(ss_ctx *c, const uint8_t *pkt, uint32_t len, uint32_t port,
                    uint32_t instance, const ss_state *from, uint32_t field_list,
                    ss_slot_fn slot, ss_emit_fn emit) {
    ss_state S, E;
    memset(&S, 0, offsetof(ss_state, pkt));
    S.pkt = pkt;
    S.plen = S.plen_reg = S.in_len = len;
    S.off = 0;
    S.abort = 0;
    S.f[SS_INGRESS_PORT] = port;
    if (from) ss_keep(&S, from, field_list);
    ss_set_instance(&S, instance);
    ss_ingress(c, &S);
    if (S.abort) { SS_COUNT(c->stat_drop, 1); return; }
    ss_group *g = S.clone ? c->sessions[S.clone & 0x7FFF] : NULL;
    if (g) {
        ss_state K;
        memset(&K, 0, offsetof(ss_state, pkt));
        K.pkt = pkt;
        K.plen = K.plen_reg = K.in_len = len;
        K.off = 0;
        K.abort = 0;
        K.f[SS_INGRESS_PORT] = port;
        K.parse_only = 1;
        ss_ingress(c, &K);
        K.parse_only = 0;
        ss_reset_meta(&K);
        ss_keep(&K, &S, S.clone_fl);
        for (int i = 0; !K.abort && i < g->n && ss_another(c); i++) {
            ss_replica(&E, &K);
            ss_egress_out(c, &E, g->port[i], 1, g->rid[i], 1, slot, emit);
        }
    }
    if (S.resub_fl) {
        if (ss_another(c)) ss_pass(c, pkt, len, 0, 6, &S, S.resub_fl, slot, emit);
        return;
    }
    uint64_t grp = ss_mcast(&S), spec = ss_spec(&S);
    if (grp) {
        g = c->groups[grp & 0xFFFF];
        if (!g || grp > 0xFFFF) { SS_COUNT(c->stat_no_port, 1); return; }
#ifdef SS_PREPARED
        uint8_t prep[SS_MAXHDR];     /* the headers every copy deparses alike, once */
        int64_t nprep = g->n > 1 ? ss_prepare(&S, prep, sizeof prep) : -1;
        if (nprep >= 0) { S.prep = prep; S.nprep = (uint32_t)nprep; }
#endif
        for (int i = 0; i < g->n; i++) {
            ss_state *R = &S;        /* the last replica is S itself: it is not read again */
#ifdef SS_PREPARED
            if (i + 1 < g->n && S.prep) ss_replica_shared(R = &E, &S);
            else
#endif
            if (i + 1 < g->n) ss_replica(R = &E, &S);
            ss_egress_out(c, R, g->port[i], 1, g->rid[i], 5, slot, emit);
        }
        return;
    }
    if (spec == c->drop_port) return;
    ss_egress_out(c, &S, (uint32_t)spec, 0, 0, 0, slot, emit);
}

/* Ingress, PRE, egress for one frame; ``slot`` gives the buffer for each output. */
static void ss_run(ss_ctx *c, const uint8_t *pkt, uint32_t len, uint32_t port,
                   ss_slot_fn slot, ss_emit_fn emit) {
    ss_passes = SS_PASSES;
    ss_pass(c, pkt, len, port, 0, NULL, 0, slot, emit);
    ss_shards_give(c);
}

static uint8_t *ss_out_slot(ss_ctx *c, uint32_t port, uint32_t *cap) {
    (void)port;
    if (c->nout >= SS_OUTMAX) return NULL;
    *cap = SS_SLOT + SS_MAXHDR;
    return c->outbuf + (size_t)c->nout * (SS_SLOT + SS_MAXHDR);
}

static void ss_out_emit(ss_ctx *c, uint32_t port, uint8_t *frame, int64_t len) {
    (void)frame;
    if (len < 0) return;
    c->out_port[c->nout] = port;
    c->out_len[c->nout] = (uint32_t)len;
    c->nout++;
}

/* One frame through the pipeline; its outputs are read with ss_output. */
SS_EXPORT int ss_process(ss_ctx *c, const uint8_t *frame, uint32_t len, uint32_t port) {
    if (len > SS_SLOT) return 0;
    ss_cp_lock(c);
    if (!c->outbuf && !(c->outbuf = malloc((size_t)SS_OUTMAX * (SS_SLOT + SS_MAXHDR)))) {
        ss_cp_unlock(c);
        return 0;
    }
    c->nout = 0;
    ss_run(c, frame, len, port, ss_out_slot, ss_out_emit);
    int n = (int)c->nout;
    ss_cp_unlock(c);
    return n;
}

SS_EXPORT const uint8_t *ss_output(ss_ctx *c, int i, uint32_t *port, uint32_t *len) {
    if (i < 0 || (uint32_t)i >= c->nout) { *port = *len = 0; return c->outbuf; }
    *port = c->out_port[i];
    *len = c->out_len[i];
    return c->outbuf + (size_t)i * (SS_SLOT + SS_MAXHDR);
}

#include "io.c"
