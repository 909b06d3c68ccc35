/*
 * http_conn.h: two facts about libevent 2.1's HTTP server connections that every server of
 * ours (the router's front end, the mocker) must act on the same way.
 *
 * 1. libevent watches a client for EOF only while it streams a reply to it; while a request
 *    waits for its answer, a client that closed goes unnoticed. kvr_http_client_gone() peeks
 *    at the socket (one non-blocking recv with MSG_PEEK): true when it reads EOF or a hard
 *    error. A client that half-closes after sending reads as gone too (as to vLLM's server).
 *    Callers probe their waiting clients from a timer and close the gone ones with
 *    evhttp_connection_free(), which runs the connection's close callback.
 * 2. When libevent itself saw the EOF during a reply, it detaches the unfinished request from
 *    the dying connection and leaves it to the application (evhttp_connection_incoming_fail);
 *    when the application frees the connection, the requests still attached are libevent's.
 *    kvr_http_release_orphan(), called from the close callback, frees the request in the
 *    first case only (otherwise each abandoned stream leaks one request).
 * 3. Nagle's algorithm holds back the tail of a body (and, against a delayed ACK, whole
 *    responses for ~40 ms); libevent makes an outgoing connection's socket only when its first
 *    request is queued. kvr_http_nodelay() sets TCP_NODELAY on the connection's current socket
 *    once (*last remembers the socket done; start it at -1): call it after each
 *    evhttp_make_request().
 * 4. kvr_http_bound_port(): the port a listening socket got (bound with port 0: a free one).
 * Threads: the connection's loop thread. Cost: one syscall / O(1).
 */
#ifndef KVR_NET_HTTP_CONN_H
#define KVR_NET_HTTP_CONN_H

#include <stdbool.h>

#include <stdint.h>

struct evhttp_connection;
struct evhttp_request;
struct evhttp_bound_socket;

bool kvr_http_client_gone(struct evhttp_connection *conn);
void kvr_http_release_orphan(struct evhttp_request *req);
void kvr_http_nodelay(struct evhttp_connection *conn, int *last);
uint16_t kvr_http_bound_port(struct evhttp_bound_socket *bs); /* 0 when unknown */

#endif /* KVR_NET_HTTP_CONN_H */
