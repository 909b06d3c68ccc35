/* grow.c: see grow.h. */
#include "base/grow.h"

#include <stdint.h>
#include <stdlib.h>

#include "kvrouter/status.h"

int kvr_grow(void **buf, size_t *cap, size_t need, size_t max, size_t elem)
{
    if (need <= *cap)
        return KVR_OK;
    if (need > max || elem == 0)
        return KVR_ENOMEM;
    size_t n = *cap < 64 ? 64 : *cap;
    while (n < need)
        n = n > SIZE_MAX / 4 ? need : n * 2;
    if (n > max)
        n = max;
    if (n > SIZE_MAX / elem)
        return KVR_ENOMEM;
    void *p = realloc(*buf, n * elem);
    if (p == NULL)
        return KVR_ENOMEM;
    *buf = p;
    *cap = n;
    return KVR_OK;
}
