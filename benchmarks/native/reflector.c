/* The machine's ceiling for bench_switch: a program that only reflects frames.
 *
 *     [SOFTSWITCH_TX=sendmmsg|af_xdp] [REFLECTOR_LINEAR=1] reflector IFACE...
 *
 * Two AF_PACKET sockets per interface, as the switch has: one receives (promiscuous,
 * outgoing frames ignored), one only sends. epoll over the first, recvmmsg a batch,
 * send it back out of the interface it came in on: the same system calls the native
 * switch makes, with no pipeline at all. It sends as the switch does under the same
 * SOFTSWITCH_TX, with the switch's own code: sendmmsg (mmsg.c), or through an AF_XDP
 * socket per interface (xsk.c), falling back to sendmmsg where one cannot be bound.
 * sendmmsg's frames are linear, as the switch's, with REFLECTOR_LINEAR=1; without,
 * a frame over a page goes in page fragments, as sendmmsg's do by default, which
 * bench_switch measured faster here (it times both, and takes the faster). Prints how it sends once it is ready ("ready: ...");
 * runs until SIGTERM.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../../innet_aggregation/softswitch/backends/native/mmsg.c"
#include "../../innet_aggregation/softswitch/backends/native/xsk.c"

#ifndef PACKET_IGNORE_OUTGOING
#define PACKET_IGNORE_OUTGOING 23
#endif
#define BATCH 64
#define SLOT 16384

static volatile sig_atomic_t stop;
static void on_term(int sig) { (void)sig; stop = 1; }

/* The longest frame the interface takes (its MTU, an Ethernet header and a VLAN
 * tag), as the switch's ss_port_frame. */
static uint32_t port_frame(int fd, const char *ifname) {
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "%s", ifname);
    if (ioctl(fd, SIOCGIFMTU, &ifr) || ifr.ifr_mtu <= 0 || ifr.ifr_mtu + 18 > SLOT - 4)
        return SLOT - 4;
    return (uint32_t)ifr.ifr_mtu + 18;
}

int main(int argc, char **argv) {
    int n = argc - 1, fds[64];
    static ss_mmsg txs[64];
    static ss_xsk xsk[64];
    const char *tx = getenv("SOFTSWITCH_TX"), *lin = getenv("REFLECTOR_LINEAR");
    int linear = lin && !strcmp(lin, "1");
    if (!tx) tx = "sendmmsg";
    if (n < 1 || n > 64) { fprintf(stderr, "usage: reflector IFACE...\n"); return 2; }
    if (strcmp(tx, "sendmmsg") && strcmp(tx, "af_xdp")) {
        fprintf(stderr, "SOFTSWITCH_TX must be one of sendmmsg, af_xdp, got '%s'\n", tx);
        return 2;
    }
    signal(SIGTERM, on_term);
    signal(SIGINT, on_term);
    int ep = epoll_create1(0);
    char said[4096] = "";
    for (int i = 0; i < n; i++) {
        int ifindex = (int)if_nametoindex(argv[i + 1]);
        if (!ifindex) { perror(argv[i + 1]); return 1; }
        fds[i] = socket(AF_PACKET, SOCK_RAW, htons(ETH_P_ALL));
        if (fds[i] < 0) { perror("socket"); return 1; }
        struct sockaddr_ll sll = {.sll_family = AF_PACKET, .sll_protocol = htons(ETH_P_ALL),
                                  .sll_ifindex = ifindex};
        if (bind(fds[i], (struct sockaddr *)&sll, sizeof sll)) { perror("bind"); return 1; }
        struct packet_mreq mr = {.mr_ifindex = ifindex, .mr_type = PACKET_MR_PROMISC};
        setsockopt(fds[i], SOL_PACKET, PACKET_ADD_MEMBERSHIP, &mr, sizeof mr);
        int one = 1, buf = 4 << 20;
        setsockopt(fds[i], SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof one);
        setsockopt(fds[i], SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
        int bad = ss_mmsg_open(&txs[i], ifindex, port_frame(fds[i], argv[i + 1]), linear);
        if (bad) { fprintf(stderr, "%s: send socket: %s\n", argv[i + 1], strerror(-bad)); return 1; }
        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
        epoll_ctl(ep, EPOLL_CTL_ADD, fds[i], &ev);
        xsk[i].fd = -1;
        if (strcmp(tx, "af_xdp")) continue;
        int err = ss_xsk_open(&xsk[i], ifindex, port_frame(fds[i], argv[i + 1]));
        size_t at = strlen(said);
        snprintf(said + at, sizeof said - at, "%s%s %s", at ? ", " : "", argv[i + 1],
                 err ? strerror(-err) : "AF_XDP");
    }
    int linears = 0;
    for (int i = 0; i < n; i++) linears += txs[i].vnet;
    printf("ready: sends %s%s%s%s\n", tx, linears ? ", linear frames" : "", *said ? ": " : "", said);
    fflush(stdout);
    static char bufs[BATCH][SLOT];
    struct mmsghdr msgs[BATCH];
    struct iovec iov[BATCH];
    struct epoll_event evs[64];
    uint64_t sent = 0, lost = 0;
    while (!stop) {
        int ne = epoll_wait(ep, evs, 64, 100);
        for (int e = 0; e < ne; e++) {
            int i = (int)evs[e].data.u32, fd = fds[i];
            for (int j = 0; j < BATCH; j++) {
                iov[j].iov_base = bufs[j];
                iov[j].iov_len = SLOT;
                memset(&msgs[j], 0, sizeof msgs[j]);
                msgs[j].msg_hdr.msg_iov = &iov[j];
                msgs[j].msg_hdr.msg_iovlen = 1;
            }
            int r = recvmmsg(fd, msgs, BATCH, MSG_DONTWAIT, NULL);
            if (r <= 0) continue;
            for (int j = 0; j < r; j++) iov[j].iov_len = msgs[j].msg_len;
            if (xsk[i].fd >= 0) ss_xsk_send(&xsk[i], iov, (uint32_t)r, &sent, &lost);
            else ss_mmsg_send(&txs[i], iov, (uint32_t)r, &sent, &lost);
        }
    }
    for (int i = 0; i < n; i++) ss_mmsg_close(&txs[i]);
    return 0;
}
