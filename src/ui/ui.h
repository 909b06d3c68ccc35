/*
 * ui.h: the operator's live view, a service of the HTTP host (http/host.h):
 *   GET /ui        one self-contained HTML page (its CSS and JS inside, compiled into the
 *                  binary from src/ui/page.html; a Content-Security-Policy lets it reach
 *                  nothing but this router), refreshing itself from the two below;
 *   GET /v1/stats  the router's last ten minutes, one point a second (ui_history.h), computed
 *                  in process from the router's own /metrics text, so the page, `kvrouter top`
 *                  and a Prometheus scraping the router agree; ?since=T: only points after T.
 * Both are in the read access class (http/access.h), as GET /v1/workers, which the page also
 * reads. Polling, not server-sent events: EventSource cannot send an Authorization header,
 * while fetch() re-sends the credentials a browser was challenged for.
 * Ownership: borrows the host and the fleet (both outlive it). Threads: the loop's (HTTP)
 * thread. Cost: a sample a second: one exposition text (as a scrape) and one pass over it.
 */
#ifndef KVR_UI_UI_H
#define KVR_UI_UI_H

#include <stddef.h>

#include "kvrouter/config.h"
#include "fleet/fleet.h"
#include "http/http.h"

struct event_base;

typedef struct kvr_ui kvr_ui_t;

typedef struct kvr_ui_config {
    struct event_base *loop;
    kvr_http_host_t *host;
    kvr_fleet_t *fleet;
    const kvr_router_config_t *cfg;
} kvr_ui_config_t;

/* Adds itself to the host and starts sampling. NULL with *status and err on failure. */
kvr_ui_t *kvr_ui_new(const kvr_ui_config_t *c, int *status, char *err, size_t err_len);
/* Removes itself from the host. */
void kvr_ui_free(kvr_ui_t *u);

#endif
