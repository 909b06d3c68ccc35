/*
 * indexer.h: the indexer service, the one header an outsider includes of src/indexer. Three
 * objects share its query API (ix_api.h) and formats:
 *   kvr_indexer_*    `kvrouter indexer`: the standalone KV indexer, partitions fed by KV
 *                    events, the reference indexer's HTTP API (indexer_server.h)
 *   kvr_ix_serve_*   a router serving its own index under the same API, on HTTP and NATS
 *                    (serve_indexer; ix_serve.h)
 *   kvr_remote_ix_*  a router whose overlaps come from a remote indexer, over HTTP or NATS
 *                    (remote_indexer; remote_indexer.h)
 * Each of the last two is a service of the router's HTTP host over its fleet. docs/indexer.md
 * describes the API.
 */
#ifndef KVR_INDEXER_INDEXER_H
#define KVR_INDEXER_INDEXER_H

#include "indexer/indexer_server.h"
#include "indexer/ix_serve.h"
#include "indexer/remote_indexer.h"

#endif
