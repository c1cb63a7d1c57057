/* Native softswitch runtime, the AF_PACKET I/O: a receive ring per port, batched
 * sends, the ports shared out among one or more lanes (I/O threads), and the counters
 * of what was received, sent and lost.
 *
 * Not compiled on its own: runtime.c includes it last, after the packet path it
 * drives.
 */

#include "xsk.c"

/* ------------------------------------------------------------------ I/O loop */

static int ss_port_known(const ss_ctx *c, uint32_t port) {
    return port < SS_MAXPORTS && c->port_index[port] >= 0;
}

/* A stage's frames out of port index k: with sendmmsg on the port's linear send
 * socket (mmsg.c; on the socket the caller opened where it has none), or through
 * its AF_XDP socket where it has one. */
static void ss_send_stage(ss_ctx *c, int k, ss_stage *st) {
    struct iovec iov[SS_PORT_TXMAX];
    for (uint32_t j = 0; j < st->n; j++) {
        iov[j].iov_base = st->tx[j].buf;
        iov[j].iov_len = st->tx[j].len;
    }
    uint64_t sent = 0, lost = 0;
    ss_mmsg plain = {.fd = c->txfd[k], .vnet = 0};
    if (c->xsk && c->xsk[k].fd >= 0) ss_xsk_send(&c->xsk[k], iov, st->n, &sent, &lost);
    else ss_mmsg_send(c->mmsg[k].fd >= 0 ? &c->mmsg[k] : &plain, iov, st->n, &sent, &lost);
    if (sent) SS_COUNT(c->stat_tx, sent);
    if (lost) SS_COUNT(c->stat_txerr, lost);
    st->n = 0;
}

/* A port's queue lock: only lanes share a queue (a control-plane call's frames go to
 * its own outputs), so one lane takes none. */
static void ss_q_lock(ss_ctx *c, ss_outq *q) {
    if (c->nlanes > 1) pthread_mutex_lock(&q->mu);
}

static void ss_q_unlock(ss_ctx *c, ss_outq *q) {
    if (c->nlanes > 1) pthread_mutex_unlock(&q->mu);
}

/* Send what port index k has staged, unless another lane is sending its frames (it
 * takes these too when it is done); with q->mu held, released around the sends. */
static void ss_send_staged(ss_ctx *c, int k) {
    ss_outq *q = &c->outq[k];
    while (!q->busy && q->st[q->fill].n) {
        ss_stage *st = &q->st[q->fill];
        q->fill ^= 1;
        q->busy = 1;
        ss_q_unlock(c, q);
        ss_send_stage(c, k, st);
        ss_q_lock(c, q);
        q->busy = 0;
    }
}

static void ss_flush_port(ss_ctx *c, int k) {
    ss_outq *q = &c->outq[k];
    ss_q_lock(c, q);
    ss_send_staged(c, k);
    ss_q_unlock(c, q);
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
    ss_q_lock(c, q);
    while (q->st[q->fill].n == SS_PORT_TXMAX) {
        if (!q->busy) {
            ss_send_staged(c, k);
            continue;
        }
        ss_q_unlock(c, q);
        sched_yield();
        ss_q_lock(c, q);
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
    ss_q_unlock(c, q);
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

/* An AF_XDP socket a port where one was asked for (ss_io_start's tx), on the
 * interface its send socket is bound to; where none can be had, the port sends with
 * sendmmsg, and tx_state says why (-errno; 1: AF_XDP, 0: not asked). */
static int ss_xsk_start(ss_ctx *c, int n) {
    if (!c->tx_xdp) {
        for (int k = 0; k < n; k++) c->tx_state[k] = 0;
        return 0;
    }
    if (!(c->xsk = calloc((size_t)(n > 0 ? n : 1), sizeof *c->xsk))) return -1;
    for (int k = 0; k < n; k++) {
        struct sockaddr_ll sll;
        socklen_t len = sizeof sll;
        c->xsk[k].fd = -1;
        if (getsockname(c->txfd[k], (struct sockaddr *)&sll, &len)) c->tx_state[k] = -errno;
        else c->tx_state[k] = ss_xsk_open(&c->xsk[k], sll.sll_ifindex, ss_port_frame(c->txfd[k]));
        if (!c->tx_state[k]) c->tx_state[k] = 1;
    }
    return 0;
}

static void ss_xsk_stop(ss_ctx *c) {
    for (int k = 0; c->xsk && k < c->nports; k++)
        if (c->xsk[k].fd >= 0) ss_xsk_close(&c->xsk[k]);
    free(c->xsk);
    c->xsk = NULL;
}

/* How port index k sends in the running loop: 1 AF_XDP, 0 sendmmsg (as asked), or
 * -errno: AF_XDP was asked for and could not be had, so sendmmsg. */
SS_EXPORT int ss_io_tx(ss_ctx *c, int k) {
    return k >= 0 && k < c->nports ? c->tx_state[k] : 0;
}

/* A linear send socket a port that sends with sendmmsg (mmsg.c; after ss_xsk_start),
 * on the interface its send socket is bound to; a port without one (fd -1) sends on
 * that socket. */
static void ss_mmsg_start(ss_ctx *c, int n) {
    for (int k = 0; k < n; k++) {
        struct sockaddr_ll sll;
        socklen_t len = sizeof sll;
        c->mmsg[k].fd = -1;
        if (c->xsk && c->xsk[k].fd >= 0) continue;
        if (!getsockname(c->txfd[k], (struct sockaddr *)&sll, &len))
            ss_mmsg_open(&c->mmsg[k], sll.sll_ifindex, ss_port_frame(c->txfd[k]), 1);
    }
}

static void ss_mmsg_stop(ss_ctx *c, int n) {
    for (int k = 0; k < n; k++) ss_mmsg_close(&c->mmsg[k]);
}

static void ss_lanes_join(ss_ctx *c, int n) {
    c->stop = 1;
    for (int i = 0; i < n; i++) pthread_join(c->lane[i].thread, NULL);
}

/* Start the data plane's threads, ``lanes`` of them (1 to SS_MAXLANES, at most one a
 * port), on sockets the caller opened (and still owns); with ``tx_xdp``, each port
 * sends through an AF_XDP socket of its own where it can have one (ss_io_tx). */
SS_EXPORT int ss_io_start(ss_ctx *c, int n, const int *ports, const int *rxfds, const int *txfds,
                          int lanes, int tx_xdp) {
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
    c->tx_xdp = tx_xdp;
    if (ss_xsk_start(c, n)) return -1;
    for (int k = 0; k < n; k++)
        if (ss_ring_open(&c->ring[k], rxfds[k])) {
            ss_rings_close(c, k);
            ss_xsk_stop(c);
            return -1;
        }
    ss_mmsg_start(c, n);
    for (int i = 0; i < lanes; i++)
        if (pthread_create(&c->lane[i].thread, NULL, ss_loop, &c->lane[i])) {
            ss_lanes_join(c, i);
            ss_rings_close(c, n);
            ss_xsk_stop(c);
            ss_mmsg_stop(c, n);
            return -1;
        }
    c->running = 1;
    return 0;
}

SS_EXPORT void ss_io_stop(ss_ctx *c) {
    if (!c->running) return;
    ss_lanes_join(c, c->nlanes);
    ss_rings_close(c, c->nports);
    ss_xsk_stop(c);
    ss_mmsg_stop(c, c->nports);
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
