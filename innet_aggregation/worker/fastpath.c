/* The worker's fast path: a batch of received results, in C, for the common case.
 *
 * Python (transport.py) owns every array of a call; this unit gets pointers to them
 * (struct fp_call, filled once per call by fastpath.py) and, for the results of a
 * batch in arrival order, does what Call._on_results, _store, _load and transmit
 * do, as long as a result is the common case: it answers the slot's packet in
 * flight (identity bytes), every worker contributed, its fingerprint sum is the
 * call's, and its scale is kept (not redone, not poisoned), for a whole block of a
 * float32 output. It stops at the first result that is anything else and returns
 * how many it handled; Python handles the rest of the batch unchanged. The next
 * packets of the slots handled go out in one sendmmsg (UDP GSO runs of consecutive
 * slots, as batchio.py cuts them). fp_run does Call.run's waiting and draining
 * around that for as long as nothing else comes and no timer is due.
 *
 * The numerics are quantize.quantize's and quantize.dequantize's, element by
 * element: numpy chooses its path per batch, but each path gives the same bits
 * wherever it is taken (tests/worker/test_fastpath.py compares them).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default")))
#define SEND_BATCH 64

struct fp_call {
    /* the packet's layout: byte offsets, from the program */
    int32_t off_type, off_set_slot, off_pkt_id, off_exponent, off_contributions,
        off_fingerprint, off_values;
    int32_t identity_bytes, values, packet_bytes, result_type, slot_shift, slot_mask;
    int32_t exponent_of_zero, poison, slack, num_workers, bits, dequantize_shift;
    int32_t average, power_of_two;
    int64_t n, step, whole_in, whole_out, num_slots, first_slot;
    /* the call's arrays (numpy's memory) */
    uint8_t *tx;                      /* the window's packets, one a slot */
    const uint8_t *set_slot_words;    /* 2 x slots, big-endian 16 bits, as sent */
    uint8_t *expect;                  /* slots x identity_bytes */
    const float *in_whole, *in_tail;
    float *out_whole;
    int64_t *chunk, *scale, *agreed;
    const int64_t *own;
    int64_t *next_set, *next_pkt_id;
    const uint8_t *fingerprints, *expected;   /* per chunk, big-endian 32 bits */
    double *sent_at, *first_sent_at;
    int64_t *sent_seq, *retries;
    uint8_t *resent, *told;           /* numpy bools */
    int64_t *queue;                   /* the slots loaded, in order */
    const uint8_t *rx;                /* the receive rows, rx_stride bytes apart */
    /* kept across batches; Python reads and writes them */
    int64_t next_seq, rack_seq;
    /* one batch's outcome */
    int64_t results, idle, queued, sent, failed_rows, rtt_count, datagrams, rx_stride;
    double rtt_sum, rack_sent_at;
    int32_t err, recv_err;
    /* fp_run's: the call's timers and the transport's RTT estimator (RtoEstimator),
     * copied in before and out after; what the run did, and where it stopped */
    double progress_at, rack_rtt, srtt, rttvar, min_rtt, rto, min_rto, max_rto,
        granularity, peer_timeout, wake;
    int64_t in_flight, has_srtt, run_results, run_sent, handled;
    /* the call's breakdown (breakdown.py): seconds spent here waiting, receiving,
     * handling results (dequantizing, loading the next packets) and sending, which
     * Python takes and zeroes; when the first result came */
    double t_wait, t_receive, t_results, t_send, first_result_at;
};

static double monotonic(void);

static inline uint32_t be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static inline void put_be32(uint8_t *p, uint32_t v) {
    p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v;
}

/* quantize.quantize for one block: rint(x * 2**shift), clipped below 2**bits where
 * the block's own exponent exceeds its scale, zeros where either is the poison. */
static void quantize_row(const struct fp_call *c, const float *x, int64_t own, int64_t scale,
                         uint8_t *dst) {
    int k = c->values;
    if (scale == c->poison || own == c->poison) {
        memset(dst, 0, 4 * (size_t)k);
        return;
    }
    int64_t floor_ = scale > c->exponent_of_zero + 1 ? scale : c->exponent_of_zero + 1;
    int shift = (int)(c->bits - floor_);
    float limit = nextafterf(ldexpf(1.0f, c->bits), 0.0f);
    int over = own > scale;
    float factor = ldexpf(1.0f, shift <= 127 ? shift : 0);
    for (int i = 0; i < k; i++) {
        float v = shift <= 127 ? x[i] * factor : ldexpf(x[i], shift);
        if (over)
            v = v < -limit ? -limit : (v > limit ? limit : v);
        put_be32(dst + 4 * i, (uint32_t)(int32_t)rintf(v));
    }
}

/* quantize.dequantize for one block: sum * 2**(S - shift) (/ n), rounded once to
 * float32; through float32 where that gives the same bits, else through float64. */
static void dequantize_row(const struct fp_call *c, const uint8_t *src, int64_t scale,
                           float *out) {
    int k = c->values;
    int e = (int)(scale - c->dequantize_shift);
    if ((!c->average || c->power_of_two) && e >= -126 && e <= 127 - 32) {
        float factor = ldexpf(1.0f, e);
        for (int i = 0; i < k; i++)
            out[i] = (float)(int32_t)be32(src + 4 * i) * factor;
    } else {
        double factor = ldexp(1.0, e);
        int divide = c->average && !c->power_of_two;
        for (int i = 0; i < k; i++) {
            double v = (double)(int32_t)be32(src + 4 * i) * factor;
            if (divide)
                v /= c->num_workers;
            out[i] = (float)v;
        }
    }
}

/* Call._load for one slot: its next chunk into its packet, its expected result. */
static void load(struct fp_call *c, int64_t s, int64_t chunk, double now) {
    uint8_t *row = c->tx + s * c->packet_bytes;
    int64_t set = c->next_set[s], id = c->next_pkt_id[s];
    c->next_set[s] = set ^ 1;
    c->next_pkt_id[s] = (id + 1) & 0xFFFFFFFF;
    memcpy(row + c->off_set_slot, c->set_slot_words + 2 * (set * c->num_slots + s), 2);
    put_be32(row + c->off_pkt_id, (uint32_t)id);
    row[c->off_exponent] = (uint8_t)(int8_t)c->own[chunk];
    memcpy(row + c->off_fingerprint, c->fingerprints + 4 * chunk, 4);
    row[c->off_contributions] = 0;
    uint8_t *expect = c->expect + s * c->identity_bytes;
    memcpy(expect, row, c->identity_bytes);
    expect[c->off_type] = (uint8_t)c->result_type;
    const float *x = chunk < c->whole_in ? c->in_whole + chunk * c->values : c->in_tail;
    quantize_row(c, x, c->own[chunk], c->scale[chunk], row + c->off_values);
    c->first_sent_at[s] = now;
    c->retries[s] = 0;
    c->resent[s] = 0;
    c->told[s] = 0;
    c->queue[c->queued++] = s;
}

/* The queued slots' packets, runs of consecutive slots one GSO message each. */
static void transmit(struct fp_call *c, int fd, int gso, double now) {
    struct mmsghdr msgs[SEND_BATCH];
    struct iovec iov[SEND_BATCH];
    int64_t i = 0;
    for (int64_t q = 0; q < c->queued; q++) {
        int64_t s = c->queue[q];
        c->sent_at[s] = now;
        c->sent_seq[s] = c->next_seq++;
    }
    while (i < c->queued) {
        int m = 0;
        int64_t rows[SEND_BATCH];
        int64_t j = i;
        while (j < c->queued && m < SEND_BATCH) {
            int64_t first = c->queue[j], len = 1;
            while (j + len < c->queued && len < gso && c->queue[j + len] == first + len)
                len++;
            iov[m].iov_base = c->tx + first * c->packet_bytes;
            iov[m].iov_len = (size_t)(len * c->packet_bytes);
            memset(&msgs[m].msg_hdr, 0, sizeof msgs[m].msg_hdr);
            msgs[m].msg_hdr.msg_iov = &iov[m];
            msgs[m].msg_hdr.msg_iovlen = 1;
            rows[m++] = len;
            j += len;
        }
        double t0 = monotonic();
        int done = sendmmsg(fd, msgs, m, 0);
        int err = done < 0 ? errno : 0;
        c->t_send += monotonic() - t0;
        for (int d = 0; d < (done > 0 ? done : 0); d++)
            c->sent += rows[d];
        if (err || done < m) {
            c->err = err ? err : EAGAIN;
            c->failed_rows = rows[done > 0 ? done : 0];
            return;
        }
        i = j;
    }
}

/* The results in ``count`` packets from ``base`` (``stride`` bytes apart; of
 * ``lengths``, where given, in bytes), in order, up to the first that is not the
 * common case; returns how many were handled. */
static int64_t handle(struct fp_call *c, const uint8_t *base, int64_t stride, int64_t count,
                      const struct mmsghdr *lengths, double now, int fd, int gso) {
    double t0 = monotonic(), sending = c->t_send;
    c->results = c->idle = c->queued = c->sent = c->failed_rows = c->rtt_count = 0;
    c->rtt_sum = 0.0;
    c->err = 0;
    int64_t i;
    for (i = 0; i < count; i++) {
        const uint8_t *p = base + i * stride;
        if (lengths && lengths[i].msg_len != (unsigned)c->packet_bytes)
            break;
        uint16_t word = (uint16_t)(p[c->off_set_slot] << 8 | p[c->off_set_slot + 1]);
        int64_t s = (int64_t)((word >> c->slot_shift) & c->slot_mask) - c->first_slot;
        if (s < 0 || s >= c->num_slots)
            break;
        int64_t chunk = c->chunk[s];
        if (chunk < 0 || chunk >= c->whole_out
            || memcmp(p, c->expect + s * c->identity_bytes, c->identity_bytes)
            || p[c->off_contributions] != c->num_workers
            || memcmp(p + c->off_fingerprint, c->expected + 4 * chunk, 4))
            break;
        int64_t agreed = (int8_t)p[c->off_exponent], scale = c->scale[chunk];
        if (agreed == c->poison
            || !(agreed == c->exponent_of_zero
                 || (agreed <= scale && scale - agreed <= c->slack)))
            break;
        c->agreed[chunk] = agreed;
        c->results++;
        if (!c->resent[s]) {          /* Karn: RTT and RACK from packets sent once */
            c->rtt_sum += c->sent_at[s];
            c->rtt_count++;
            if (c->sent_seq[s] > c->rack_seq) {
                c->rack_seq = c->sent_seq[s];
                c->rack_sent_at = c->sent_at[s];
            }
        }
        dequantize_row(c, p + c->off_values, scale, c->out_whole + chunk * c->values);
        int64_t following = chunk + c->step;
        if (following >= c->n) {
            c->chunk[s] = -1;
            c->sent_at[s] = INFINITY;
            c->first_sent_at[s] = INFINITY;
            c->sent_seq[s] = INT64_MAX;
            c->idle++;
        } else {
            c->chunk[s] = following;
            load(c, s, following, now);
        }
    }
    if (c->queued)
        transmit(c, fd, gso, now);
    c->t_results += monotonic() - t0 - (c->t_send - sending);
    return i;
}

/* time.monotonic(), to the same double. */
static double monotonic(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    int64_t ns = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
    return ns % 1000000000 == 0 ? (double)(ns / 1000000000) : (double)ns / 1e9;
}

static struct timespec timespec_of(double seconds) {
    return (struct timespec){(time_t)seconds, (long)((seconds - floor(seconds)) * 1e9)};
}

/* RtoEstimator.sample, operation for operation. */
static void rto_sample(struct fp_call *c, double rtt) {
    if (!c->has_srtt) {
        c->srtt = rtt;
        c->rttvar = rtt / 2;
        c->has_srtt = 1;
    } else {
        c->rttvar = 0.75 * c->rttvar + 0.25 * fabs(c->srtt - rtt);
        c->srtt = 0.875 * c->srtt + 0.125 * rtt;
    }
    if (rtt < c->min_rtt)
        c->min_rtt = rtt;
    double rto = c->srtt + fmax(c->granularity, 4 * c->rttvar);
    double floor_ = fmax(c->min_rto, 2 * c->srtt);
    c->rto = fmin(fmax(rto, floor_), c->max_rto);
}

/* What one batch received at ``now`` did (RACK's newest before it: ``rack``) into
 * the state FastCall copies out: counters, RTT, RACK, progress, what was sent. */
static void account(struct fp_call *c, int64_t handled, double now, int64_t rack) {
    if (!handled)
        return;
    c->run_results += c->results;
    if (c->rtt_count)
        rto_sample(c, now - c->rtt_sum / c->rtt_count);
    if (c->rack_seq != rack)
        c->rack_rtt = now - c->rack_sent_at;
    c->progress_at = now;
    if (c->results && now < c->first_result_at)
        c->first_result_at = now;
    c->in_flight -= c->idle;
    c->run_sent += c->sent;
}

/* One batch through handle, accounted. */
static int64_t handle_batch(struct fp_call *c, const uint8_t *base, int64_t stride,
                            int64_t count, const struct mmsghdr *lengths, double now, int fd,
                            int gso) {
    int64_t rack = c->rack_seq;
    int64_t handled = handle(c, base, stride, count, lengths, now, fd, gso);
    account(c, handled, now, rack);
    return handled;
}

EXPORT int64_t fp_results(struct fp_call *c, const uint8_t *base, int64_t stride,
                          int64_t count, double now, int fd, int gso) {
    c->run_results = c->run_sent = 0;
    c->recv_err = 0;
    return handle_batch(c, base, stride, count, NULL, now, fd, gso);
}

/* What is queued on the socket, into the receive rows through ``msgs`` (batchio's
 * recvmmsg vectors, ``rows`` of them), then its common results as fp_results. */
static int64_t fp_receive(struct fp_call *c, struct mmsghdr *msgs, int rows, double now,
                          int fd, int gso) {
    double t0 = monotonic();
    int got = recvmmsg(fd, msgs, rows, MSG_DONTWAIT, NULL);
    c->t_receive += monotonic() - t0;
    c->recv_err = got < 0 && errno != EAGAIN && errno != EWOULDBLOCK ? errno : 0;
    c->datagrams = got > 0 ? got : 0;
    return handle_batch(c, c->rx, c->rx_stride, c->datagrams, msgs, now, fd, gso);
}

/* Call._next_wakeup: the earliest timer (the timeout after the later of a slot's
 * send and the call's last answer, capped by peer_timeout) or RACK deadline. */
EXPORT double fp_next_wakeup(struct fp_call *c, double rto, double peer_timeout,
                             double progress_at, int64_t rack_seq, double rack_rtt,
                             double reorder_window) {
    double sent = INFINITY, first = INFINITY, behind = INFINITY;
    for (int64_t s = 0; s < c->num_slots; s++) {
        if (c->sent_at[s] < sent)
            sent = c->sent_at[s];
        if (c->first_sent_at[s] < first)
            first = c->first_sent_at[s];
        if (c->sent_seq[s] < rack_seq && c->sent_at[s] < behind)
            behind = c->sent_at[s];
    }
    double timer = (sent > progress_at ? sent : progress_at) + rto;
    double cap = first + peer_timeout;
    double wake = timer < cap ? timer : cap;
    if (behind < INFINITY) {
        double rack = behind + rack_rtt + reorder_window;
        if (rack < wake)
            wake = rack;
    }
    return wake;
}

/* Call.run's loop for as long as it meets only the common case, so that a wake-up
 * costs no Python: wait for results (never past the next timer or progress log),
 * drain the socket through handle, and where only a few came (fewer than
 * ``coalesce_batch``) let more gather for up to ``coalesce`` seconds. Returns 1
 * where a batch needs Python (from its datagram ``handled`` on, one that is not the
 * common case, or a socket error), else 0: the call is done, a timer is due
 * (``wake``), or the progress log is (``log_interval`` after the later of
 * ``logged_at`` and the last answer). */
EXPORT int fp_run(struct fp_call *c, struct mmsghdr *msgs, int rows, int fd, int gso,
                  double wake, double logged_at, double log_interval, double coalesce,
                  int64_t coalesce_batch) {
    c->run_results = c->run_sent = 0;
    c->err = c->recv_err = 0;
    c->wake = wake;
    while (c->in_flight > 0) {
        double now = monotonic();
        double log_at = fmax(c->progress_at, logged_at) + log_interval;
        double until = c->wake < log_at ? c->wake : log_at;
        int ready = 1;
        if (c->wake > now) {
            struct timespec ts = timespec_of(until - now > 0 ? until - now : 0);
            struct pollfd p = {.fd = fd, .events = POLLIN};
            ready = ppoll(&p, 1, &ts, NULL) > 0;
            c->t_wait += monotonic() - now;
        }
        int64_t drained = 0;
        while (ready) {     /* the whole queue first: answers behind a stall are not lost */
            int64_t handled = fp_receive(c, msgs, rows, monotonic(), fd, gso);
            drained += c->datagrams;
            if (handled < c->datagrams || c->err || c->recv_err) {
                c->handled = handled;
                return 1;
            }
            if (c->datagrams < rows)
                break;
        }
        if (drained) {
            c->wake = fp_next_wakeup(c, c->rto, c->peer_timeout, c->progress_at, c->rack_seq,
                                     c->rack_rtt, isinf(c->min_rtt) ? c->rto : c->min_rtt / 4);
            if (drained < coalesce_batch && c->in_flight > 0) {
                double before = monotonic(), pause = fmin(coalesce, c->wake - before);
                struct timespec ts = timespec_of(pause);
                while (pause > 0 && nanosleep(&ts, &ts) < 0 && errno == EINTR) {}
                c->t_wait += monotonic() - before;
            }
        }
        now = monotonic();
        if (now >= c->wake || now - fmax(c->progress_at, logged_at) >= log_interval)
            return 0;
    }
    return 0;
}

/* quantize_row and dequantize_row alone, for the tests against numpy. */
EXPORT void fp_quantize(struct fp_call *c, const float *x, int64_t own, int64_t scale,
                        uint8_t *dst) {
    quantize_row(c, x, own, scale, dst);
}

EXPORT void fp_dequantize(struct fp_call *c, const uint8_t *src, int64_t scale, float *out) {
    dequantize_row(c, src, scale, out);
}
