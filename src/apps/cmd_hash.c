/* cmd_hash.c: placeholder until the hash command lands (same session). */
#include <stdio.h>
#include "apps/apps.h"
int kvr_cmd_hash(int argc, char **argv)
{
    (void)argc; (void)argv;
    fprintf(stderr, "kvrouter hash: not built yet\n");
    return 1;
}
