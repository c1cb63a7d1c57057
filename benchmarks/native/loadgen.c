/* Load generator for bench_switch: drives the workers' sockets from C.
 *
 * Built at bench time as a shared object and called through ctypes (no GIL held).
 * ``frames`` holds ``cycle`` aggregations x ``nsock`` workers, each ``flen`` bytes;
 * aggregation i sends frame (first + i) % cycle from every worker. At most
 * ``window`` aggregations are in flight: one completes when a frame of type
 * ``want`` (byte 42: agg_h's message type) has come back to every worker.
 * Sends are batched with sendmmsg, receives with recvmmsg.
 */
#define _GNU_SOURCE
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#define BATCH 64

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Returns the results received; *elapsed: seconds from the first send to the last result. */
__attribute__((visibility("default")))
uint64_t run(int nsock, const int *fds, const uint8_t *frames, uint32_t flen, uint64_t cycle,
             uint64_t first, uint64_t naggs, uint32_t window, int want, double timeout,
             double *elapsed) {
    static uint8_t rx[BATCH][2048];
    struct mmsghdr msgs[BATCH];
    struct iovec iov[BATCH];
    uint64_t sent = 0, results = 0;
    double start = now(), last = start, progress = start;
    while (results < naggs * (uint64_t)nsock) {
        uint64_t completed = results / nsock;
        int busy = 0;
        if (sent < naggs && sent < completed + window) {
            uint64_t n = completed + window - sent;
            if (n > naggs - sent) n = naggs - sent;
            if (n > BATCH) n = BATCH;
            for (int w = 0; w < nsock; w++) {
                for (uint64_t j = 0; j < n; j++) {
                    uint64_t agg = (first + sent + j) % cycle;
                    iov[j].iov_base = (void *)(frames + (agg * nsock + w) * flen);
                    iov[j].iov_len = flen;
                    memset(&msgs[j], 0, sizeof msgs[j]);
                    msgs[j].msg_hdr.msg_iov = &iov[j];
                    msgs[j].msg_hdr.msg_iovlen = 1;
                }
                uint64_t done = 0;
                while (done < n) {
                    int r = sendmmsg(fds[w], msgs + done, (unsigned)(n - done), 0);
                    if (r <= 0) break;
                    done += r;
                }
            }
            sent += n;
            busy = 1;
        }
        for (int w = 0; w < nsock; w++) {
            for (int j = 0; j < BATCH; j++) {
                iov[j].iov_base = rx[j];
                iov[j].iov_len = sizeof rx[j];
                memset(&msgs[j], 0, sizeof msgs[j]);
                msgs[j].msg_hdr.msg_iov = &iov[j];
                msgs[j].msg_hdr.msg_iovlen = 1;
            }
            int r = recvmmsg(fds[w], msgs, BATCH, MSG_DONTWAIT, NULL);
            for (int j = 0; j < r; j++)
                if (msgs[j].msg_len > 42 && rx[j][42] == want) { results++; busy = 1; }
        }
        double t = now();
        if (busy) {
            progress = t;
            last = t;
        } else {
            if (t - progress > timeout) break;   /* the rest is lost */
            struct pollfd p[16];
            for (int w = 0; w < nsock && w < 16; w++) { p[w].fd = fds[w]; p[w].events = POLLIN; }
            poll(p, nsock < 16 ? nsock : 16, 1);
        }
    }
    *elapsed = last - start;
    return results;
}
