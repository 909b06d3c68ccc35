/*
 * kvrouter.h: the public API of libkvrouter, the core of the kvrouter KV-cache-aware router.
 * An umbrella: it includes one header per module.
 *
 *   kvrouter/status.h   status codes (one table, kvr_strerror)
 *   kvrouter/hash.h     Dynamo-compatible block hashing and chained sequence hashes
 *   kvrouter/index.h    the prefix index: which (worker, dp_rank) holds how long a prefix
 *   kvrouter/config.h   the router's settings, by name, validated
 *   kvrouter/router.h   workers, one routing decision per request, its lifecycle
 *   kvrouter/sched.h    the scheduler in front of the router: place or queue, lifecycle by
 *                       handle, upkeep, observers
 *
 * examples/embed.c embeds it in ~100 lines. Build against it: `make install PREFIX=...`, then
 * `pkg-config --cflags --libs --static kvrouter` (a static library; it needs libxxhash and
 * liburcu-memb). Pure computation: no I/O but getrandom(2), no clock (time is always passed
 * in), no threads of its own.
 *
 * Ownership: every pointer passed in is borrowed for the duration of the call unless a
 * function says otherwise. Objects created by kvr_X_new() are released by kvr_X_free(),
 * and kvr_X_free(NULL) is a no-op. Embedded objects use kvr_X_init()/kvr_X_deinit().
 * Threads: see each module. In short, one thread writes an index, any number of registered
 * reader threads look it up concurrently; one thread owns a router and its scheduler.
 *
 * Struct fields are marked as libuv marks them: after a "public" comment the caller fills or
 * reads them; "read-only" ones the library fills (reading is fine, writing is not); "private"
 * ones belong to the library and may change between versions.
 */
#ifndef KVROUTER_H
#define KVROUTER_H

/* The library's version: CMakeLists.txt reads it from here (one source of truth). */
#define KVR_VERSION_MAJOR 0
#define KVR_VERSION_MINOR 4
#define KVR_VERSION_PATCH 0
#define KVR_VERSION_STR_(x) #x
#define KVR_VERSION_STR(x) KVR_VERSION_STR_(x)
/* "0.4.0" */
#define KVR_VERSION_STRING                                                                     \
    KVR_VERSION_STR(KVR_VERSION_MAJOR) "." KVR_VERSION_STR(KVR_VERSION_MINOR) "." KVR_VERSION_STR( \
        KVR_VERSION_PATCH)

#include "kvrouter/status.h"
#include "kvrouter/hash.h"
#include "kvrouter/index.h"
#include "kvrouter/config.h"
#include "kvrouter/router.h"
#include "kvrouter/sched.h"

#endif /* KVROUTER_H */
