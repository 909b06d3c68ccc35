/*
 * http.h: the HTTP layer, the one header an outsider includes of src/http. Every server and
 * client of the tree speaks HTTP through these:
 *   host.h       a router's listeners, access check and services (the router API, the front
 *                end, the replicas, the indexer's routes are its services)
 *   reply.h      answering a request: one reply family for every server, counted
 *   http_guard.h limits on every client connection (count, head size, deadlines, drain)
 *   access.h     who may call what: the client, peer and admin planes and their keys
 *   http_conn.h  noticing a client that left (libevent servers)
 *   http_fetch.h one bounded GET on the loop's libevent (health, snapshots, capacity)
 *   client.h     one small blocking HTTP/1.1 client (replay, the tools, the benchmarks)
 *   offloop.h    a blocking job on a thread of its own, its end handed back on the loop
 * Threads and costs: each header's own comment.
 */
#ifndef KVR_HTTP_HTTP_H
#define KVR_HTTP_HTTP_H

#include "http/access.h"
#include "http/client.h"
#include "http/host.h"
#include "http/http_conn.h"
#include "http/http_fetch.h"
#include "http/http_guard.h"
#include "http/offloop.h"
#include "http/reply.h"

#endif
