/*
 * namelist.h: ';'-separated name lists ("sql;chat"), as worker registrations and the mocker's
 * --lora-modules carry LoRA adapters. One walker for every reader of such a list. And the one
 * check of a name that goes into a NATS subject or bucket (a namespace, a router id).
 * Threads: none (pure). Cost: O(list length).
 */
#ifndef KVR_CORE_NAMELIST_H
#define KVR_CORE_NAMELIST_H

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

/* The next name at *cursor (which then points past it): false at the end of the list. A name
 * may be empty ("a;;b"): callers that refuse those check len. */
static inline bool kvr_namelist_next(const char **cursor, const char **name, size_t *len)
{
    const char *p = *cursor;
    if (*p == '\0')
        return false;
    const char *e = strchr(p, ';');
    *name = p;
    *len = e ? (size_t)(e - p) : strlen(p);
    *cursor = p + *len + (e ? 1 : 0);
    return true;
}

/* Whether the list holds the name s[0..n). */
static inline bool kvr_namelist_has(const char *list, const char *s, size_t n)
{
    const char *name;
    size_t len;
    while (kvr_namelist_next(&list, &name, &len))
        if (len == n && memcmp(name, s, n) == 0)
            return true;
    return false;
}

/* s is 1..64 of [A-Za-z0-9_-]: safe as one token of a NATS subject or a bucket name (no dot,
 * no wildcard, no space). */
static inline bool kvr_token_ok(const char *s)
{
    size_t n = s != NULL ? strlen(s) : 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-'))
            return false;
    }
    return n > 0 && n <= 64;
}

#endif
