/*
 * gnuplot.h: drawing a plot with gnuplot (Debian's gnuplot-nox), the one way the tools make
 * pictures (`kvrouter replay --plot`, `kvrouter demo`, `kvrouter sim --plot`). The caller
 * writes the plot commands; this writes them to a temporary script after the terminal and
 * output lines (.png: pngcairo; .svg: svg, chosen by the output's extension), runs gnuplot on
 * it, checks that the output was written, and removes the script.
 * Threads: any (it spawns and waits for one process). Cost: one gnuplot run.
 */
#ifndef KVR_APPS_GNUPLOT_H
#define KVR_APPS_GNUPLOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

typedef struct kvr_gnuplot {
    const char *out;                  /* .png or .svg */
    int width, height;                /* pixels */
    void (*body)(FILE *f, void *arg); /* the commands after `set output` */
    void *arg;
} kvr_gnuplot_t;

/* KVR_OK; KVR_EINVAL (the output's extension), KVR_ENOTFOUND (gnuplot not installed: err
 * says how to install it), KVR_EIO (the script, gnuplot's run or its output). */
int kvr_gnuplot_draw(const kvr_gnuplot_t *p, char *err, size_t err_len);
/* Whether gnuplot is on PATH. */
bool kvr_gnuplot_available(void);
/* s as a gnuplot single-quoted string (' doubled, control characters dropped). */
void kvr_gnuplot_str(FILE *f, const char *s);

#endif
