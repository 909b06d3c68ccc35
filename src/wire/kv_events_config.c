/*
 * kv_events_config.c: vLLM's --kv-events-config JSON (see the header). yajl's tree parser:
 * the text is a command-line argument, small and read once.
 */
#include "wire/kv_events_config.h"

#include <stdio.h>
#include <string.h>

#include <yajl/yajl_tree.h>

#include "kvrouter.h"

void kvr_kv_events_config_default(kvr_kv_events_config_t *c)
{
    memset(c, 0, sizeof *c);
    snprintf(c->endpoint, sizeof c->endpoint, "tcp://*:5557");
    c->buffer_steps = 10000;
    c->hwm = 100000;
    c->max_queue_size = 100000;
}

static int fail(char *err, size_t err_len, int st, const char *fmt, const char *a)
{
    if (err && err_len)
        snprintf(err, err_len, fmt, a);
    return st;
}

static int get_string(yajl_val v, const char *key, bool nullable, char *out, size_t cap,
                      char *err, size_t err_len)
{
    if (nullable && YAJL_IS_NULL(v)) {
        out[0] = '\0';
        return KVR_OK;
    }
    if (!YAJL_IS_STRING(v))
        return fail(err, err_len, KVR_EINVAL,
                    nullable ? "kv-events-config.%s: must be a string or null"
                             : "kv-events-config.%s: must be a string",
                    key);
    if (strlen(v->u.string) >= cap)
        return fail(err, err_len, KVR_EINVAL, "kv-events-config.%s: too long", key);
    snprintf(out, cap, "%s", v->u.string);
    return KVR_OK;
}

static int get_count(yajl_val v, const char *key, uint32_t *out, char *err, size_t err_len)
{
    if (!YAJL_IS_INTEGER(v) || v->u.number.i < 1 || v->u.number.i > (long long)UINT32_MAX)
        return fail(err, err_len, KVR_EINVAL,
                    "kv-events-config.%s: must be an integer in [1, 4294967295]", key);
    *out = (uint32_t)v->u.number.i;
    return KVR_OK;
}

static int apply_key(kvr_kv_events_config_t *c, const char *key, yajl_val v, int *publisher,
                     char *err, size_t err_len)
{
    if (strcmp(key, "enable_kv_cache_events") == 0) {
        if (!YAJL_IS_TRUE(v) && !YAJL_IS_FALSE(v))
            return fail(err, err_len, KVR_EINVAL, "kv-events-config.%s: must be true or false",
                        key);
        c->enabled = YAJL_IS_TRUE(v);
        return KVR_OK;
    }
    if (strcmp(key, "publisher") == 0) {
        if (YAJL_IS_NULL(v))
            return KVR_OK;
        const char *s = YAJL_GET_STRING(v);
        if (s && strcmp(s, "zmq") == 0)
            *publisher = 1;
        else if (s && strcmp(s, "null") == 0)
            *publisher = 0;
        else
            return fail(err, err_len, KVR_EINVAL,
                        "kv-events-config.%s: must be \"zmq\" or \"null\"", key);
        return KVR_OK;
    }
    if (strcmp(key, "endpoint") == 0)
        return get_string(v, key, false, c->endpoint, sizeof c->endpoint, err, err_len);
    if (strcmp(key, "replay_endpoint") == 0)
        return get_string(v, key, true, c->replay_endpoint, sizeof c->replay_endpoint, err,
                          err_len);
    if (strcmp(key, "topic") == 0)
        return get_string(v, key, false, c->topic, sizeof c->topic, err, err_len);
    if (strcmp(key, "buffer_steps") == 0)
        return get_count(v, key, &c->buffer_steps, err, err_len);
    if (strcmp(key, "hwm") == 0)
        return get_count(v, key, &c->hwm, err, err_len);
    if (strcmp(key, "max_queue_size") == 0)
        return get_count(v, key, &c->max_queue_size, err, err_len);
    return fail(err, err_len, KVR_EINVAL, "kv-events-config.%s: unknown field", key);
}

int kvr_kv_events_config_parse(const char *json, kvr_kv_events_config_t *out, char *err,
                               size_t err_len)
{
    kvr_kv_events_config_t c;
    kvr_kv_events_config_default(&c);
    char perr[160] = "";
    yajl_val root = yajl_tree_parse(json ? json : "", perr, sizeof perr);
    if (!root) {
        for (char *p = perr; *p; p++)
            if (*p == '\n')
                *p = ' ';
        return fail(err, err_len, KVR_EPARSE, "kv-events-config: invalid JSON: %s", perr);
    }
    int st = KVR_OK;
    if (!YAJL_IS_OBJECT(root)) {
        st = fail(err, err_len, KVR_EPARSE, "kv-events-config: %s", "must be a JSON object");
    } else {
        int publisher = -1; /* unset */
        for (size_t i = 0; i < root->u.object.len && st == KVR_OK; i++)
            st = apply_key(&c, root->u.object.keys[i], root->u.object.values[i], &publisher,
                           err, err_len);
        if (st == KVR_OK && publisher == 0)
            c.enabled = false; /* "null" publisher: no events even when enabled */
        if (st == KVR_OK && c.enabled && c.endpoint[0] == '\0')
            st = fail(err, err_len, KVR_EINVAL, "kv-events-config.%s: must not be empty",
                      "endpoint");
    }
    yajl_tree_free(root);
    if (st == KVR_OK)
        *out = c;
    return st;
}
