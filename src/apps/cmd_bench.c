/*
 * cmd_bench.c: `kvrouter bench ...` runs the benchmark binary, kvrouter-bench, from the folder
 * this binary is in, with the same arguments. The benchmarks (and Concurrency Kit, the
 * yardstick of one of them) live in their own executable so the product binary carries none
 * of them.
 * Threads: the caller's. Cost: one exec.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "apps/apps.h"

int kvr_cmd_bench(int argc, char **argv)
{
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        fprintf(stderr, "kvrouter bench: cannot find this binary: %s\n", strerror(errno));
        return 1;
    }
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    char bench[PATH_MAX + 32];
    snprintf(bench, sizeof bench, "%.*s/kvrouter-bench", slash ? (int)(slash - exe) : 1,
             slash ? exe : ".");
    (void)argc;
    argv[0] = bench;
    execv(bench, argv);
    fprintf(stderr,
            "kvrouter bench: cannot run %s: %s\n"
            "  (the benchmarks are their own binary: `make bench`, or `cmake --build BUILD "
            "--target kvrouter_bench`)\n",
            bench, strerror(errno));
    return 1;
}
