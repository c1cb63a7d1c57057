/* What one frame's send costs through each of the kernel's AF_PACKET-side interfaces
 * on this machine (benchmarks/bench_tx.py runs it over a veth pair):
 *
 *     txbench IFACE METHOD BYTES SECONDS
 *
 * METHOD: mmsg (sendmmsg of 64, what the reflector and the native switch make),
 * mmsg-bypass (the same with PACKET_QDISC_BYPASS), ring and ring-bypass
 * (PACKET_TX_RING, TPACKET_V2, 64 frames a send() kick), uring (io_uring, 64
 * IORING_OP_SENDMSG a submission, raw system calls: no liburing here), xdp (AF_XDP in
 * copy mode, 64 descriptors a kick). Prints "frames cpu_seconds wall_seconds". */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <linux/if_xdp.h>
#include <linux/io_uring.h>
#include <net/if.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef SOL_XDP
#define SOL_XDP 283
#endif
#ifndef AF_XDP
#define AF_XDP 44
#endif
#ifndef XDP_USE_SG
#define XDP_USE_SG (1 << 4)      /* this machine's headers predate it (kernel 6.6) */
#endif
#ifndef XDP_PKT_CONTD
#define XDP_PKT_CONTD (1 << 0)
#endif
#define BATCH 64

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static double cpu(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

static void die(const char *what) { perror(what); exit(1); }

static int packet_socket(int ifindex, int bypass) {
    int fd = socket(AF_PACKET, SOCK_RAW, 0);   /* protocol 0: receives nothing */
    if (fd < 0) die("socket");
    struct sockaddr_ll sll = {.sll_family = AF_PACKET, .sll_ifindex = ifindex};
    if (bind(fd, (struct sockaddr *)&sll, sizeof sll)) die("bind");
    int one = 1, buf = 4 << 20;
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    if (bypass && setsockopt(fd, SOL_PACKET, PACKET_QDISC_BYPASS, &one, sizeof one))
        die("PACKET_QDISC_BYPASS");
    return fd;
}

static unsigned char frame[16384];

static long run_mmsg(int fd, int len, double until) {
    struct mmsghdr m[BATCH];
    struct iovec iov = {frame, (size_t)len};
    memset(m, 0, sizeof m);
    for (int j = 0; j < BATCH; j++) { m[j].msg_hdr.msg_iov = &iov; m[j].msg_hdr.msg_iovlen = 1; }
    long n = 0;
    while (now() < until)
        for (int i = 0; i < 16; i++) {
            int r = sendmmsg(fd, m, BATCH, 0);
            if (r < 0 && errno != ENOBUFS) die("sendmmsg");
            if (r > 0) n += r;
        }
    return n;
}

static long run_ring(int fd, int len, double until) {
    int v = TPACKET_V2;
    if (setsockopt(fd, SOL_PACKET, PACKET_VERSION, &v, sizeof v)) die("PACKET_VERSION");
    unsigned fsz = 1u << 14, nf = 256;
    struct tpacket_req req = {.tp_block_size = fsz, .tp_block_nr = nf, .tp_frame_size = fsz,
                              .tp_frame_nr = nf};
    if (setsockopt(fd, SOL_PACKET, PACKET_TX_RING, &req, sizeof req)) die("PACKET_TX_RING");
    uint8_t *map = mmap(NULL, (size_t)fsz * nf, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) die("mmap");
    unsigned head = 0;
    long n = 0;
    while (now() < until)
        for (int i = 0; i < 16; i++) {
            int put = 0;
            for (; put < BATCH; put++) {
                struct tpacket2_hdr *h = (void *)(map + (size_t)head * fsz);
                if (__atomic_load_n(&h->tp_status, __ATOMIC_ACQUIRE) != TP_STATUS_AVAILABLE) break;
                memcpy((uint8_t *)h + TPACKET2_HDRLEN - sizeof(struct sockaddr_ll), frame, len);
                h->tp_len = len;
                __atomic_store_n(&h->tp_status, TP_STATUS_SEND_REQUEST, __ATOMIC_RELEASE);
                head = (head + 1) % nf;
            }
            if (send(fd, NULL, 0, 0) < 0 && errno != ENOBUFS) die("send");
            n += put;
        }
    return n;
}

static long run_uring(int fd, int len, double until) {
    struct io_uring_params p;
    memset(&p, 0, sizeof p);
    int ring = (int)syscall(__NR_io_uring_setup, BATCH, &p);
    if (ring < 0) die("io_uring_setup");
    size_t sq_sz = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    size_t cq_sz = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
    uint8_t *sq = mmap(NULL, sq_sz, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, ring, IORING_OFF_SQ_RING);
    uint8_t *cq = mmap(NULL, cq_sz, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, ring, IORING_OFF_CQ_RING);
    struct io_uring_sqe *sqes = mmap(NULL, p.sq_entries * sizeof *sqes, PROT_READ | PROT_WRITE,
                                     MAP_SHARED | MAP_POPULATE, ring, IORING_OFF_SQES);
    if (sq == MAP_FAILED || cq == MAP_FAILED || sqes == MAP_FAILED) die("mmap io_uring");
    unsigned *sq_tail = (void *)(sq + p.sq_off.tail), *sq_mask = (void *)(sq + p.sq_off.ring_mask);
    unsigned *sq_array = (void *)(sq + p.sq_off.array);
    unsigned *cq_head = (void *)(cq + p.cq_off.head), *cq_tail = (void *)(cq + p.cq_off.tail);
    unsigned *cq_mask = (void *)(cq + p.cq_off.ring_mask);
    struct io_uring_cqe *cqes = (void *)(cq + p.cq_off.cqes);
    struct iovec iov = {frame, (size_t)len};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    long n = 0;
    while (now() < until)
        for (int i = 0; i < 16; i++) {
            unsigned tail = *sq_tail;
            for (int j = 0; j < BATCH; j++, tail++) {
                unsigned idx = tail & *sq_mask;
                struct io_uring_sqe *e = &sqes[idx];
                memset(e, 0, sizeof *e);
                e->opcode = IORING_OP_SENDMSG;
                e->fd = fd;
                e->addr = (uint64_t)(uintptr_t)&mh;
                e->len = 1;
                sq_array[idx] = idx;
            }
            __atomic_store_n(sq_tail, tail, __ATOMIC_RELEASE);
            if (syscall(__NR_io_uring_enter, ring, BATCH, BATCH, IORING_ENTER_GETEVENTS, NULL, 0) < 0)
                die("io_uring_enter");
            unsigned head = *cq_head, end = __atomic_load_n(cq_tail, __ATOMIC_ACQUIRE);
            for (; head != end; head++)
                if (cqes[head & *cq_mask].res > 0) n++;
            __atomic_store_n(cq_head, head, __ATOMIC_RELEASE);
        }
    return n;
}

static long run_xdp(int ifindex, int len, double until) {
    int fd = socket(AF_XDP, SOCK_RAW, 0);
    if (fd < 0) die("socket(AF_XDP)");
    /* chunks of a page (more needs huge pages): a longer frame is several chunks,
     * XDP_PKT_CONTD on all but its last (multi-buffer, XDP_USE_SG) */
    unsigned nf = 256, fsz = 4096, segs = ((unsigned)len + fsz - 1) / fsz;
    void *umem = mmap(NULL, (size_t)nf * fsz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (umem == MAP_FAILED) die("mmap umem");
    struct xdp_umem_reg reg = {.addr = (uint64_t)(uintptr_t)umem, .len = (uint64_t)nf * fsz, .chunk_size = fsz};
    if (setsockopt(fd, SOL_XDP, XDP_UMEM_REG, &reg, sizeof reg)) die("XDP_UMEM_REG");
    int ents = (int)nf;
    if (setsockopt(fd, SOL_XDP, XDP_UMEM_FILL_RING, &ents, sizeof ents) ||
        setsockopt(fd, SOL_XDP, XDP_UMEM_COMPLETION_RING, &ents, sizeof ents) ||
        setsockopt(fd, SOL_XDP, XDP_TX_RING, &ents, sizeof ents)) die("XDP rings");
    struct xdp_mmap_offsets off;
    socklen_t ol = sizeof off;
    if (getsockopt(fd, SOL_XDP, XDP_MMAP_OFFSETS, &off, &ol)) die("XDP_MMAP_OFFSETS");
    uint8_t *tx = mmap(NULL, off.tx.desc + nf * sizeof(struct xdp_desc), PROT_READ | PROT_WRITE,
                       MAP_SHARED | MAP_POPULATE, fd, XDP_PGOFF_TX_RING);
    uint8_t *cr = mmap(NULL, off.cr.desc + nf * sizeof(uint64_t), PROT_READ | PROT_WRITE,
                       MAP_SHARED | MAP_POPULATE, fd, XDP_UMEM_PGOFF_COMPLETION_RING);
    if (tx == MAP_FAILED || cr == MAP_FAILED) die("mmap xdp");
    struct sockaddr_xdp sx = {.sxdp_family = AF_XDP, .sxdp_ifindex = (unsigned)ifindex,
                              .sxdp_queue_id = 0,
                              .sxdp_flags = XDP_COPY | (segs > 1 ? XDP_USE_SG : 0)};
    /* EBUSY: the last run's socket still holds the queue (freed after the process) */
    for (int tries = 0; bind(fd, (struct sockaddr *)&sx, sizeof sx); tries++) {
        if (errno != EBUSY || tries == 200) die("bind(AF_XDP, XDP_COPY)");
        usleep(10000);
    }
    for (unsigned i = 0; i < nf; i++) memcpy((uint8_t *)umem + (size_t)i * fsz, frame, len);
    unsigned *tx_prod = (void *)(tx + off.tx.producer), *tx_cons = (void *)(tx + off.tx.consumer);
    struct xdp_desc *txd = (void *)(tx + off.tx.desc);
    unsigned *cr_prod = (void *)(cr + off.cr.producer), *cr_cons = (void *)(cr + off.cr.consumer);
    unsigned prod = 0, free_chunks = nf, next = 0;
    long n = 0;
    while (now() < until)
        for (int i = 0; i < 16; i++) {
            unsigned cons = __atomic_load_n(tx_cons, __ATOMIC_ACQUIRE);
            int put = 0;
            for (; put < BATCH && free_chunks >= segs && prod + segs - cons <= nf; put++) {
                /* the frame is copied in as the switch would write each output */
                for (unsigned s = 0, at = 0; s < segs; s++, at += fsz, prod++, free_chunks--) {
                    unsigned part = (unsigned)len - at < fsz ? (unsigned)len - at : fsz;
                    memcpy((uint8_t *)umem + (size_t)next * fsz, frame + at, part);
                    txd[prod & (nf - 1)] = (struct xdp_desc){.addr = (uint64_t)next * fsz, .len = part,
                                                             .options = s + 1 < segs ? XDP_PKT_CONTD : 0};
                    next = (next + 1) % nf;
                }
            }
            __atomic_store_n(tx_prod, prod, __ATOMIC_RELEASE);
            if (sendto(fd, NULL, 0, MSG_DONTWAIT, NULL, 0) < 0 && errno != EAGAIN && errno != ENOBUFS
                && errno != EBUSY) die("sendto(AF_XDP)");
            unsigned cp = __atomic_load_n(cr_prod, __ATOMIC_ACQUIRE), cc = *cr_cons;
            n += (cp - cc) / segs;
            free_chunks += cp - cc;
            __atomic_store_n(cr_cons, cp, __ATOMIC_RELEASE);
        }
    return n;
}

int main(int argc, char **argv) {
    if (argc != 5) { fprintf(stderr, "usage: txbench IFACE METHOD BYTES SECONDS\n"); return 2; }
    int ifindex = (int)if_nametoindex(argv[1]), len = atoi(argv[3]);
    const char *m = argv[2];
    if (!ifindex) die(argv[1]);
    if (len < 60 || len > 9000) { fprintf(stderr, "BYTES 60-9000\n"); return 2; }
    /* Ethernet to a MAC nobody has (the peer drops it at its link layer), IPv4 type */
    memcpy(frame, "\x02\xbb\x00\x00\x00\x09\x02\xaa\x00\x00\x00\x01\x08\x00", 14);
    for (int i = 14; i < len; i++) frame[i] = (unsigned char)i;
    double until = now() + atof(argv[4]), c0 = cpu(), t0 = now();
    long n;
    if (!strcmp(m, "mmsg")) n = run_mmsg(packet_socket(ifindex, 0), len, until);
    else if (!strcmp(m, "mmsg-bypass")) n = run_mmsg(packet_socket(ifindex, 1), len, until);
    else if (!strcmp(m, "ring")) n = run_ring(packet_socket(ifindex, 0), len, until);
    else if (!strcmp(m, "ring-bypass")) n = run_ring(packet_socket(ifindex, 1), len, until);
    else if (!strcmp(m, "uring")) n = run_uring(packet_socket(ifindex, 0), len, until);
    else if (!strcmp(m, "xdp")) n = run_xdp(ifindex, len, until);
    else { fprintf(stderr, "unknown METHOD %s\n", m); return 2; }
    printf("%ld %.6f %.6f\n", n, cpu() - c0, now() - t0);
    return 0;
}
