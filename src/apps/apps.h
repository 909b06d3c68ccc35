/*
 * apps.h: the kvrouter subcommands. Each is a thin composition of the lower layers and
 * returns a process exit code (0 success, 1 runtime failure, 2 usage error).
 */
#ifndef KVR_APPS_H
#define KVR_APPS_H

int kvr_cmd_hash(int argc, char **argv);
int kvr_cmd_bench(int argc, char **argv);
int kvr_cmd_serve(int argc, char **argv);
int kvr_cmd_mocker(int argc, char **argv);
int kvr_cmd_sim(int argc, char **argv);
int kvr_cmd_replay(int argc, char **argv);
int kvr_cmd_demo(int argc, char **argv);
int kvr_cmd_register(int argc, char **argv);
int kvr_cmd_indexer(int argc, char **argv);
int kvr_cmd_trace(int argc, char **argv);
int kvr_cmd_trace_gen(int argc, char **argv);   /* kvrouter trace gen */
int kvr_cmd_trace_synth(int argc, char **argv); /* kvrouter trace synth */
int kvr_cmd_tokenize(int argc, char **argv);    /* kvrouter tokenize */
int kvr_cmd_top(int argc, char **argv);         /* kvrouter top: the live view of a router */

#endif
