/*
 * kv_publisher.h: an engine's KV-event publisher, as vLLM's ZmqEventPublisher behaves on the
 * wire (docs/mocker.md): a PUB socket (an XPUB: the same on the wire, and it reports
 * subscriptions) sending [topic, seq u64 BE, payload] with seq 0, 1, 2, ... per publisher,
 * and an optional ROUTER replay socket that answers [identity, "", start_seq u64 BE] with
 * every buffered batch seq >= start_seq as [identity, "", seq, payload], then
 * [identity, "", ff x 8, ""]. A start older than the buffer replays from the oldest kept
 * batch (the consumer sees the jump).
 * Anything else on the ROUTER is counted as an invalid replay request and ignored.
 *
 * Addresses follow vLLM's rule: the PUB socket binds when the endpoint contains "*" or "::"
 * or starts with ipc:// or inproc://, and connects otherwise; the replay socket always binds
 * (a "*" host is bound as given). Data-parallel rank r > 0 uses port + r for tcp endpoints
 * and the suffix "_dp<r>" for ipc/inproc (kvr_kv_pub_endpoint_for_rank).
 *
 * Ownership: the publisher owns its sockets and the replay ring (copies of the last
 * buffer_steps payloads, also capped at buffer_bytes in total; the oldest go first). The ZMQ
 * context is the caller's and must outlive the publisher. Threads: one thread (the mocker's
 * event loop); poll_replay() is non-blocking. An event loop watches kvr_kv_pub_replay_fd() and
 * answers a request as soon as it arrives (vLLM serves its replay socket on the publisher's own
 * thread); a timer calls poll_replay() too, to continue answers that wait for a peer's HWM.
 * Cost: publish = one copy of the payload into the ring + three zmq_msg sends.
 */
#ifndef KVR_NET_KV_PUBLISHER_H
#define KVR_NET_KV_PUBLISHER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kvr_kv_pub_config {
    const char *endpoint;        /* PUB, e.g. port 5557 on every interface (rank offset
                                  * already applied) */
    const char *replay_endpoint; /* ROUTER, or NULL / "" for no replay */
    const char *topic;           /* frame 0; NULL = "" */
    uint32_t buffer_steps;       /* batches kept for replay, >= 1 (vLLM: 10000) */
    size_t buffer_bytes;         /* cap on the ring's payload bytes; 0 = 256 MiB */
    int hwm;                     /* ZMQ_SNDHWM of the PUB socket; 0 = 100000 (vLLM's) */
} kvr_kv_pub_config_t;

typedef struct kvr_kv_pub_stats {
    uint64_t published;          /* batches sent */
    uint64_t publish_errors;     /* zmq_send failures (counted, batch still buffered) */
    uint64_t replay_requests;    /* valid requests received */
    uint64_t replayed_batches;
    uint64_t replay_truncated;   /* requests older than the ring (answered from the oldest) */
    uint64_t invalid_requests;   /* malformed ROUTER messages */
    uint64_t buffered;           /* batches in the ring now */
    size_t buffered_bytes;
    uint64_t replay_send_errors; /* answers abandoned (the peer went away: no end marker) or
                                    refused (4 already waiting for that peer, or 64 in all) */
    uint64_t replay_in_progress; /* answers waiting for a peer at its HWM (continued by the
                                    next polls) */
    uint64_t dropped;            /* batches buffered but not sent (kvr_kv_pub_drop_next) */
    uint64_t subscribers;        /* subscriptions the PUB side holds now (as of the last
                                    kvr_kv_pub_poll_subscriptions) */
} kvr_kv_pub_stats_t;

typedef struct kvr_kv_pub kvr_kv_pub_t;

/* NULL with *status (KVR_EINVAL: bad config; KVR_EIO: bind/connect failed, with err naming the
 * endpoint and zmq's reason; KVR_ENOMEM). err may be NULL. */
kvr_kv_pub_t *kvr_kv_pub_new(void *zmq_ctx, const kvr_kv_pub_config_t *cfg, int *status,
                             char *err, size_t err_len);
void kvr_kv_pub_free(kvr_kv_pub_t *p);

/* Publishes one batch payload under the next sequence number (returned in *seq if non-NULL).
 * KVR_OK; KVR_EIO (send failed: counted; the batch is still buffered for replay); KVR_EINVAL
 * (len 0: an empty payload would read as the replay end marker); KVR_ENOMEM (nothing
 * happened, the number is not used). */
int kvr_kv_pub_publish(kvr_kv_pub_t *p, const uint8_t *payload, size_t len, uint64_t *seq);

/* Answers the pending replay requests without blocking: an answer whose peer cannot take more
 * yet (its pipe at the HWM) is continued by the next calls. Returns the number of answers
 * completed (end marker sent) by this call. */
int kvr_kv_pub_poll_replay(kvr_kv_pub_t *p);

/* Reads the subscribe/unsubscribe messages that have reached the PUB side (it is an XPUB, the
 * same on the wire as vLLM's PUB) and updates stats.subscribers: a test or an operator can
 * see that a subscriber's subscription has arrived, so nothing it should get is published
 * into ZeroMQ's slow-joiner window. Never blocks. */
void kvr_kv_pub_poll_subscriptions(kvr_kv_pub_t *p);

/* The replay socket's ZMQ_FD for an event loop to watch, or -1 without replay. It is
 * edge-triggered (libzmq signals changes, not levels): after it fires, call
 * kvr_kv_pub_poll_replay() while kvr_kv_pub_replay_readable() says a request is waiting. */
int kvr_kv_pub_replay_fd(const kvr_kv_pub_t *p);
bool kvr_kv_pub_replay_readable(const kvr_kv_pub_t *p);

/* The sequence number the next batch will get. */
uint64_t kvr_kv_pub_next_seq(const kvr_kv_pub_t *p);
void kvr_kv_pub_get_stats(const kvr_kv_pub_t *p, kvr_kv_pub_stats_t *out);

/* Fault injection (docs/reliability.md, S4): the next n batches are numbered and
 * buffered but not sent, as if the network lost them; subscribers see the gap and replay. */
void kvr_kv_pub_drop_next(kvr_kv_pub_t *p, uint32_t n);

/* The address a socket is bound or connected to, as libzmq reports it (ZMQ_LAST_ENDPOINT):
 * a tcp "*" host with port 0 shows the port the system chose ("tcp://0.0.0.0:<port>"). KVR_OK;
 * KVR_ENOTFOUND (replay requested but there is no replay socket); KVR_ETOOBIG. */
int kvr_kv_pub_endpoint(const kvr_kv_pub_t *p, bool replay, char *out, size_t cap);

/* Checks the ring's invariants (contiguous numbers ending at next_seq - 1, byte and step
 * caps, byte total). KVR_OK, or KVR_EINVAL with the broken invariant in msg. */
int kvr_kv_pub_verify(const kvr_kv_pub_t *p, char *msg, size_t msg_len);

/* True when vLLM would bind this PUB endpoint (see above). */
bool kvr_kv_pub_should_bind(const char *endpoint);

/* The endpoint rank r uses: tcp port + r, ipc/inproc "_dp<r>" suffix, rank 0 unchanged.
 * Rank 0 copies the endpoint verbatim (as vLLM). KVR_OK; KVR_EINVAL (tcp endpoint without a
 * numeric port, port + r > 65535, a scheme other than tcp/ipc/inproc); KVR_ETOOBIG (out too
 * small). */
int kvr_kv_pub_endpoint_for_rank(const char *endpoint, uint32_t rank, char *out, size_t cap);

#endif /* KVR_NET_KV_PUBLISHER_H */
