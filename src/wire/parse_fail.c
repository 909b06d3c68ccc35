/* parse_fail.c: see parse_fail.h. */
#include "wire/parse_fail.h"

#include <stdarg.h>
#include <stdio.h>

#include "kvrouter.h"

int kvr_parse_fail(char *err, size_t err_len, const char *fmt, ...)
{
    if (err != NULL && err_len > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    return KVR_EPARSE;
}
