/* The server's listening socket, made before the model loads (so a port in
 * use or a host that does not resolve is reported at once), and socket
 * addresses as text for URLs and logs.
 *
 * The host is an IPv4 or IPv6 address or a name (getaddrinfo); a name with
 * several addresses listens on the first that can be bound, in the
 * resolver's order. An IPv6 socket is dual-stack (IPV6_V6ONLY off), so
 * "::" takes IPv4 clients too; they show as plain IPv4 addresses. */
#ifndef RP_SERVER_LISTENER_H
#define RP_SERVER_LISTENER_H

#include <stddef.h>
#include <sys/socket.h>

typedef struct rp_listener rp_listener;

/* Resolves host (NULL: 127.0.0.1) and binds and listens on port (0: any
 * free port). NULL with err, e.g. "cannot listen on 127.0.0.1:8000: Address
 * already in use". */
rp_listener *rp_listener_open(const char *host, int port, char *err, size_t err_len);
/* The port it listens on (the one picked for port 0). */
int rp_listener_port(const rp_listener *l);
/* http://127.0.0.1:8000, http://[::1]:8000 */
const char *rp_listener_url(const rp_listener *l);
/* The socket, for the HTTP daemon, which owns it from then on. */
int rp_listener_take_fd(rp_listener *l);
/* Closes the socket unless taken. NULL is fine. */
void rp_listener_free(rp_listener *l);

/* "127.0.0.1:5000", "[::1]:5000"; an IPv4 client of a dual-stack socket
 * (::ffff:a.b.c.d) as IPv4; "?" for what is not an IP address. */
void rp_sockaddr_text(const struct sockaddr *sa, char *buf, size_t len);

#endif
