/* bench_main.c: placeholder until the benchmarks land (same session). */
#include <stdio.h>
#include "apps/apps.h"
int kvr_cmd_bench(int argc, char **argv)
{
    (void)argc; (void)argv;
    fprintf(stderr, "kvrouter bench: not built yet\n");
    return 1;
}
