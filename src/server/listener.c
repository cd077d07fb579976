/* The listening socket and addresses as text (listener.h). */
#include "server/listener.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

struct rp_listener {
    int fd;
    int port;
    char url[128];
};

void rp_sockaddr_text(const struct sockaddr *sa, char *buf, size_t len) {
    char ip[INET6_ADDRSTRLEN];
    if (sa && sa->sa_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)sa;
        inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
        snprintf(buf, len, "%s:%u", ip, (unsigned)ntohs(a->sin_port));
    } else if (sa && sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)sa;
        unsigned port = ntohs(a->sin6_port);
        if (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr)) { /* an IPv4 client of a dual-stack socket */
            inet_ntop(AF_INET, &a->sin6_addr.s6_addr[12], ip, sizeof ip);
            snprintf(buf, len, "%s:%u", ip, port);
        } else {
            inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof ip);
            snprintf(buf, len, "[%s]:%u", ip, port);
        }
    } else snprintf(buf, len, "?");
}

/* "host:port" as the user wrote the host, brackets around an IPv6 one. */
static void host_port(const char *host, int port, char *buf, size_t len) {
    snprintf(buf, len, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
}

/* A socket bound and listening on ai, or -1 with errno. */
static int bind_one(const struct addrinfo *ai) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) return -1;
    int on = 1, off = 0;
    /* a restart binds while the last run's connections sit in TIME_WAIT;
     * a port another process listens on is still refused */
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    if (ai->ai_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
    /* libmicrohttpd's threads all accept on it: it must not block */
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, SOMAXCONN) != 0 ||
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

rp_listener *rp_listener_open(const char *host, int port, char *err, size_t err_len) {
    if (!host) host = "127.0.0.1";
    char bare[256]; /* "[::1]", as in a URL, is "::1" */
    size_t hl = strlen(host);
    if (hl >= 2 && hl < sizeof bare && host[0] == '[' && host[hl - 1] == ']') {
        snprintf(bare, sizeof bare, "%.*s", (int)(hl - 2), host + 1);
        host = bare;
    }
    char where[320];
    host_port(host, port, where, sizeof where);
    if (!*host) {
        snprintf(err, err_len, "cannot listen on %s: the host is empty", where);
        return NULL;
    }
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    int rc = getaddrinfo(host, service, &hints, &res);
    if (rc != 0) {
        snprintf(err, err_len, "cannot listen on %s: %s", where, rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc));
        return NULL;
    }
    int fd = -1, first_errno = 0;
    for (const struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        if (ai->ai_family != AF_INET && ai->ai_family != AF_INET6) continue;
        fd = bind_one(ai);
        if (fd < 0 && !first_errno) first_errno = errno;
    }
    freeaddrinfo(res);
    if (fd < 0) {
        snprintf(err, err_len, "cannot listen on %s: %s", where,
                 first_errno ? strerror(first_errno) : "no IPv4 or IPv6 address");
        return NULL;
    }
    rp_listener *l = calloc(1, sizeof *l);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (!l || getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) {
        snprintf(err, err_len, "cannot listen on %s: %s", where, l ? strerror(errno) : "out of memory");
        close(fd);
        free(l);
        return NULL;
    }
    l->fd = fd;
    char addr[96];
    rp_sockaddr_text((struct sockaddr *)&ss, addr, sizeof addr);
    l->port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                       : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    snprintf(l->url, sizeof l->url, "http://%s", addr);
    return l;
}

int rp_listener_port(const rp_listener *l) { return l->port; }
const char *rp_listener_url(const rp_listener *l) { return l->url; }

int rp_listener_take_fd(rp_listener *l) {
    int fd = l->fd;
    l->fd = -1;
    return fd;
}

void rp_listener_free(rp_listener *l) {
    if (!l) return;
    if (l->fd >= 0) close(l->fd);
    free(l);
}
