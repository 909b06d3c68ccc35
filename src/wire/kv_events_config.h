/*
 * kv_events_config.h: vLLM's --kv-events-config JSON (KVEventsConfig, docs/wire-formats.md
 * 1.1), parsed the way `vllm serve` reads it, so scripts can pass the same string
 * to `kvrouter mocker`:
 *   {"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": E1,
 *    "replay_endpoint": E2, "topic": "", "buffer_steps": 10000, "hwm": 100000,
 *    "max_queue_size": 100000}
 * where E1, E2 are ZMQ addresses such as "tcp://" "*:5557" (written apart here only because
 * C comments cannot hold a slash followed by a star).
 * Every field is optional (defaults as vLLM's newer releases: endpoint port 5557 on every
 * interface, no replay,
 * topic "", buffer_steps 10000, hwm 100000, max_queue_size 100000; publisher "zmq" when events
 * are enabled, else "null"). An unknown key, a wrong type, a negative or zero count, or a
 * publisher other than "zmq" / "null" is an error naming the field (pydantic rejects them too).
 * Wire layer: text in, struct out. Strings are copied into fixed buffers (length-checked).
 */
#ifndef KVR_WIRE_KV_EVENTS_CONFIG_H
#define KVR_WIRE_KV_EVENTS_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVR_KVCFG_ADDR_BYTES 256

typedef struct kvr_kv_events_config {
    bool enabled;                 /* enable_kv_cache_events and publisher "zmq" */
    char endpoint[KVR_KVCFG_ADDR_BYTES];
    char replay_endpoint[KVR_KVCFG_ADDR_BYTES]; /* "" = no replay */
    char topic[KVR_KVCFG_ADDR_BYTES];
    uint32_t buffer_steps;
    uint32_t hwm;
    uint32_t max_queue_size;
} kvr_kv_events_config_t;

void kvr_kv_events_config_default(kvr_kv_events_config_t *c);

/* KVR_OK; KVR_EPARSE (not JSON / not an object) or KVR_EINVAL, with err naming the field. */
int kvr_kv_events_config_parse(const char *json, kvr_kv_events_config_t *out, char *err,
                               size_t err_len);

#endif /* KVR_WIRE_KV_EVENTS_CONFIG_H */
