/*
 * parse_fail.h: the one way the wire readers (index_snapshot.c, sync_msg.c,
 * engine_capacity.c) refuse bytes: the message formatted into the caller's (err, err_len) when
 * given, KVR_EPARSE returned. Threads: none. Cost: one vsnprintf.
 */
#ifndef KVR_WIRE_PARSE_FAIL_H
#define KVR_WIRE_PARSE_FAIL_H

#include <stddef.h>

int kvr_parse_fail(char *err, size_t err_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
