/* Sending frames with sendmmsg on an AF_PACKET socket: the native switch's io.c and
 * the bench's reflector (benchmarks/native/reflector.c) include this file, so the
 * ceiling bench-switch compares with sends the way the switch does.
 *
 * A socket of its own per interface, send-only (protocol 0), whose frames can go
 * linear: behind a virtio-net header (PACKET_VNET_HDR, no offload asked) whose
 * hdr_len is the whole frame, so the kernel builds each frame's skb in one piece.
 * Without it a frame longer than a page (1,024 values a packet) gets a linear part
 * of its Ethernet header alone and the rest in page fragments, and the kernel's
 * first look at its IP and UDP headers (packet_parse_headers' flow dissection, on
 * the sending core) copies them out of a page last written on another core. A
 * frame of a page or less is linear either way, so a socket whose interface's MTU
 * keeps frames under a page sends plain frames (the header costs a few per cent
 * of a small frame's send). The socket is the switch's own, so
 * what Python sends on the port's socket (a PacketOut's outputs, the Python loop)
 * stays plain frames.
 */
#include <errno.h>
#include <linux/if_packet.h>
#include <linux/virtio_net.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#ifndef PACKET_VNET_HDR
#define PACKET_VNET_HDR 15
#endif
#define SS_MMSG_MAX 128              /* frames a sendmmsg call */
#define SS_MMSG_SNDBUF (4 << 20)     /* as dataplane.py's send sockets */
#define SS_MMSG_HEADROOM 256         /* over the kernel's: a frame this far under a page is linear */

typedef struct ss_mmsg {
    int fd;
    int vnet;                    /* the kernel took the header: frames go linear */
} ss_mmsg;

/* A send socket on ifindex, whose frames are at most maxlen bytes: linear where
 * ``linear`` asks, such a frame could go in fragments, and the kernel takes the
 * header; 0, or -errno and m->fd -1. */
static int ss_mmsg_open(ss_mmsg *m, int ifindex, uint32_t maxlen, int linear) {
    int one = 1, buf = SS_MMSG_SNDBUF;
    struct sockaddr_ll sll = {.sll_family = AF_PACKET, .sll_ifindex = ifindex};
    m->vnet = 0;
    m->fd = socket(AF_PACKET, SOCK_RAW, 0);
    if (m->fd < 0) return -errno;
    if (bind(m->fd, (struct sockaddr *)&sll, sizeof sll)) {
        int err = -errno;
        close(m->fd);
        m->fd = -1;
        return err;
    }
    setsockopt(m->fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    m->vnet = linear && maxlen + SS_MMSG_HEADROOM > (uint32_t)sysconf(_SC_PAGESIZE)
              && !setsockopt(m->fd, SOL_PACKET, PACKET_VNET_HDR, &one, sizeof one);
    return 0;
}

static void ss_mmsg_close(ss_mmsg *m) {
    if (m->fd >= 0) close(m->fd);
    m->fd = -1;
}

/* n frames out of m, iov[j] the j-th, in order; a frame the kernel refuses (e.g.
 * EMSGSIZE) is lost, not the ones after it. */
static void ss_mmsg_send(const ss_mmsg *m, const struct iovec *iov, uint32_t n,
                         uint64_t *sent, uint64_t *lost) {
    struct mmsghdr msgs[SS_MMSG_MAX];
    struct iovec parts[SS_MMSG_MAX][2];
    struct virtio_net_hdr hdr[SS_MMSG_MAX];
    for (uint32_t at = 0; at < n;) {
        uint32_t count = n - at < SS_MMSG_MAX ? n - at : SS_MMSG_MAX;
        for (uint32_t j = 0; j < count; j++) {
            memset(&msgs[j], 0, sizeof msgs[j]);
            parts[j][1] = iov[at + j];
            if (m->vnet) {
                memset(&hdr[j], 0, sizeof hdr[j]);
                hdr[j].hdr_len = (uint16_t)iov[at + j].iov_len;   /* host order: a legacy header */
                parts[j][0].iov_base = &hdr[j];
                parts[j][0].iov_len = sizeof hdr[j];
            }
            msgs[j].msg_hdr.msg_iov = m->vnet ? parts[j] : &parts[j][1];
            msgs[j].msg_hdr.msg_iovlen = m->vnet ? 2 : 1;
        }
        uint32_t done = 0;
        while (done < count) {
            int r = sendmmsg(m->fd, msgs + done, count - done, 0);
            if (r > 0) {
                done += (uint32_t)r;
                *sent += (uint64_t)r;
            } else if (r < 0 && errno == EINTR) {
                continue;
            } else {
                *lost += 1;
                done++;
            }
        }
        at += count;
    }
}
