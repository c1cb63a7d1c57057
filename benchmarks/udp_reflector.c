/* The smallest switch a worker can talk to, and the smallest worker: the baseline
 * that `make bench-worker` measures the worker's own packet rate against.
 *
 *   udp_reflector reflect PORT
 *       answers every aggregation packet on 127.0.0.1:PORT as a one-worker switch
 *       would (msg_type RESULT, contributions 1, the rest echoed), in batches
 *       (recvmmsg/sendmmsg), until killed.
 *   udp_reflector drive PORT WINDOW SECONDS SIZE
 *       keeps WINDOW packets of SIZE bytes in flight to the reflector for SECONDS,
 *       sending one more per answer, and prints "<answers> <seconds>".
 *
 * The offsets of msg_type and contributions and the RESULT code come from the
 * caller's packet format through the environment (AGG_TYPE_OFFSET,
 * AGG_COUNT_OFFSET, AGG_RESULT_TYPE), so this file holds no second copy of it.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#define BATCH 256
#define MAXLEN 2048

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int udp_socket(int port) {
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    int size = 4 << 20;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(port),
                               .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (bind(fd, (struct sockaddr *)&addr, sizeof addr)) {
        perror("bind");
        exit(1);
    }
    return fd;
}

static int reflect(int port, int type_off, int count_off, int result_type) {
    static char buf[BATCH][MAXLEN];
    static struct sockaddr_in from[BATCH];
    static struct iovec iov[BATCH];
    static struct mmsghdr msgs[BATCH];
    int fd = udp_socket(port);
    for (;;) {
        for (int i = 0; i < BATCH; i++) {
            iov[i] = (struct iovec){buf[i], MAXLEN};
            msgs[i].msg_hdr = (struct msghdr){.msg_name = &from[i], .msg_namelen = sizeof from[i],
                                              .msg_iov = &iov[i], .msg_iovlen = 1};
        }
        int got = recvmmsg(fd, msgs, BATCH, MSG_WAITFORONE, NULL);
        if (got <= 0)
            continue;
        for (int i = 0; i < got; i++) {
            buf[i][type_off] = (char)result_type;
            buf[i][count_off] = 1;
            iov[i].iov_len = msgs[i].msg_len;
        }
        sendmmsg(fd, msgs, got, 0);
    }
}

static int drive(int port, int window, double seconds, int size) {
    static char buf[BATCH][MAXLEN];
    static struct iovec iov[BATCH];
    static struct mmsghdr msgs[BATCH];
    int fd = udp_socket(0);
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    connect(fd, (struct sockaddr *)&to, sizeof to);
    static char packet[MAXLEN];
    for (int sent = 0; sent < window;) {
        int n = window - sent < BATCH ? window - sent : BATCH;
        for (int i = 0; i < n; i++) {
            iov[i] = (struct iovec){packet, size};
            msgs[i].msg_hdr = (struct msghdr){.msg_iov = &iov[i], .msg_iovlen = 1};
        }
        sent += sendmmsg(fd, msgs, n, 0);
    }
    long answers = 0;
    double start = now(), end = start + seconds;
    while (now() < end) {
        for (int i = 0; i < BATCH; i++) {
            iov[i] = (struct iovec){buf[i], MAXLEN};
            msgs[i].msg_hdr = (struct msghdr){.msg_iov = &iov[i], .msg_iovlen = 1};
        }
        struct timespec wait = {0, 100000000};
        int got = recvmmsg(fd, msgs, BATCH, MSG_WAITFORONE, &wait);
        if (got <= 0)
            continue;
        answers += got;
        for (int i = 0; i < got; i++) {
            iov[i] = (struct iovec){packet, size};
            msgs[i].msg_hdr = (struct msghdr){.msg_iov = &iov[i], .msg_iovlen = 1};
        }
        sendmmsg(fd, msgs, got, 0);
    }
    printf("%ld %.6f\n", answers, now() - start);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "reflect")) {
        const char *t = getenv("AGG_TYPE_OFFSET"), *c = getenv("AGG_COUNT_OFFSET"),
                   *r = getenv("AGG_RESULT_TYPE");
        if (!t || !c || !r) {
            fprintf(stderr, "set AGG_TYPE_OFFSET, AGG_COUNT_OFFSET and AGG_RESULT_TYPE\n");
            return 2;
        }
        return reflect(atoi(argv[2]), atoi(t), atoi(c), atoi(r));
    }
    if (argc == 6 && !strcmp(argv[1], "drive"))
        return drive(atoi(argv[2]), atoi(argv[3]), atof(argv[4]), atoi(argv[5]));
    fprintf(stderr, "usage: %s reflect PORT | drive PORT WINDOW SECONDS SIZE\n", argv[0]);
    return 2;
}
