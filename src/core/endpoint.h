/*
 * endpoint.h: what a worker registration may name (command line or POST /v1/workers), checked
 * before anything is connected. A registration is a request to open connections from the
 * router's host, so it is refused unless it names exactly an engine:
 *   events / replay  tcp://HOST:PORT, which the router connects to (it never binds for an
 *                    engine, so no registration opens a port or creates a file); or
 *                    ipc:///ABS/PATH only under a directory of allowed_ipc_dirs
 *   url              http://HOST[:PORT][/base-path] (https is not spoken upstream: refused
 *                    with that reason rather than sent in clear)
 *   tokenizer        /ABS/DIR only under a directory of allowed_tokenizer_dirs (the router
 *                    reads the files in it)
 * HOST is a DNS name, an IPv4 address or a bracketed IPv6 address, never a wildcard; with
 * allowed_worker_hosts set, it must be one of them (case-insensitive), for urls and tcp events.
 * A registration (a policy given) may not name a bind-only host either: an unspecified address
 * (0.0.0.0, [::]) or the name of one of the router's network interfaces.
 * Errors name the field and the reason. String checks (the interface lookup aside: one
 * if_nametoindex call per registration): no allocation, any thread;
 * O(length of the address + length of the allow lists).
 */
#ifndef KVR_ENDPOINT_H
#define KVR_ENDPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kvr_endpoint_policy {
    const char *ipc_dirs; /* comma-separated absolute directories; NULL or "" = no ipc:// */
    const char *hosts;    /* comma-separated host names; NULL or "" = any host */
} kvr_endpoint_policy_t;

/* field: the name reported in err ("events", "replay"). KVR_OK or KVR_EINVAL. */
int kvr_endpoint_check_zmq(const char *field, const char *addr, const kvr_endpoint_policy_t *p,
                           char *err, size_t err_len);
/* A worker's base URL, taken apart: the one URL parser of the tree (the front end's pools, the
 * health probes and replay targets use it). */
typedef struct kvr_url {
    char host[256];      /* without IPv6 brackets: what a resolver takes */
    char host_hdr[300];  /* for the Host header: host:port, an IPv6 host in brackets */
    uint16_t port;       /* 80 when the url names none */
    char base_path[260]; /* the path without trailing '/' ("" for none) */
} kvr_url_t;

/* Checks url as kvr_endpoint_check_url does and fills *out (when not NULL). p may be NULL (no
 * host list). KVR_OK or KVR_EINVAL ("url: ..." in err; a host or path too long for kvr_url_t
 * included). */
int kvr_endpoint_parse_url(const char *url, const kvr_endpoint_policy_t *p, kvr_url_t *out,
                           char *err, size_t err_len);
/* A worker's base URL. KVR_OK or KVR_EINVAL. */
int kvr_endpoint_check_url(const char *url, const kvr_endpoint_policy_t *p, char *err,
                           size_t err_len);
/* Whether host equals an entry of the comma-separated list (case-insensitive, entries
 * trimmed of spaces). */
bool kvr_endpoint_host_listed(const char *list, const char *host);
/* An allowed_ipc_dirs value: every entry an absolute, normalised directory. */
int kvr_endpoint_check_ipc_dirs(const char *dirs, char *err, size_t err_len);
/* The same for any setting listing directories (its name in err). */
int kvr_endpoint_check_dir_list(const char *setting, const char *dirs, char *err,
                                size_t err_len);
/* A path a registration names (field), to be read by the router: absolute, normalised, under
 * one of the directories of setting (dirs); refused when dirs is empty. A string check: the
 * operator who lists a directory vouches for what is in it (symbolic links included). */
int kvr_endpoint_check_dir(const char *field, const char *path, const char *setting,
                           const char *dirs, char *err, size_t err_len);

#endif
