/*
 * nats_auth.h: how a process proves who it is to NATS, and checks that the server is the
 * right one. Every kvrouter process that speaks NATS (serve, mocker, register) takes the same
 * settings, each a file so that no secret sits on a command line (ps shows it) or in the
 * environment:
 *   creds_file   a .creds file (the user's JWT and nkey seed, as nsc writes it)
 *   nkey_file    an nkey user: the seed (a line "SU...") and its public key (a line "U..."), as
 *                `nk -gen user -pubout` prints them
 *   token_file   a token (authorization { token: ... } on the server)
 *   tls_ca       TLS on, the server's certificate checked against this CA (PEM)
 *   tls_cert, tls_key   a client certificate and its key (PEM), for servers that verify them
 * At most one of creds_file, nkey_file and token_file. A url that carries a user, password or
 * token itself still works, with a warning: it shows in `ps` and in logs.
 *
 * Everything is checked at start-up (files readable, well-formed), with the setting named.
 * Threads: the caller's (once, before connecting). Cost: a few small file reads.
 */
#ifndef KVR_NET_NATS_AUTH_H
#define KVR_NET_NATS_AUTH_H

#include <stdbool.h>
#include <stddef.h>

#include <nats/nats.h>

typedef struct kvr_nats_auth {
    const char *creds_file; /* NULL or "" = unset, for each */
    const char *nkey_file;
    const char *token_file;
    const char *tls_ca;
    const char *tls_cert;
    const char *tls_key;
} kvr_nats_auth_t;

/* Whether url carries credentials (nats://user:pass@host or nats://token@host, in any entry of
 * a comma-separated list). */
bool kvr_nats_url_has_credentials(const char *url);

/* Applies a to opts (url: for the warning only). KVR_OK; KVR_EINVAL or KVR_EIO with err naming
 * the setting (given as nats_<name>) and the problem. */
int kvr_nats_auth_apply(natsOptions *opts, const kvr_nats_auth_t *a, const char *url, char *err,
                        size_t err_len);

#endif
