/* Native softswitch runtime, the state the control plane writes: match tables and
 * their lookups, registers, counters, multicast groups and clone sessions, and the
 * control-plane calls on them (each checks what it is given, under ss_cp_lock).
 *
 * Not compiled on its own: runtime.c includes it where these definitions belong,
 * after the types and the values' helpers, before the packet path that uses them.
 */

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
 * ``selected``), never read for a value nor seen by the control plane. ``narrow``: up
 * to 32 bits wide, its cells uint32_t (reg32). */
static void ss_reg_init(ss_ctx *c, int r, uint32_t size, uint32_t stride, int narrow) {
    if (size < 1 || size > SS_MAXCELLS || stride < 1 || stride > SS_NREGS) { c->failed = 1; return; }
    c->reg[r] = calloc(((size_t)size + 1) * stride, narrow ? sizeof(uint32_t) : sizeof(uint64_t));
    if (!c->reg[r]) { c->failed = 1; return; }
    if (narrow) c->reg32[r] = (uint32_t *)(void *)c->reg[r];
    c->reg_narrow[r] = (uint8_t)!!narrow;
    c->reg_size[r] = size;
    c->reg_stride[r] = stride;
}

/* Register r as lane `lane` of first's block. */
static void ss_reg_lane(ss_ctx *c, int r, int first, uint32_t lane) {
    if (!c->reg[first] || lane >= c->reg_stride[first]) { c->failed = 1; return; }
    c->reg_narrow[r] = c->reg_narrow[first];
    if (c->reg_narrow[r]) c->reg32[r] = c->reg32[first] + lane;
    else c->reg[r] = c->reg[first] + lane;
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
    uint64_t v = 0;
    if (ss_reg_ok(c, r, i))
        v = c->reg_narrow[r] ? c->reg32[r][(size_t)i * c->reg_stride[r]]
                             : c->reg[r][(size_t)i * c->reg_stride[r]];
    ss_cp_unlock(c);
    return v;
}

SS_EXPORT void ss_reg_set(ss_ctx *c, int r, uint32_t i, uint64_t v) {
    ss_cp_lock(c);
    if (ss_reg_ok(c, r, i) && c->reg_narrow[r])     /* the control plane gives the width's bits */
        c->reg32[r][(size_t)i * c->reg_stride[r]] = (uint32_t)v;
    else if (ss_reg_ok(c, r, i))
        c->reg[r][(size_t)i * c->reg_stride[r]] = v;
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
