/* Native softswitch runtime: tables, registers, counters, PRE, AF_PACKET I/O (a receive
 * ring per port, batched sends, the ports shared out among one or more lanes).
 *
 * Not compiled on its own: the C emitter writes one translation unit per program
 * that defines SS_NFIELDS, SS_NHEADERS, SS_NTABLES, SS_NREGS, SS_NCTRS, SS_MAXHDR
 * and SS_MAXCELLS, includes this file, then defines ss_setup(), ss_ingress(),
 * ss_egress() and ss_replica() (a multicast or clone copy's state: only the fields
 * egress names) (and ss_keep(), ss_reset_meta(), ss_set_instance() for clone, resubmit
 * and recirculate). One unit lets the compiler inline table lookups into the pipeline.
 *
 * Every array access is bounds-checked: the generated code checks its indices
 * against the sizes it was built with, ss_setup's sizes are checked here (1 to
 * SS_MAXCELLS cells, allocations that fail make ss_new fail), and every control-plane
 * call checks the table, register, counter, entry and output it is given.
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
    uint64_t *reg[SS_NREGS + 1];
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
 * of them, taken once a frame, after its parser). */
static void ss_shards_take(ss_ctx *c, uint64_t mask) {
    if (ss_held) return;
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

/* ------------------------------------------------------------------ tables */

static void *ss_grow(void *p, size_t n, size_t size) {
    void *q = realloc(p, n * size > 0 ? n * size : 1);
    if (!q) abort();
    return q;
}

static void ss_table_init(ss_ctx *c, ss_table *t, int nk, int nd, int scan) {
    memset(t, 0, sizeof *t);
    t->nk = nk; t->nd = nd; t->scan = scan;
    t->def_action = -1;
    t->def_data = calloc(nd + 1, sizeof(uint64_t));
    if (!t->def_data) c->failed = 1;
}

/* Key ``f`` of a scanned table is a range: its entries hold the low bound as the
 * key and the high bound as the mask, both inclusive. */
static void ss_table_range(ss_ctx *c, ss_table *t, int f) {
    if (!t->ranged) t->ranged = calloc(t->nk, 1);
    if (!t->ranged || f < 0 || f >= t->nk || !t->scan) { c->failed = 1; return; }
    t->ranged[f] = 1;
}

static inline uint64_t ss_hash(const uint64_t *k, int nk) {
    uint64_t h = 0x9E3779B97F4A7C15ULL;
    for (int i = 0; i < nk; i++) { h ^= k[i]; h *= 0xFF51AFD7ED558CCDULL; h ^= h >> 33; }
    return h;
}

static int ss_order_cmp(const void *a, const void *b, void *arg) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    const ss_table *t = arg;
    if (t->prio[x] != t->prio[y]) return t->prio[x] > t->prio[y] ? -1 : 1;
    return t->seq[x] < t->seq[y] ? -1 : t->seq[x] > t->seq[y];
}

/* Rebuild the lookup index after a change: a hash of the live entries (exact) or
 * the live entries by descending priority, then insertion order (ternary/LPM). */
static void ss_table_reindex(ss_table *t) {
    if (t->scan) {
        t->index = ss_grow(t->index, t->nlive + 1, sizeof(int32_t));
        uint32_t n = 0;
        for (int i = 0; i < t->used; i++) if (t->live[i]) t->index[n++] = i;
        qsort_r(t->index, n, sizeof(int32_t), ss_order_cmp, t);
        t->icap = n;
        return;
    }
    uint32_t cap = 16;
    while (cap < 2u * (uint32_t)t->nlive + 16) cap <<= 1;
    t->index = ss_grow(t->index, cap, sizeof(int32_t));
    t->icap = cap;
    for (uint32_t i = 0; i < cap; i++) t->index[i] = -1;
    for (int i = 0; i < t->used; i++) {
        if (!t->live[i]) continue;
        uint32_t h = (uint32_t)ss_hash(t->key + (size_t)i * t->nk, t->nk) & (cap - 1);
        while (t->index[h] >= 0) h = (h + 1) & (cap - 1);
        t->index[h] = i;
    }
}

/* A ternary/LPM/range table: the first entry in priority order that matches. */
static int32_t ss_lookup_scan(const ss_table *t, const uint64_t *k) {
    int nk = t->nk;
    for (uint32_t j = 0; j < t->icap; j++) {
        int32_t i = t->index[j];
        const uint64_t *ek = t->key + (size_t)i * nk, *em = t->mask + (size_t)i * nk;
        int ok = 1;
        if (t->ranged) {
            for (int f = 0; f < nk; f++)
                if (t->ranged[f] ? k[f] < ek[f] || k[f] > em[f] : (k[f] & em[f]) != ek[f]) {
                    ok = 0;
                    break;
                }
        } else {
            for (int f = 0; f < nk; f++) if ((k[f] & em[f]) != ek[f]) { ok = 0; break; }
        }
        if (ok) return i;
    }
    return -1;
}

/* An exact table. The printer passes the table's key count as a constant, so each
 * call site is inlined with its hash and key compare unrolled (no memcmp call). */
static inline __attribute__((always_inline)) int32_t ss_lookup_exact(const ss_table *t,
                                                                     const uint64_t *k, int nk) {
    if (!t->icap) return -1;
    uint32_t h = (uint32_t)ss_hash(k, nk) & (t->icap - 1);
    for (;;) {
        int32_t i = t->index[h];
        if (i < 0) return -1;
        const uint64_t *ek = t->key + (size_t)i * nk;
        int f = 0;
        while (f < nk && ek[f] == k[f]) f++;
        if (f == nk) return i;
        h = (h + 1) & (t->icap - 1);
    }
}

/* ------------------------------------------------------------------ control API */

SS_EXPORT void ss_lock(ss_ctx *c) { ss_cp_lock(c); }
SS_EXPORT void ss_unlock(ss_ctx *c) { ss_cp_unlock(c); }

SS_EXPORT ss_ctx *ss_new(uint32_t drop_port, uint64_t seed) {
    ss_ctx *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&c->mu, &a);
    pthread_rwlockattr_t w;      /* writers first: a control-plane call never waits for ever */
    pthread_rwlockattr_init(&w);
    pthread_rwlockattr_setkind_np(&w, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&c->dp, &w);
    for (int i = 0; i < SS_SHARDS; i++) pthread_mutex_init(&c->shard[i], NULL);
    c->drop_port = drop_port;
    c->rng = seed | 1;
    ss_setup(c);
    if (c->failed) {
        ss_free(c);
        return NULL;
    }
    return c;
}

/* A register, or the first of `stride` registers stored side by side in its block;
 * one spare cell past the last, where a loop's access out of range goes (the printer's
 * ``selected``), never read for a value nor seen by the control plane. */
static void ss_reg_init(ss_ctx *c, int r, uint32_t size, uint32_t stride) {
    if (size < 1 || size > SS_MAXCELLS || stride < 1 || stride > SS_NREGS) { c->failed = 1; return; }
    c->reg[r] = calloc(((size_t)size + 1) * stride, sizeof(uint64_t));
    if (!c->reg[r]) { c->failed = 1; return; }
    c->reg_size[r] = size;
    c->reg_stride[r] = stride;
}

/* Register r as lane `lane` of first's block. */
static void ss_reg_lane(ss_ctx *c, int r, int first, uint32_t lane) {
    if (!c->reg[first] || lane >= c->reg_stride[first]) { c->failed = 1; return; }
    c->reg[r] = c->reg[first] + lane;
    c->reg_size[r] = c->reg_size[first];
    c->reg_stride[r] = c->reg_stride[first];
    c->reg_lane[r] = 1;
}

static void ss_ctr_init(ss_ctx *c, int i, uint32_t size) {
    if (size < 1 || size > SS_MAXCELLS) { c->failed = 1; return; }
    c->cpk[i] = calloc(size, sizeof(uint64_t));
    c->cby[i] = calloc(size, sizeof(uint64_t));
    if (!c->cpk[i] || !c->cby[i]) { c->failed = 1; return; }
    c->ctr_size[i] = size;
}

/* Whether a control-plane call names a table, entry, register or counter that exists. */
static int ss_table_ok(int ti) { return ti >= 0 && ti < SS_NTABLES; }
static int ss_entry_ok(ss_ctx *c, int ti, int32_t i) {
    return ss_table_ok(ti) && i >= 0 && i < c->t[ti].used && c->t[ti].live[i];
}
static int ss_reg_ok(ss_ctx *c, int r, uint32_t i) {
    return r >= 0 && r < SS_NREGS && i < c->reg_size[r];
}
static int ss_ctr_ok(ss_ctx *c, int n, uint32_t i) {
    return n >= 0 && n < SS_NCTRS && i < c->ctr_size[n];
}

/* A new entry (key already masked, data already masked to the parameters' widths:
 * the caller's job); returns its handle, or -1 for no such table. */
SS_EXPORT int32_t ss_tbl_add(ss_ctx *c, int ti, const uint64_t *key, const uint64_t *mask,
                             int32_t prio, int32_t action, const uint64_t *data) {
    if (!ss_table_ok(ti)) return -1;
    ss_cp_lock(c);
    ss_table *t = &c->t[ti];
    int32_t i;
    if (t->nfree) {
        i = t->freel[--t->nfree];
    } else {
        if (t->used == t->cap) {
            int cap = t->cap ? t->cap * 2 : 16;
            t->key = ss_grow(t->key, (size_t)cap * t->nk, 8);
            t->mask = ss_grow(t->mask, (size_t)cap * t->nk, 8);
            t->data = ss_grow(t->data, (size_t)cap * (t->nd + 1), 8);
            t->action = ss_grow(t->action, cap, 4);
            t->prio = ss_grow(t->prio, cap, 4);
            t->freel = ss_grow(t->freel, cap, 4);
            t->seq = ss_grow(t->seq, cap, 4);
            t->live = ss_grow(t->live, cap, 1);
            t->pkts = ss_grow(t->pkts, cap, 8);
            t->bytes = ss_grow(t->bytes, cap, 8);
            t->cap = cap;
        }
        i = t->used++;
    }
    memcpy(t->key + (size_t)i * t->nk, key, t->nk * 8);
    memcpy(t->mask + (size_t)i * t->nk, mask, t->nk * 8);
    memcpy(t->data + (size_t)i * (t->nd + 1), data, t->nd * 8);
    t->action[i] = action;
    t->prio[i] = prio;
    t->seq[i] = t->next_seq++;
    t->live[i] = 1;
    t->pkts[i] = t->bytes[i] = 0;
    t->nlive++;
    ss_table_reindex(t);
    ss_cp_unlock(c);
    return i;
}

SS_EXPORT void ss_tbl_set_action(ss_ctx *c, int ti, int32_t i, int32_t action, const uint64_t *data) {
    ss_cp_lock(c);
    if (ss_entry_ok(c, ti, i)) {
        ss_table *t = &c->t[ti];
        t->action[i] = action;
        memcpy(t->data + (size_t)i * (t->nd + 1), data, t->nd * 8);
    }
    ss_cp_unlock(c);
}

SS_EXPORT void ss_tbl_del(ss_ctx *c, int ti, int32_t i) {
    ss_cp_lock(c);
    if (ss_entry_ok(c, ti, i)) {
        ss_table *t = &c->t[ti];
        t->live[i] = 0;
        t->nlive--;
        t->freel[t->nfree++] = i;
        ss_table_reindex(t);
    }
    ss_cp_unlock(c);
}

SS_EXPORT void ss_tbl_default(ss_ctx *c, int ti, int32_t action, const uint64_t *data) {
    if (!ss_table_ok(ti)) return;
    ss_cp_lock(c);
    ss_table *t = &c->t[ti];
    t->def_action = action;
    memcpy(t->def_data, data, t->nd * 8);
    ss_cp_unlock(c);
}

SS_EXPORT void ss_tbl_counter(ss_ctx *c, int ti, int32_t i, uint64_t *pkts_bytes, int write) {
    ss_cp_lock(c);
    if (ss_entry_ok(c, ti, i)) {
        ss_table *t = &c->t[ti];
        if (write) { t->pkts[i] = pkts_bytes[0]; t->bytes[i] = pkts_bytes[1]; }
        else { pkts_bytes[0] = t->pkts[i]; pkts_bytes[1] = t->bytes[i]; }
    }
    ss_cp_unlock(c);
}

SS_EXPORT uint64_t ss_reg_get(ss_ctx *c, int r, uint32_t i) {
    ss_cp_lock(c);
    uint64_t v = ss_reg_ok(c, r, i) ? c->reg[r][(size_t)i * c->reg_stride[r]] : 0;
    ss_cp_unlock(c);
    return v;
}

SS_EXPORT void ss_reg_set(ss_ctx *c, int r, uint32_t i, uint64_t v) {
    ss_cp_lock(c);
    if (ss_reg_ok(c, r, i)) c->reg[r][(size_t)i * c->reg_stride[r]] = v;
    ss_cp_unlock(c);
}

SS_EXPORT uint64_t ss_ctr_get(ss_ctx *c, int n, uint32_t i, int bytes) {
    ss_cp_lock(c);
    uint64_t v = ss_ctr_ok(c, n, i) ? (bytes ? c->cby[n][i] : c->cpk[n][i]) : 0;
    ss_cp_unlock(c);
    return v;
}

SS_EXPORT void ss_ctr_set(ss_ctx *c, int n, uint32_t i, int bytes, uint64_t v) {
    ss_cp_lock(c);
    if (ss_ctr_ok(c, n, i)) (bytes ? c->cby[n] : c->cpk[n])[i] = v;
    ss_cp_unlock(c);
}

static void ss_group_free(ss_group *g) {
    if (g) { free(g->port); free(g->rid); free(g); }
}

/* Puts replicas (in sending order; none for n < 0) in ``*slot``: built before the
   lock, what was there freed after it. Multicast groups and clone sessions alike. */
static void ss_replicas_set(ss_ctx *c, ss_group **slot, int n, const uint16_t *ports,
                            const uint16_t *rids) {
    ss_group *g = NULL;
    if (n >= 0) {
        g = malloc(sizeof *g);
        if (!g) abort();
        g->n = n;
        g->port = ss_grow(NULL, (size_t)n + 1, 2);
        g->rid = ss_grow(NULL, (size_t)n + 1, 2);
        memcpy(g->port, ports, (size_t)n * 2);
        memcpy(g->rid, rids, (size_t)n * 2);
    }
    ss_cp_lock(c);
    ss_group *old = *slot;
    *slot = g;
    ss_cp_unlock(c);
    ss_group_free(old);
}

/* A multicast group's replicas in sending order; n < 0 deletes the group. */
SS_EXPORT void ss_group_set(ss_ctx *c, uint32_t gid, int n, const uint16_t *ports,
                            const uint16_t *rids) {
    ss_replicas_set(c, &c->groups[gid & 0xFFFF], n, ports, rids);
}

/* A clone session's replicas in sending order; n < 0 deletes the session. */
SS_EXPORT void ss_session_set(ss_ctx *c, uint32_t sid, int n, const uint16_t *ports,
                              const uint16_t *rids) {
    if (sid < SS_SESSIONS) ss_replicas_set(c, &c->sessions[sid], n, ports, rids);
}

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
        for (int i = 0; i < g->n; i++) {
            ss_state *R = &S;        /* the last replica is S itself: it is not read again */
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

/* ------------------------------------------------------------------ I/O loop */

static int ss_port_known(const ss_ctx *c, uint32_t port) {
    return port < SS_MAXPORTS && c->port_index[port] >= 0;
}

/* A stage's frames out of port index k, in one sendmmsg if the kernel takes them. */
static void ss_send_stage(ss_ctx *c, int k, ss_stage *st) {
    struct mmsghdr msgs[SS_PORT_TXMAX];
    struct iovec iov[SS_PORT_TXMAX];
    for (uint32_t j = 0; j < st->n; j++) {
        iov[j].iov_base = st->tx[j].buf;
        iov[j].iov_len = st->tx[j].len;
        memset(&msgs[j], 0, sizeof msgs[j]);
        msgs[j].msg_hdr.msg_iov = &iov[j];
        msgs[j].msg_hdr.msg_iovlen = 1;
    }
    uint32_t sent = 0;
    while (sent < st->n) {
        int r = sendmmsg(c->txfd[k], msgs + sent, st->n - sent, 0);
        if (r > 0) {
            sent += r;
            SS_COUNT(c->stat_tx, (uint64_t)r);
            continue;
        }
        if (r < 0 && errno == EINTR) continue;
        /* e.g. EMSGSIZE: that frame is lost, not the rest */
        SS_COUNT(c->stat_txerr, 1);
        sent++;
    }
    st->n = 0;
}

/* Send what port index k has staged, unless another lane is sending its frames (it
 * takes these too when it is done); with q->mu held, released around the sends. */
static void ss_send_staged(ss_ctx *c, int k) {
    ss_outq *q = &c->outq[k];
    while (!q->busy && q->st[q->fill].n) {
        ss_stage *st = &q->st[q->fill];
        q->fill ^= 1;
        q->busy = 1;
        pthread_mutex_unlock(&q->mu);
        ss_send_stage(c, k, st);
        pthread_mutex_lock(&q->mu);
        q->busy = 0;
    }
}

static void ss_flush_port(ss_ctx *c, int k) {
    ss_outq *q = &c->outq[k];
    pthread_mutex_lock(&q->mu);
    ss_send_staged(c, k);
    pthread_mutex_unlock(&q->mu);
}

/* The next slot of the port's stage, port index k's lock held until ss_tx_emit: a
 * full stage is sent first, or waited for while another lane sends (the frame's share
 * lock held meanwhile: a sender takes no lock but q->mu). No lock is taken between
 * the two (a frame's shares are taken after its parser), so none waits on q->mu's
 * holder. An output to a port the switch does not have goes to the lane's buffer. */
static uint8_t *ss_tx_slot(ss_ctx *c, uint32_t port, uint32_t *cap) {
    *cap = SS_SLOT + SS_MAXHDR;
    if (!ss_port_known(c, port)) return ss_txbuf;      /* ss_tx_emit counts it */
    int k = c->port_index[port];
    ss_outq *q = &c->outq[k];
    pthread_mutex_lock(&q->mu);
    while (q->st[q->fill].n == SS_PORT_TXMAX) {
        if (!q->busy) {
            ss_send_staged(c, k);
            continue;
        }
        pthread_mutex_unlock(&q->mu);
        sched_yield();
        pthread_mutex_lock(&q->mu);
    }
    ss_stage *st = &q->st[q->fill];
    return st->tx[st->n].buf;
}

static void ss_tx_emit(ss_ctx *c, uint32_t port, uint8_t *frame, int64_t n) {
    (void)frame;
    if (!ss_port_known(c, port)) {
        if (n >= 0) SS_COUNT(c->stat_no_port, 1);
        return;
    }
    ss_outq *q = &c->outq[c->port_index[port]];
    if (n >= 0) {
        ss_stage *st = &q->st[q->fill];
        st->tx[st->n++].len = (uint32_t)n;
    }
    pthread_mutex_unlock(&q->mu);
}

/* Every port's staged frames, after each batch (no lock held), so what a multicast
 * made for several ports goes out as one sendmmsg per port. */
static void ss_flush(ss_ctx *c) {
    for (int k = 0; k < c->nports; k++) ss_flush_port(c, k);
}

/* The kernel takes an 802.1Q tag off every frame it receives and hands it beside the
 * frame (PACKET_AUXDATA, which dataplane.py turns on, or the ring's frame header):
 * put it back where it was on the wire, as BMv2 sees it through libpcap. */
static void ss_vlan_tag(uint8_t *at, uint32_t status, uint16_t tpid, uint16_t tci) {
    if (!(status & TP_STATUS_VLAN_TPID_VALID)) tpid = 0x8100;
    at[0] = (uint8_t)(tpid >> 8);
    at[1] = (uint8_t)tpid;
    at[2] = (uint8_t)(tci >> 8);
    at[3] = (uint8_t)tci;
}

/* Each frame is received 4 bytes short of its slot, so the tag always fits. */
static size_t ss_with_vlan_tag(struct msghdr *h, uint8_t *frame, size_t len) {
    for (struct cmsghdr *m = CMSG_FIRSTHDR(h); m; m = CMSG_NXTHDR(h, m)) {
        if (m->cmsg_level != SOL_PACKET || m->cmsg_type != PACKET_AUXDATA) continue;
        struct tpacket_auxdata aux;
        memcpy(&aux, CMSG_DATA(m), sizeof aux);
        if (!(aux.tp_status & TP_STATUS_VLAN_VALID) || len < 12) return len;
        memmove(frame + 16, frame + 12, len - 12);
        ss_vlan_tag(frame + 12, aux.tp_status, aux.tp_vlan_tpid, aux.tp_vlan_tci);
        return len + 4;
    }
    return len;
}

/* A received frame's fate before the pipeline: a copy of our own sends (kernels before
 * 4.20 cannot ignore them) is skipped, one longer than a slot is counted and dropped,
 * never cut short; anything else is counted and run. */
static int ss_admit(ss_ctx *c, int k, int pkttype, int too_long) {
    if (c->sees_outgoing[k] && pkttype == PACKET_OUTGOING) return 0;
    SS_COUNT(c->stat_rx, 1);
    if (too_long) {
        SS_COUNT(c->stat_drop, 1);
        return 0;
    }
    return 1;
}

/* What queued on port k's socket while it had no ring (before ss_io_start, or
 * between two pipelines): one batch through the pipeline; how many it received. */
static int ss_receive(ss_ctx *c, ss_lane *l, int k) {
    struct mmsghdr msgs[SS_BATCH];
    struct iovec iov[SS_BATCH];
    struct sockaddr_ll addr[SS_BATCH];
    union { struct cmsghdr align; char buf[CMSG_SPACE(sizeof(struct tpacket_auxdata))]; }
        control[SS_BATCH];
    for (int i = 0; i < SS_BATCH; i++) {
        iov[i].iov_base = l->rxbuf + (size_t)i * SS_SLOT;
        iov[i].iov_len = SS_SLOT - 4;
        memset(&msgs[i], 0, sizeof msgs[i]);
        msgs[i].msg_hdr.msg_iov = &iov[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
        if (c->sees_outgoing[k]) {   /* only then is the packet type needed */
            msgs[i].msg_hdr.msg_name = &addr[i];
            msgs[i].msg_hdr.msg_namelen = sizeof addr[i];
        }
        msgs[i].msg_hdr.msg_control = control[i].buf;
        msgs[i].msg_hdr.msg_controllen = sizeof control[i].buf;
    }
    int n = recvmmsg(c->rxfd[k], msgs, SS_BATCH, MSG_DONTWAIT | MSG_TRUNC, NULL);
    if (n <= 0) return 0;
    ss_dp_lock(c);
    for (int i = 0; i < n; i++) {
        if (!ss_admit(c, k, addr[i].sll_pkttype, msgs[i].msg_len > SS_SLOT - 4
                                                 || (msgs[i].msg_hdr.msg_flags & MSG_TRUNC)))
            continue;
        size_t len = ss_with_vlan_tag(&msgs[i].msg_hdr, iov[i].iov_base, msgs[i].msg_len);
        ss_run(c, iov[i].iov_base, len, (uint32_t)c->port_no[k], ss_tx_slot, ss_tx_emit);
    }
    pthread_rwlock_unlock(&c->dp);
    ss_flush(c);
    return n;
}

static struct tpacket2_hdr *ss_ring_frame(const ss_ring *r, uint32_t i) {
    return (struct tpacket2_hdr *)(r->map + (size_t)(i / r->per_block) * SS_RING_BLOCK
                                   + (size_t)(i % r->per_block) * r->frame_size);
}

/* Back to a plain socket: what arrives queues there for the next ring (ss_receive). */
static void ss_ring_close(ss_ring *r, int fd) {
    if (r->map) munmap(r->map, r->size);
    struct tpacket_req none = {0};
    setsockopt(fd, SOL_PACKET, PACKET_RX_RING, &none, sizeof none);
    memset(r, 0, sizeof *r);
}

/* The longest frame the port's interface can bring (its MTU, an Ethernet header and a
 * VLAN tag), at most SS_SLOT - 4 bytes; SS_SLOT - 4 where the MTU cannot be read. */
static uint32_t ss_port_frame(int fd) {
    struct sockaddr_ll sll;
    socklen_t len = sizeof sll;
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    if (getsockname(fd, (struct sockaddr *)&sll, &len)
        || !if_indextoname(sll.sll_ifindex, ifr.ifr_name) || ioctl(fd, SIOCGIFMTU, &ifr)
        || ifr.ifr_mtu <= 0 || ifr.ifr_mtu + 18 > SS_SLOT - 4)
        return SS_SLOT - 4;
    return (uint32_t)ifr.ifr_mtu + 18;
}

/* Frames land SS_RESERVE bytes past the ring's header, so a VLAN tag can be put back
 * in place; one a slot, sized for the port's MTU as it is now (slots of SS_SLOT
 * cost 10 % more CPU per 4 KiB frame than slots of its 4,138 B MTU: 4 MiB a port
 * leaves the caches). A longer frame (an MTU raised later) arrives cut short and
 * is dropped, as one over SS_SLOT - 4 bytes is. */
static int ss_ring_open(ss_ring *r, int fd) {
    int version = TPACKET_V2;
    unsigned reserve = SS_RESERVE;
    uint32_t frame = TPACKET_ALIGN(TPACKET_ALIGN(TPACKET2_HDRLEN + 16) + SS_RESERVE
                                   + ss_port_frame(fd));
    uint32_t per_block = SS_RING_BLOCK / frame;
    uint32_t blocks = (SS_RING_FRAMES + per_block - 1) / per_block;
    struct tpacket_req req = {.tp_block_size = SS_RING_BLOCK, .tp_block_nr = blocks,
                              .tp_frame_size = frame, .tp_frame_nr = blocks * per_block};
    if (setsockopt(fd, SOL_PACKET, PACKET_VERSION, &version, sizeof version) ||
        setsockopt(fd, SOL_PACKET, PACKET_RESERVE, &reserve, sizeof reserve) ||
        setsockopt(fd, SOL_PACKET, PACKET_RX_RING, &req, sizeof req))
        return -1;
    size_t size = (size_t)blocks * SS_RING_BLOCK;
    void *map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        ss_ring_close(r, fd);
        return -1;
    }
    *r = (ss_ring){.map = map, .size = size, .frames = blocks * per_block,
                   .per_block = per_block, .frame_size = frame};
    return 0;
}

static void ss_ring_run(ss_ctx *c, int k, struct tpacket2_hdr *h, uint32_t status) {
    const struct sockaddr_ll *sll = (const void *)((uint8_t *)h + TPACKET_ALIGN(sizeof *h));
    if (!ss_admit(c, k, sll->sll_pkttype, h->tp_len > SS_SLOT - 4 || h->tp_snaplen < h->tp_len))
        return;
    uint8_t *frame = (uint8_t *)h + h->tp_mac;
    uint32_t len = h->tp_snaplen;
    if ((status & TP_STATUS_VLAN_VALID) && len >= 12) {
        memmove(frame - 4, frame, 12);
        frame -= 4;
        ss_vlan_tag(frame + 12, status, h->tp_vlan_tpid, h->tp_vlan_tci);
        len += 4;
    }
    ss_run(c, frame, len, (uint32_t)c->port_no[k], ss_tx_slot, ss_tx_emit);
}

/* What port k's socket lost since the last call: frames the kernel found no ring
 * slot (or buffer) for. Reading resets the kernel's count. */
static void ss_count_losses(ss_ctx *c, int k) {
    struct tpacket_stats st;
    socklen_t len = sizeof st;
    if (!getsockopt(c->rxfd[k], SOL_PACKET, PACKET_STATISTICS, &st, &len))
        SS_COUNT(c->stat_ring_drops, st.tp_drops);
}

/* Up to SS_BATCH frames from port k's ring through the pipeline; how many it took.
 * A frame flagged TP_STATUS_LOSING (the kernel dropped some since the count was
 * last read) has the count read then: no system call per frame otherwise. */
static int ss_ring_receive(ss_ctx *c, int k) {
    ss_ring *r = &c->ring[k];
    int n = 0;
    ss_dp_lock(c);
    for (; n < SS_BATCH; n++) {
        struct tpacket2_hdr *h = ss_ring_frame(r, r->head);
        uint32_t status = __atomic_load_n(&h->tp_status, __ATOMIC_ACQUIRE);
        if (!(status & TP_STATUS_USER)) break;
        if (status & TP_STATUS_LOSING) ss_count_losses(c, k);
        ss_ring_run(c, k, h, status);
        __atomic_store_n(&h->tp_status, TP_STATUS_KERNEL, __ATOMIC_RELEASE);
        r->head = r->head + 1 == r->frames ? 0 : r->head + 1;
    }
    pthread_rwlock_unlock(&c->dp);
    if (n) ss_flush(c);
    return n;
}

static void *ss_loop(void *arg) {
    ss_lane *l = arg;
    ss_ctx *c = l->c;
    char name[16];
    snprintf(name, sizeof name, "ss-lane-%d", l->index);
    pthread_setname_np(pthread_self(), name);
    ss_txbuf = l->txbuf;
    int ep = epoll_create1(0);
    for (int k = l->index; k < c->nports; k += c->nlanes) {
        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)k};
        epoll_ctl(ep, EPOLL_CTL_ADD, c->rxfd[k], &ev);
    }
    struct epoll_event evs[64];
    for (int k = l->index; k < c->nports; k += c->nlanes)
        while (ss_receive(c, l, k) > 0) {}
    while (!c->stop) {
        int n = epoll_wait(ep, evs, 64, 50);
        for (int i = 0; i < n; i++) ss_ring_receive(c, (int)evs[i].data.u32);
    }
    close(ep);
    return NULL;
}

/* What reached the rings up to now, through the pipeline and out; then the plain
 * sockets take over (a frame that lands in between is lost, as BMv2 loses those
 * that arrive while its pipeline is replaced). */
static void ss_rings_close(ss_ctx *c, int n) {
    ss_txbuf = c->lane[0].txbuf;         /* the lanes have stopped: this thread is one */
    for (int k = 0; k < n; k++)
        while (c->ring[k].map && ss_ring_receive(c, k) > 0) {}
    for (int k = 0; k < n; k++) ss_count_losses(c, k);
    for (int k = 0; k < n; k++) ss_ring_close(&c->ring[k], c->rxfd[k]);
}

static void ss_outq_free(ss_ctx *c) {
    for (int k = 0; c->outq && k < c->noutq; k++)
        for (int s = 0; s < 2; s++)
            for (int j = 0; j < SS_PORT_TXMAX; j++) free(c->outq[k].st[s].tx[j].buf);
    free(c->outq);
    c->outq = NULL;
    c->noutq = 0;
}

/* Each port's two stages (ss_outq), empty; kept from the last start for as many ports. */
static int ss_outq_alloc(ss_ctx *c, int n) {
    if (c->outq && c->noutq == n) {
        for (int k = 0; k < n; k++)
            c->outq[k].st[0].n = c->outq[k].st[1].n = c->outq[k].fill = c->outq[k].busy = 0;
        return 0;
    }
    ss_outq_free(c);
    if (!(c->outq = calloc((size_t)(n > 0 ? n : 1), sizeof *c->outq))) return -1;
    c->noutq = n;
    for (int k = 0; k < n; k++) pthread_mutex_init(&c->outq[k].mu, NULL);
    for (int k = 0; k < n; k++)
        for (int s = 0; s < 2; s++)
            for (int j = 0; j < SS_PORT_TXMAX; j++)
                if (!(c->outq[k].st[s].tx[j].buf = malloc(SS_SLOT + SS_MAXHDR))) return -1;
    return 0;
}

static void ss_lanes_join(ss_ctx *c, int n) {
    c->stop = 1;
    for (int i = 0; i < n; i++) pthread_join(c->lane[i].thread, NULL);
}

/* Start the data plane's threads, ``lanes`` of them (1 to SS_MAXLANES, at most one a
 * port), on sockets the caller opened (and still owns). */
SS_EXPORT int ss_io_start(ss_ctx *c, int n, const int *ports, const int *rxfds, const int *txfds,
                          int lanes) {
    if (c->running || n > SS_MAXPORTS || lanes < 1 || lanes > SS_MAXLANES) return -1;
    if (lanes > n) lanes = n > 0 ? n : 1;
    for (int i = 0; i < SS_MAXPORTS; i++) c->port_index[i] = -1;
    c->nports = n;
    for (int k = 0; k < n; k++) {
        if (ports[k] < 0 || ports[k] >= SS_MAXPORTS) return -1;
        c->port_no[k] = ports[k];
        c->rxfd[k] = rxfds[k];
        c->txfd[k] = txfds[k];
        c->port_index[ports[k]] = k;
        int ignores = 0;
        socklen_t len = sizeof ignores;
        c->sees_outgoing[k] = getsockopt(rxfds[k], SOL_PACKET, PACKET_IGNORE_OUTGOING,
                                         &ignores, &len) != 0 || !ignores;
    }
    for (int i = 0; i < lanes; i++) {
        ss_lane *l = &c->lane[i];
        l->c = c;
        l->index = i;
        if (!l->rxbuf && !(l->rxbuf = malloc((size_t)SS_BATCH * SS_SLOT))) return -1;
        if (!l->txbuf && !(l->txbuf = malloc(SS_SLOT + SS_MAXHDR))) return -1;
    }
    if (ss_outq_alloc(c, n)) return -1;
    c->nlanes = lanes;
    c->stop = 0;
    for (int k = 0; k < n; k++)
        if (ss_ring_open(&c->ring[k], rxfds[k])) {
            ss_rings_close(c, k);
            return -1;
        }
    for (int i = 0; i < lanes; i++)
        if (pthread_create(&c->lane[i].thread, NULL, ss_loop, &c->lane[i])) {
            ss_lanes_join(c, i);
            ss_rings_close(c, n);
            return -1;
        }
    c->running = 1;
    return 0;
}

SS_EXPORT void ss_io_stop(ss_ctx *c) {
    if (!c->running) return;
    ss_lanes_join(c, c->nlanes);
    ss_rings_close(c, c->nports);
    c->running = 0;
}

SS_EXPORT void ss_free(ss_ctx *c) {
    ss_io_stop(c);
    for (int i = 0; i < SS_NTABLES; i++) {      /* what a failed ss_setup left is NULL */
        ss_table *t = &c->t[i];
        free(t->key); free(t->mask); free(t->data); free(t->action); free(t->prio);
        free(t->freel); free(t->seq); free(t->live); free(t->pkts); free(t->bytes);
        free(t->index); free(t->def_data); free(t->ranged);
    }
    for (int i = 0; i < SS_NREGS; i++)
        if (!c->reg_lane[i]) free(c->reg[i]);
    for (int i = 0; i < SS_NCTRS; i++) { free(c->cpk[i]); free(c->cby[i]); }
    for (int g = 0; g < 65536; g++)
        ss_group_free(c->groups[g]);
    for (int g = 0; g < SS_SESSIONS; g++)
        ss_group_free(c->sessions[g]);
    ss_outq_free(c);
    for (int i = 0; i < SS_MAXLANES; i++) { free(c->lane[i].rxbuf); free(c->lane[i].txbuf); }
    free(c->outbuf);
    pthread_mutex_destroy(&c->mu);
    pthread_rwlock_destroy(&c->dp);
    free(c);
}

/* The data plane's counters, in loader.IO_COUNTERS' order; the sockets' losses read
 * now (while the loop runs: the caller owns the sockets, and may close them after). */
SS_EXPORT void ss_io_stats(ss_ctx *c, uint64_t *out) {
    pthread_mutex_lock(&c->mu);          /* not dp: the counters are atomic */
    if (c->running)
        for (int k = 0; k < c->nports; k++) ss_count_losses(c, k);
    uint64_t *in[] = {&c->stat_rx, &c->stat_tx, &c->stat_drop, &c->stat_txerr, &c->stat_asserts,
                      &c->stat_ring_drops, &c->stat_no_room, &c->stat_no_port};
    for (int i = 0; i < 8; i++) out[i] = __atomic_load_n(in[i], __ATOMIC_RELAXED);
    pthread_mutex_unlock(&c->mu);
}
