/*
 * verify.h: the one way the *_verify() checkers of core report a broken invariant: format the
 * message into the caller's (msg, msg_len), when given, and return KVR_EINVAL.
 * Use inside a function with parameters named msg and msg_len.
 */
#ifndef KVR_CORE_VERIFY_H
#define KVR_CORE_VERIFY_H

#include <stdio.h>

#include "kvrouter/status.h"

#define KVR_VERIFY_FAIL(...)                                                                    \
    do {                                                                                        \
        if (msg != NULL && msg_len > 0)                                                         \
            snprintf(msg, msg_len, __VA_ARGS__);                                                \
        return KVR_EINVAL;                                                                      \
    } while (0)

#endif
