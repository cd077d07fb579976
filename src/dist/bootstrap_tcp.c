/* The bootstrap's TCP transport (bootstrap.h): node 0 listens on the host
 * of --dist-init-addr (an address of its own, so the port is not opened on
 * every interface), the other nodes connect to it. Connection attempts
 * are non-blocking with a time limit; "nobody listening yet" (refused,
 * unreachable, timed out) is RP_BS_RETRY so the caller backs off and
 * tries again. */
#include "dist/bootstrap.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

typedef struct tcp_transport {
    rp_bs_transport base;
    int listen_fd;
} tcp_transport;

static int resolve(const char *host, int port, int passive, struct addrinfo **out, rp_err *err) {
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = passive ? AI_PASSIVE : 0};
    int rc = getaddrinfo(host, service, &hints, out);
    if (rc) return rp_errf(err, "cannot resolve \"%s\": %s", host, gai_strerror(rc));
    return 0;
}

static int tcp_listen(rp_bs_transport *t, const char *host, int port, int *bound_port, rp_err *err) {
    tcp_transport *tt = (tcp_transport *)t;
    struct addrinfo *ai;
    if (resolve(host, port, 1, &ai, err)) return RP_ERR;
    int fd = -1, last = 0;
    for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            last = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) || listen(fd, 64)) {
            last = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(ai);
    if (fd < 0)
        return rp_errf(err, "cannot listen on %s:%d: %s (--dist-init-addr must be an address of node 0 and a free "
                            "port)", host, port, strerror(last));
    struct sockaddr_storage sa;
    socklen_t len = sizeof sa;
    if (getsockname(fd, (struct sockaddr *)&sa, &len)) {
        close(fd);
        return rp_errf(err, "getsockname: %s", strerror(errno));
    }
    *bound_port = ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port
                                                 : ((struct sockaddr_in *)&sa)->sin_port);
    tt->listen_fd = fd;
    return 0;
}

static void set_nodelay(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static int tcp_accept(rp_bs_transport *t, int timeout_ms, int *fd, rp_err *err) {
    tcp_transport *tt = (tcp_transport *)t;
    if (tt->listen_fd < 0) return rp_errf(err, "bootstrap: accept before listen");
    struct pollfd pfd = {.fd = tt->listen_fd, .events = POLLIN};
    int pr;
    while ((pr = poll(&pfd, 1, timeout_ms)) < 0 && errno == EINTR) {}
    if (pr < 0) return rp_errf(err, "poll: %s", strerror(errno));
    if (pr == 0) return RP_BS_TIMEOUT;
    int c = accept4(tt->listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (c < 0 && (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED)) return RP_BS_TIMEOUT; /* gone again */
    if (c < 0) return rp_errf(err, "accept: %s", strerror(errno));
    set_nodelay(c);
    *fd = c;
    return 0;
}

/* One non-blocking connect to one address: 0, RP_BS_RETRY, or RP_ERR. */
static int connect_one(const struct addrinfo *a, int timeout_ms, int *fd, rp_err *err) {
    int s = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (s < 0) return rp_errf(err, "socket: %s", strerror(errno));
    int rc = connect(s, a->ai_addr, a->ai_addrlen), e = rc ? errno : 0;
    if (rc && e == EINPROGRESS) {
        struct pollfd pfd = {.fd = s, .events = POLLOUT};
        int pr;
        while ((pr = poll(&pfd, 1, timeout_ms)) < 0 && errno == EINTR) {}
        socklen_t len = sizeof e;
        if (pr == 0) e = ETIMEDOUT;
        else if (pr < 0) e = errno;
        else if (getsockopt(s, SOL_SOCKET, SO_ERROR, &e, &len)) e = errno;
    }
    if (e) {
        close(s);
        rp_errf(err, "%s", strerror(e));
        return e == ECONNREFUSED || e == ETIMEDOUT || e == EHOSTUNREACH || e == ENETUNREACH || e == ECONNRESET ||
                       e == EAGAIN
                   ? RP_BS_RETRY
                   : RP_ERR;
    }
    int flags = fcntl(s, F_GETFL);
    fcntl(s, F_SETFL, flags & ~O_NONBLOCK);
    set_nodelay(s);
    *fd = s;
    return 0;
}

static int tcp_connect(rp_bs_transport *t, const char *host, int port, int timeout_ms, int *fd, rp_err *err) {
    (void)t;
    struct addrinfo *ai;
    if (resolve(host, port, 0, &ai, err)) return RP_BS_RETRY; /* a name not yet in DNS: try again */
    int rc = RP_BS_RETRY;
    for (struct addrinfo *a = ai; a && rc == RP_BS_RETRY; a = a->ai_next) rc = connect_one(a, timeout_ms, fd, err);
    freeaddrinfo(ai);
    return rc;
}

static void tcp_destroy(rp_bs_transport *t) {
    tcp_transport *tt = (tcp_transport *)t;
    if (!tt) return;
    if (tt->listen_fd >= 0) close(tt->listen_fd);
    free(tt);
}

rp_bs_transport *rp_bs_tcp_new(rp_err *err) {
    tcp_transport *tt = calloc(1, sizeof *tt);
    if (!tt) {
        rp_errf(err, "out of memory");
        return NULL;
    }
    tt->base.listen = tcp_listen;
    tt->base.accept = tcp_accept;
    tt->base.connect = tcp_connect;
    tt->base.destroy = tcp_destroy;
    tt->listen_fd = -1;
    return &tt->base;
}
