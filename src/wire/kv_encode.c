/*
 * kv_encode.c: see kv_encode.h.
 *
 * Layout of the buffer during a batch: HDR_ROOM reserved bytes, then the events back to back.
 * end_batch appends the rank, then writes [array header, ts, events-array header] right-aligned
 * into the reserved room (its size depends on the event count, known only then) and returns
 * the bytes from where that header starts.
 * Invariants: in_batch <=> begin_batch was called and end_batch/free not since; sb.size >=
 * HDR_ROOM while in_batch; each add either appends whole events or restores sb.size.
 */
#include "wire/kv_encode.h"

#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#include "kvrouter.h"

/* fixarray/array16 header (1) + float64 ts (9) + array32 header of the events (5) */
#define HDR_ROOM 15

struct kvr_kv_enc {
    kvr_kv_enc_config_t cfg;
    msgpack_sbuffer sb;
    msgpack_packer pk;
    bool in_batch;
    size_t n_events;
    double ts;
    bool has_dp_rank;
    uint32_t dp_rank;
};

kvr_kv_enc_t *kvr_kv_enc_new(const kvr_kv_enc_config_t *cfg, int *status)
{
    int dummy;
    if (status == NULL)
        status = &dummy;
    if (cfg == NULL || (unsigned)cfg->format > KVR_KV_FMT_SGLANG) {
        *status = KVR_EINVAL;
        return NULL;
    }
    kvr_kv_enc_t *e = calloc(1, sizeof *e);
    if (e == NULL) {
        *status = KVR_ENOMEM;
        return NULL;
    }
    e->cfg = *cfg;
    msgpack_sbuffer_init(&e->sb);
    msgpack_packer_init(&e->pk, &e->sb, msgpack_sbuffer_write);
    *status = KVR_OK;
    return e;
}

void kvr_kv_enc_free(kvr_kv_enc_t *e)
{
    if (e == NULL)
        return;
    msgpack_sbuffer_destroy(&e->sb);
    free(e);
}

void kvr_kv_enc_seq(uint64_t seq, uint8_t out[8])
{
    for (int i = 7; i >= 0; i--, seq >>= 8)
        out[i] = (uint8_t)seq;
}

size_t kvr_kv_enc_n_events(const kvr_kv_enc_t *e)
{
    return e->in_batch ? e->n_events : 0;
}

int kvr_kv_enc_begin_batch(kvr_kv_enc_t *e, double ts, bool has_dp_rank, uint32_t dp_rank)
{
    if (e == NULL)
        return KVR_EINVAL;
    msgpack_sbuffer_clear(&e->sb);
    static const char room[HDR_ROOM];
    if (msgpack_sbuffer_write(&e->sb, room, HDR_ROOM) != 0) {
        e->in_batch = false;
        return KVR_ENOMEM;
    }
    e->in_batch = true;
    e->n_events = 0;
    e->ts = ts;
    e->has_dp_rank = has_dp_rank;
    e->dp_rank = dp_rank;
    return KVR_OK;
}

/* ---- values (each returns msgpack-c's 0 / -1; -1 only when the buffer cannot grow) ---- */

static int p_str(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);
    return msgpack_pack_str(pk, n) || msgpack_pack_str_body(pk, s, n);
}

static int p_str_or_nil(msgpack_packer *pk, const char *s)
{
    return s ? p_str(pk, s) : msgpack_pack_nil(pk);
}

/* vLLM hashes are unsigned 64-bit; SGLang's are int64, so the top half goes out negative. */
static int p_hash(kvr_kv_enc_t *e, uint64_t h)
{
    msgpack_packer *pk = &e->pk;
    if (e->cfg.format == KVR_KV_FMT_SGLANG)
        return msgpack_pack_int64(pk, h > INT64_MAX ? -(int64_t)~h - 1 : (int64_t)h);
    return msgpack_pack_uint64(pk, h);
}

static int p_hashes(kvr_kv_enc_t *e, const uint64_t *h, size_t n)
{
    int rc = msgpack_pack_array(&e->pk, n);
    for (size_t i = 0; i < n && rc == 0; i++)
        rc = p_hash(e, h[i]);
    return rc;
}

static int p_tokens(msgpack_packer *pk, const uint32_t *t, size_t n)
{
    int rc = msgpack_pack_array(pk, n);
    for (size_t i = 0; i < n && rc == 0; i++)
        rc = msgpack_pack_uint32(pk, t[i]);
    return rc;
}

static int p_parent(kvr_kv_enc_t *e, bool has, uint64_t parent)
{
    return has ? p_hash(e, parent) : msgpack_pack_nil(&e->pk);
}

static int p_key(msgpack_packer *pk, const char *k)
{
    return p_str(pk, k);
}

/* ---- events ---- */

static bool later_vllm_fields(const kvr_kv_enc_stored_t *s)
{
    return s->extra_keys_nil || s->has_group_idx || s->spec_kind || s->has_sliding_window ||
           s->locality;
}

static int check_stored(const kvr_kv_enc_t *e, const kvr_kv_enc_stored_t *s)
{
    if (s == NULL || (s->hashes == NULL && s->n_hashes > 0) ||
        (s->tokens == NULL && s->n_tokens > 0))
        return KVR_EINVAL;
    kvr_kv_format_t f = e->cfg.format;
    bool vllm = f == KVR_KV_FMT_VLLM_ARRAY || f == KVR_KV_FMT_VLLM_MAP;
    if (s->lora_name && !vllm)
        return KVR_EINVAL;
    if (later_vllm_fields(s) && !vllm)
        return KVR_EINVAL;
    if (s->cache_salt && f != KVR_KV_FMT_SGLANG)
        return KVR_EINVAL;
    if (s->medium && f == KVR_KV_FMT_VLLM_V090)
        return KVR_EINVAL;
    if (e->cfg.per_page && (uint64_t)s->n_tokens != (uint64_t)s->n_hashes * s->block_size)
        return KVR_EINVAL;
    return KVR_OK;
}

/* The BlockStored array's length: through medium (7; 6 in v0.9.0), or through the last
 * optional field given; SGLang's metadata map is element 7. */
static size_t stored_array_len(const kvr_kv_enc_t *e, const kvr_kv_enc_stored_t *s)
{
    if (e->cfg.format == KVR_KV_FMT_VLLM_V090)
        return 6;
    if (e->cfg.format == KVR_KV_FMT_SGLANG)
        return s->cache_salt ? 8 : 7;
    if (s->locality)
        return 13;
    if (s->spec_kind || s->has_sliding_window)
        return 12;
    if (s->has_group_idx)
        return 10;
    if (s->extra_keys_nil)
        return 9;
    return s->lora_name ? 8 : 7;
}

static int p_extra_keys(msgpack_packer *pk, size_t n_blocks)
{
    int rc = msgpack_pack_array(pk, n_blocks);
    for (size_t i = 0; i < n_blocks && rc == 0; i++)
        rc = msgpack_pack_nil(pk);
    return rc;
}

static int p_lora_id(msgpack_packer *pk, const kvr_kv_enc_stored_t *s)
{
    return s->has_lora_id ? msgpack_pack_int64(pk, s->lora_id) : msgpack_pack_nil(pk);
}

static int stored_array(kvr_kv_enc_t *e, const kvr_kv_enc_stored_t *s)
{
    msgpack_packer *pk = &e->pk;
    size_t n = stored_array_len(e, s);
    int rc = msgpack_pack_array(pk, n) || p_str(pk, "BlockStored") ||
             p_hashes(e, s->hashes, s->n_hashes) || p_parent(e, s->has_parent, s->parent) ||
             p_tokens(pk, s->tokens, s->n_tokens) || msgpack_pack_uint32(pk, s->block_size) ||
             p_lora_id(pk, s);
    if (n >= 7)
        rc = rc || p_str_or_nil(pk, s->medium);
    if (n >= 8 && e->cfg.format == KVR_KV_FMT_SGLANG)
        return rc || msgpack_pack_map(pk, 1) || p_key(pk, "cache_salt") ||
               p_str(pk, s->cache_salt);
    if (n >= 8)
        rc = rc || p_str_or_nil(pk, s->lora_name);
    if (n >= 9)
        rc = rc || (s->extra_keys_nil ? p_extra_keys(pk, s->n_hashes) : msgpack_pack_nil(pk));
    if (n >= 10)
        rc = rc || (s->has_group_idx ? msgpack_pack_uint32(pk, s->group_idx)
                                     : msgpack_pack_nil(pk));
    if (n >= 12)
        rc = rc || (p_str_or_nil(pk, s->spec_kind) ||
              (s->has_sliding_window ? msgpack_pack_uint32(pk, s->sliding_window)
                                     : msgpack_pack_nil(pk)));
    if (n >= 13)
        rc = rc || p_str_or_nil(pk, s->locality);
    return rc;
}

static int stored_map(kvr_kv_enc_t *e, const kvr_kv_enc_stored_t *s)
{
    msgpack_packer *pk = &e->pk;
    size_t n = 8 + (size_t)s->extra_keys_nil + (size_t)s->has_group_idx +
               (size_t)(s->spec_kind != NULL) + (size_t)s->has_sliding_window +
               (size_t)(s->locality != NULL);
    int rc = msgpack_pack_map(pk, n) || p_key(pk, "type") || p_str(pk, "BlockStored") ||
             p_key(pk, "block_hashes") || p_hashes(e, s->hashes, s->n_hashes) ||
             p_key(pk, "parent_block_hash") || p_parent(e, s->has_parent, s->parent) ||
             p_key(pk, "token_ids") || p_tokens(pk, s->tokens, s->n_tokens) ||
             p_key(pk, "block_size") || msgpack_pack_uint32(pk, s->block_size) ||
             p_key(pk, "lora_id") || p_lora_id(pk, s) ||
             p_key(pk, "medium") || p_str_or_nil(pk, s->medium) ||
             p_key(pk, "lora_name") || p_str_or_nil(pk, s->lora_name);
    if (s->extra_keys_nil)
        rc = rc || (p_key(pk, "extra_keys") || p_extra_keys(pk, s->n_hashes));
    if (s->has_group_idx)
        rc = rc || (p_key(pk, "group_idx") || msgpack_pack_uint32(pk, s->group_idx));
    if (s->spec_kind)
        rc = rc || (p_key(pk, "kv_cache_spec_kind") || p_str(pk, s->spec_kind));
    if (s->has_sliding_window)
        rc = rc || (p_key(pk, "kv_cache_spec_sliding_window") ||
              msgpack_pack_uint32(pk, s->sliding_window));
    if (s->locality)
        rc = rc || (p_key(pk, "locality") || p_str(pk, s->locality));
    return rc;
}

static int stored_one(kvr_kv_enc_t *e, const kvr_kv_enc_stored_t *s)
{
    e->n_events++;
    return e->cfg.format == KVR_KV_FMT_VLLM_MAP ? stored_map(e, s) : stored_array(e, s);
}

static int removed_one(kvr_kv_enc_t *e, const kvr_kv_enc_removed_t *r)
{
    msgpack_packer *pk = &e->pk;
    e->n_events++;
    if (e->cfg.format == KVR_KV_FMT_VLLM_MAP) {
        size_t n = 3 + (size_t)r->has_group_idx + (size_t)(r->locality != NULL);
        int rc = msgpack_pack_map(pk, n) || p_key(pk, "type") || p_str(pk, "BlockRemoved") ||
                 p_key(pk, "block_hashes") || p_hashes(e, r->hashes, r->n_hashes) ||
                 p_key(pk, "medium") || p_str_or_nil(pk, r->medium);
        if (r->has_group_idx)
            rc = rc || (p_key(pk, "group_idx") || msgpack_pack_uint32(pk, r->group_idx));
        if (r->locality)
            rc = rc || (p_key(pk, "locality") || p_str(pk, r->locality));
        return rc;
    }
    size_t n = e->cfg.format == KVR_KV_FMT_VLLM_V090 ? 2 : r->locality ? 5
               : r->has_group_idx ? 4 : 3;
    int rc = msgpack_pack_array(pk, n) || p_str(pk, "BlockRemoved") ||
             p_hashes(e, r->hashes, r->n_hashes);
    if (n >= 3)
        rc = rc || p_str_or_nil(pk, r->medium);
    if (n >= 4)
        rc = rc || (r->has_group_idx ? msgpack_pack_uint32(pk, r->group_idx)
                                     : msgpack_pack_nil(pk));
    if (n >= 5)
        rc = rc || p_str(pk, r->locality);
    return rc;
}

/* Undoes a failed add: the buffer back to its size before, the event count too. */
static int rollback(kvr_kv_enc_t *e, size_t size, size_t n_events)
{
    e->sb.size = size;
    e->n_events = n_events;
    return KVR_ENOMEM;
}

int kvr_kv_enc_add_stored(kvr_kv_enc_t *e, const kvr_kv_enc_stored_t *s)
{
    if (e == NULL || !e->in_batch)
        return KVR_EINVAL;
    int st = check_stored(e, s);
    if (st != KVR_OK)
        return st;
    size_t size = e->sb.size, n_events = e->n_events;
    if (!e->cfg.per_page)
        return stored_one(e, s) == 0 ? KVR_OK : rollback(e, size, n_events);
    kvr_kv_enc_stored_t page = *s;
    page.n_hashes = 1;
    page.n_tokens = s->block_size;
    for (size_t i = 0; i < s->n_hashes; i++) {
        page.hashes = s->hashes + i;
        page.tokens = s->tokens + i * s->block_size;
        if (i > 0) {
            page.has_parent = true;
            page.parent = s->hashes[i - 1];
        }
        if (stored_one(e, &page) != 0)
            return rollback(e, size, n_events);
    }
    return KVR_OK;
}

int kvr_kv_enc_add_removed(kvr_kv_enc_t *e, const kvr_kv_enc_removed_t *r)
{
    if (e == NULL || !e->in_batch || r == NULL || (r->hashes == NULL && r->n_hashes > 0))
        return KVR_EINVAL;
    kvr_kv_format_t f = e->cfg.format;
    bool vllm = f == KVR_KV_FMT_VLLM_ARRAY || f == KVR_KV_FMT_VLLM_MAP;
    if ((r->has_group_idx || r->locality) && !vllm)
        return KVR_EINVAL;
    if (r->medium && f == KVR_KV_FMT_VLLM_V090)
        return KVR_EINVAL;
    size_t size = e->sb.size, n_events = e->n_events;
    if (!e->cfg.per_page)
        return removed_one(e, r) == 0 ? KVR_OK : rollback(e, size, n_events);
    kvr_kv_enc_removed_t page = *r;
    page.n_hashes = 1;
    for (size_t i = 0; i < r->n_hashes; i++) {
        page.hashes = r->hashes + i;
        if (removed_one(e, &page) != 0)
            return rollback(e, size, n_events);
    }
    return KVR_OK;
}

int kvr_kv_enc_add_cleared(kvr_kv_enc_t *e)
{
    if (e == NULL || !e->in_batch)
        return KVR_EINVAL;
    size_t size = e->sb.size, n_events = e->n_events;
    e->n_events++;
    msgpack_packer *pk = &e->pk;
    int rc = e->cfg.format == KVR_KV_FMT_VLLM_MAP
                 ? msgpack_pack_map(pk, 1) || p_key(pk, "type") || p_str(pk, "AllBlocksCleared")
                 : msgpack_pack_array(pk, 1) || p_str(pk, "AllBlocksCleared");
    return rc == 0 ? KVR_OK : rollback(e, size, n_events);
}

/* A packer target of fixed size (the batch header; HDR_ROOM is enough by construction). */
typedef struct fixed_buf {
    uint8_t b[HDR_ROOM];
    size_t n;
} fixed_buf_t;

static int fixed_write(void *data, const char *buf, size_t len)
{
    fixed_buf_t *f = data;
    if (len > sizeof f->b - f->n)
        return -1;
    memcpy(f->b + f->n, buf, len);
    f->n += len;
    return 0;
}

int kvr_kv_enc_end_batch(kvr_kv_enc_t *e, const uint8_t **bytes, size_t *len)
{
    if (e == NULL || !e->in_batch || bytes == NULL || len == NULL)
        return KVR_EINVAL;
    bool v090 = e->cfg.format == KVR_KV_FMT_VLLM_V090;
    size_t size = e->sb.size;
    if (!v090) {
        int rc = e->has_dp_rank ? msgpack_pack_uint32(&e->pk, e->dp_rank)
                                : msgpack_pack_nil(&e->pk);
        if (rc != 0) {
            e->sb.size = size;
            return KVR_ENOMEM;
        }
    }
    fixed_buf_t h = {.n = 0};
    msgpack_packer hp;
    msgpack_packer_init(&hp, &h, fixed_write);
    if ((msgpack_pack_array(&hp, v090 ? 2 : 3) || msgpack_pack_double(&hp, e->ts) ||
         msgpack_pack_array(&hp, e->n_events)) != 0) {
        e->sb.size = size;
        return KVR_ETOOBIG; /* more than 2^32 - 1 events: cannot happen with size_t sizes */
    }
    uint8_t *start = (uint8_t *)e->sb.data + (HDR_ROOM - h.n);
    memcpy(start, h.b, h.n);
    e->in_batch = false;
    *bytes = start;
    *len = e->sb.size - (HDR_ROOM - h.n);
    return KVR_OK;
}
