/*
 * status.c: names and messages for the status codes of kvrouter/status.h (one X-macro table).
 * Invariants: every code of the table has a name and a text; others read "unknown".
 * Ownership: static strings. Threads: any (no state). Cost: O(codes).
 */
#include "kvrouter/status.h"

const char *kvr_strerror(int status)
{
    switch (status) {
#define KVR_STATUS_TEXT(name, value, text) \
    case value:                            \
        return text;
        KVR_STATUS_TABLE(KVR_STATUS_TEXT)
#undef KVR_STATUS_TEXT
    default:
        return "unknown status";
    }
}

const char *kvr_status_name(int status)
{
    switch (status) {
#define KVR_STATUS_NAME(name, value, text) \
    case value:                            \
        return #name;
        KVR_STATUS_TABLE(KVR_STATUS_NAME)
#undef KVR_STATUS_NAME
    default:
        return "KVR_UNKNOWN";
    }
}
