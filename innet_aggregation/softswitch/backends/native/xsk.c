/* Sending frames through AF_XDP in copy mode: the native switch's io.c and the
 * bench's reflector (benchmarks/native/reflector.c) include this file, so the
 * ceiling bench-switch compares with sends the way the switch does.
 *
 * TX only, no XDP program and no libbpf: a socket, its UMEM (chunks of a page; a
 * longer frame is several, XDP_PKT_CONTD on all but its last, where the kernel
 * has multi-buffer AF_XDP, 6.6 on), a TX ring and a completion ring, bound with
 * XDP_COPY to queue 0 of the interface. A send copies each frame into a free
 * chunk, writes its descriptors in order and kicks the kernel with sendto, which
 * builds an skb of it and hands it to the driver, past the qdisc (32 frames a
 * kick). A chunk is free again once its address comes back on the completion ring
 * (the skb was freed): never before, so no frame in flight is overwritten. When no
 * chunk or ring slot is free the sender waits for completions, as a blocking
 * sendmmsg waits for its socket's send buffer: nothing is dropped for want of room.
 */
#include <errno.h>
#include <linux/if_packet.h>
#include <linux/if_xdp.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#ifndef AF_XDP
#define AF_XDP 44
#endif
#ifndef SOL_XDP
#define SOL_XDP 283
#endif
#ifndef XDP_USE_SG
#define XDP_USE_SG (1 << 4)          /* headers before 6.6 lack it */
#endif
#ifndef XDP_PKT_CONTD
#define XDP_PKT_CONTD (1 << 0)
#endif
#define SS_XSK_CHUNK 4096u           /* a page: larger chunks need huge pages */
#define SS_XSK_CHUNKS 1024u          /* 4 MiB of frames in flight a port, as the AF_PACKET
                                        sockets' SO_SNDBUF; also the rings' sizes */
#define SS_XSK_WAIT_NS 20000         /* a sleep while no completion comes */
#define SS_XSK_STALLED_NS 1000000000LL   /* no progress for this long: the rest is lost */

typedef struct ss_xsk {
    int fd;
    uint8_t *umem;
    void *tx_map, *cr_map, *fr_map;
    size_t tx_size, cr_size, fr_size;
    uint32_t *tx_prod, *tx_cons, *cr_prod, *cr_cons;
    struct xdp_desc *txd;
    uint64_t *crd;
    uint32_t prod;               /* descriptors written; the kernel has taken those below *tx_cons */
    uint32_t counted;            /* descriptors whose frames are counted (sent or lost) */
    uint32_t owed;               /* frames the kernel dropped (EBUSY) not yet counted */
    uint32_t maxlen;             /* the longest frame it sends (the port's MTU, a header, a tag) */
    uint32_t nfree, free[SS_XSK_CHUNKS];   /* chunks no frame in flight holds */
} ss_xsk;

static void ss_xsk_close(ss_xsk *x) {
    if (x->tx_map) munmap(x->tx_map, x->tx_size);
    if (x->cr_map) munmap(x->cr_map, x->cr_size);
    if (x->fr_map) munmap(x->fr_map, x->fr_size);
    if (x->fd >= 0) close(x->fd);
    if (x->umem) munmap(x->umem, (size_t)SS_XSK_CHUNKS * SS_XSK_CHUNK);
    memset(x, 0, sizeof *x);
    x->fd = -1;
}

static int ss_xsk_bind(int fd, int ifindex, uint16_t flags) {
    struct sockaddr_xdp sx = {.sxdp_family = AF_XDP, .sxdp_ifindex = (uint32_t)ifindex,
                              .sxdp_queue_id = 0, .sxdp_flags = flags};
    /* EBUSY: a socket just closed (the last pipeline's) still holds the queue until
     * the kernel's deferred release runs */
    for (int tries = 0; bind(fd, (struct sockaddr *)&sx, sizeof sx); tries++) {
        if (errno != EBUSY || tries == 200) return -errno;
        usleep(10000);
    }
    return 0;
}

/* An AF_XDP socket sending on the interface's queue 0, for frames up to maxlen
 * bytes (longer ones are refused, as AF_PACKET refuses a frame over the MTU); 0, or
 * -errno of the step that failed (x closed then). */
static int ss_xsk_open(ss_xsk *x, int ifindex, uint32_t maxlen) {
    memset(x, 0, sizeof *x);
    int err = 0, n = (int)SS_XSK_CHUNKS;
    x->fd = socket(AF_XDP, SOCK_RAW | SOCK_CLOEXEC, 0);
    if (x->fd < 0) return -errno;
    /* Each frame's skb is charged to the socket until the peer takes it: at the
     * default send buffer (wmem_default) a kick of 4 KiB frames stops after a dozen,
     * EAGAIN. Room for the UMEM's worth (privileged), else as much as SO_SNDBUF gives. */
    int room = (int)(SS_XSK_CHUNKS * 2 * SS_XSK_CHUNK);
    if (setsockopt(x->fd, SOL_SOCKET, SO_SNDBUFFORCE, &room, sizeof room))
        setsockopt(x->fd, SOL_SOCKET, SO_SNDBUF, &room, sizeof room);
    x->umem = mmap(NULL, (size_t)SS_XSK_CHUNKS * SS_XSK_CHUNK, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (x->umem == MAP_FAILED) {
        x->umem = NULL;
        err = -errno;
        goto fail;
    }
    struct xdp_umem_reg reg = {.addr = (uint64_t)(uintptr_t)x->umem,
                               .len = (uint64_t)SS_XSK_CHUNKS * SS_XSK_CHUNK,
                               .chunk_size = SS_XSK_CHUNK};
    struct xdp_mmap_offsets off;
    socklen_t olen = sizeof off;
    if (setsockopt(x->fd, SOL_XDP, XDP_UMEM_REG, &reg, sizeof reg)
        || setsockopt(x->fd, SOL_XDP, XDP_UMEM_FILL_RING, &n, sizeof n)
        || setsockopt(x->fd, SOL_XDP, XDP_UMEM_COMPLETION_RING, &n, sizeof n)
        || setsockopt(x->fd, SOL_XDP, XDP_TX_RING, &n, sizeof n)
        || getsockopt(x->fd, SOL_XDP, XDP_MMAP_OFFSETS, &off, &olen)) {
        err = -errno;
        goto fail;
    }
    x->tx_size = off.tx.desc + SS_XSK_CHUNKS * sizeof(struct xdp_desc);
    x->cr_size = off.cr.desc + SS_XSK_CHUNKS * sizeof(uint64_t);
    x->fr_size = off.fr.desc + SS_XSK_CHUNKS * sizeof(uint64_t);
    x->tx_map = mmap(NULL, x->tx_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, x->fd,
                     XDP_PGOFF_TX_RING);
    x->cr_map = mmap(NULL, x->cr_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, x->fd,
                     XDP_UMEM_PGOFF_COMPLETION_RING);
    x->fr_map = mmap(NULL, x->fr_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, x->fd,
                     XDP_UMEM_PGOFF_FILL_RING);    /* unused (no RX), but the kernel wants it */
    if (x->tx_map == MAP_FAILED || x->cr_map == MAP_FAILED || x->fr_map == MAP_FAILED) {
        err = -errno;
        if (x->tx_map == MAP_FAILED) x->tx_map = NULL;
        if (x->cr_map == MAP_FAILED) x->cr_map = NULL;
        if (x->fr_map == MAP_FAILED) x->fr_map = NULL;
        goto fail;
    }
    /* multi-buffer only where a frame can be longer than a chunk (a kernel before 6.6
     * refuses it, EINVAL: the caller sends another way, not a frame lost) */
    x->maxlen = maxlen;
    if ((err = ss_xsk_bind(x->fd, ifindex, XDP_COPY | (maxlen > SS_XSK_CHUNK ? XDP_USE_SG : 0))))
        goto fail;
    uint8_t *tx = x->tx_map, *cr = x->cr_map;
    x->tx_prod = (uint32_t *)(tx + off.tx.producer);
    x->tx_cons = (uint32_t *)(tx + off.tx.consumer);
    x->txd = (struct xdp_desc *)(tx + off.tx.desc);
    x->cr_prod = (uint32_t *)(cr + off.cr.producer);
    x->cr_cons = (uint32_t *)(cr + off.cr.consumer);
    x->crd = (uint64_t *)(cr + off.cr.desc);
    for (uint32_t i = 0; i < SS_XSK_CHUNKS; i++) x->free[i] = SS_XSK_CHUNKS - 1 - i;
    x->nfree = SS_XSK_CHUNKS;
    return 0;
fail:
    ss_xsk_close(x);
    return err;
}

/* Chunks whose frames the kernel has finished with, free again; how many. */
static uint32_t ss_xsk_reap(ss_xsk *x) {
    uint32_t head = *x->cr_cons, tail = __atomic_load_n(x->cr_prod, __ATOMIC_ACQUIRE);
    for (uint32_t i = head; i != tail; i++)
        x->free[x->nfree++] = (uint32_t)(x->crd[i & (SS_XSK_CHUNKS - 1)] / SS_XSK_CHUNK);
    __atomic_store_n(x->cr_cons, tail, __ATOMIC_RELEASE);
    return tail - head;
}

/* Count the frames of the descriptors the kernel took since the last call: sent,
 * but for those it dropped (one an EBUSY); the kernel's consumer index. */
static uint32_t ss_xsk_count(ss_xsk *x, uint64_t *sent, uint64_t *lost) {
    uint32_t cons = __atomic_load_n(x->tx_cons, __ATOMIC_ACQUIRE), frames = 0;
    for (; x->counted != cons; x->counted++)
        frames += !(x->txd[x->counted & (SS_XSK_CHUNKS - 1)].options & XDP_PKT_CONTD);
    uint32_t dropped = frames < x->owed ? frames : x->owed;
    x->owed -= dropped;
    *sent += frames - dropped;
    *lost += dropped;
    return cons;
}

/* Send n frames, in order, after those sent before; returns once the kernel has
 * taken them all (frames it cannot send are counted in *lost: too long, dropped by
 * the device, the interface down or gone, or no progress for a second). */
static void ss_xsk_send(ss_xsk *x, const struct iovec *iov, uint32_t n, uint64_t *sent,
                        uint64_t *lost) {
    uint32_t i = 0, idle = 0;
    struct timespec since = {0, 0};
    for (;;) {
        uint32_t cons = ss_xsk_count(x, sent, lost), freed = ss_xsk_reap(x), put = 0;
        for (; i < n; i++, put++) {
            uint32_t len = (uint32_t)iov[i].iov_len;
            uint32_t segs = (len + SS_XSK_CHUNK - 1) / SS_XSK_CHUNK;
            if (len < 14 || len > x->maxlen) {     /* AF_PACKET: EINVAL, EMSGSIZE */
                (*lost)++;
                continue;
            }
            if (segs > x->nfree || x->prod + segs - cons > SS_XSK_CHUNKS) break;
            const uint8_t *from = iov[i].iov_base;
            for (uint32_t s = 0, at = 0; s < segs; s++, at += SS_XSK_CHUNK) {
                uint32_t chunk = x->free[--x->nfree];
                uint32_t part = len - at < SS_XSK_CHUNK ? len - at : SS_XSK_CHUNK;
                memcpy(x->umem + (size_t)chunk * SS_XSK_CHUNK, from + at, part);
                x->txd[x->prod++ & (SS_XSK_CHUNKS - 1)] = (struct xdp_desc){
                    .addr = (uint64_t)chunk * SS_XSK_CHUNK, .len = part,
                    .options = s + 1 < segs ? XDP_PKT_CONTD : 0};
            }
        }
        if (put) __atomic_store_n(x->tx_prod, x->prod, __ATOMIC_RELEASE);
        if (x->prod == cons) {
            if (i == n) return;
        } else if (sendto(x->fd, NULL, 0, MSG_DONTWAIT, NULL, 0) < 0) {
            if (errno == EBUSY) x->owed++;          /* the device dropped one */
            else if (errno == ENXIO || errno == ENETDOWN) {
                /* the interface went down or away: the kernel takes no more of the
                 * ring now; what waits there goes if it comes back, the rest is lost */
                *lost += n - i;
                return;
            }
            /* EAGAIN: a kick's 32 frames were sent, or the completion ring is full */
        }
        if (put || freed || __atomic_load_n(x->tx_cons, __ATOMIC_ACQUIRE) != cons) idle = 0;
        else if (++idle > 16) {
            /* the peer holds our frames (a socket not read yet): wait for it, but not
             * for ever (a device that never takes them) */
            struct timespec now;
            clock_gettime(CLOCK_MONOTONIC, &now);
            if (idle == 17) since = now;
            else if ((now.tv_sec - since.tv_sec) * 1000000000LL + now.tv_nsec - since.tv_nsec
                     > SS_XSK_STALLED_NS) {
                *lost += n - i;
                return;
            }
            struct timespec ts = {0, SS_XSK_WAIT_NS};
            nanosleep(&ts, NULL);
        }
    }
}
