/* The floor under any broker's CPU per heartbeat on this machine: a server that does nothing but the system calls
 * a RocketMQ broker needs to answer one request per read (epoll_wait, read, write), in C, one thread.
 *
 * It frames the remoting protocol (4-byte length, 4-byte header word, JSON header), reads each request's opaque
 * and answers SUCCESS with the opaque, as a broker's heartbeat answer looks to `rmqhb loadgen` (which checks every
 * answer's opaque). No registry, no decode beyond the opaque: what it costs is the kernel's share (and a little
 * user time), the part no implementation of the broker's logic can take away. BENCHMARKS.md ("The kernel's floor")
 * compares its CPU per heartbeat with the broker's under the same loadgen run.
 *
 *     gcc -O2 -o /tmp/floor_server bench/floor_server.c
 *     taskset -c 0 /tmp/floor_server 10979 &
 *     taskset -c 1 rmqhb loadgen steady --broker 127.0.0.1:10979 --clients 1000 --rate 20000 --burst 1 --vary \
 *         --duration 10 --server-pid $!
 *
 * A bench tool, not part of the package: frames are trusted (lengths are checked against the buffer, nothing
 * else), a connection whose frame does not fit the buffer or whose answers do not fit the socket is closed.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_FD 65536
#define BUF 65536

typedef struct {
    unsigned char *in;
    size_t len;
} conn_t;

static conn_t conns[MAX_FD];
static const char ANSWER_HEAD[] = "{\"code\":0,\"flag\":1,\"language\":\"JAVA\",\"opaque\":";
static const char ANSWER_TAIL[] = ",\"serializeTypeCurrentRPC\":\"JSON\",\"version\":479}";

static void drop(int ep, int fd) {
    epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
    close(fd);
    free(conns[fd].in);
    conns[fd].in = NULL;
    conns[fd].len = 0;
}

/* the opaque of a JSON header, or 0 when it has none */
static long opaque_of(const unsigned char *h, size_t n) {
    static const char key[] = "\"opaque\":";
    size_t k = sizeof(key) - 1;
    for (size_t i = 0; i + k <= n; i++) {
        if (h[i] == '"' && memcmp(h + i, key, k) == 0) {
            size_t j = i + k;
            int neg = 0;
            long v = 0;
            if (j < n && h[j] == '-') { neg = 1; j++; }
            while (j < n && h[j] >= '0' && h[j] <= '9') v = v * 10 + (h[j++] - '0');
            return neg ? -v : v;
        }
    }
    return 0;
}

static void serve(int ep, int fd) {
    conn_t *c = &conns[fd];
    ssize_t r = read(fd, c->in + c->len, BUF - c->len);
    if (r <= 0) {
        if (r < 0 && (errno == EAGAIN || errno == EINTR)) return;
        drop(ep, fd);
        return;
    }
    c->len += (size_t)r;
    unsigned char out[BUF];
    size_t o = 0, pos = 0;
    while (c->len - pos >= 8) {
        const unsigned char *f = c->in + pos;
        size_t total = ((size_t)f[0] << 24) | ((size_t)f[1] << 16) | ((size_t)f[2] << 8) | f[3];
        size_t hlen = ((size_t)f[5] << 16) | ((size_t)f[6] << 8) | f[7];
        if (total + 4 > BUF || hlen + 4 > total) { drop(ep, fd); return; }
        if (c->len - pos < total + 4) break;
        long opaque = opaque_of(f + 8, hlen);
        char header[160];
        int n = snprintf(header, sizeof header, "%s%ld%s", ANSWER_HEAD, opaque, ANSWER_TAIL);
        if (o + 8 + (size_t)n > sizeof out) break;  /* the rest waits for the next read */
        uint32_t be_total = htonl((uint32_t)(4 + n)), be_hlen = htonl((uint32_t)n);
        memcpy(out + o, &be_total, 4);
        memcpy(out + o + 4, &be_hlen, 4);
        memcpy(out + o + 8, header, (size_t)n);
        o += 8 + (size_t)n;
        pos += total + 4;
    }
    if (pos) {
        memmove(c->in, c->in + pos, c->len - pos);
        c->len -= pos;
    }
    if (o && write(fd, out, o) != (ssize_t)o) drop(ep, fd);
}

int main(int argc, char **argv) {
    int port = argc > 1 ? atoi(argv[1]) : 10979;
    int ls = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    int one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_ANY)};
    if (bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 4096)) { perror("listen"); return 1; }
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = ls}, evs[512];
    epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev);
    fprintf(stderr, "floor_server listening on %d\n", port);
    for (;;) {
        int n = epoll_wait(ep, evs, 512, -1);
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            if (fd == ls) {
                int s;
                while ((s = accept4(ls, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
                    if (s >= MAX_FD) { close(s); continue; }
                    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    conns[s].in = malloc(BUF);
                    conns[s].len = 0;
                    ev.events = EPOLLIN;
                    ev.data.fd = s;
                    epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev);
                }
            } else if (conns[fd].in) {
                serve(ep, fd);
            }
        }
    }
}
