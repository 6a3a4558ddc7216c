// Stop strings over streamed text: text is fed as it is decoded, and only what
// can no longer be the start of a stop string is handed on. A stop string may
// span any number of tokens; when one appears, the text before it is the last
// that is handed on and the stop string itself never is.
#pragma once
#include <stddef.h>

#include "base/strbuf.h"

typedef struct {
    char **s; // the stop strings (copies), none empty
    int n;
    strbuf_t pend; // fed text held back: a suffix that could begin a stop string
} srv_stop_t;

// Copies n stop strings (empty strings are ignored). 0 or ERR_NOMEM.
int srv_stop_init(srv_stop_t *st, const char *const *s, int n);
void srv_stop_free(srv_stop_t *st);
// Feeds n bytes; appends to out what is safe to emit. Returns 1 when a stop
// string has appeared (out then ends right before it; feed nothing more),
// else 0. A failed allocation sets out->oom or pend's (srv_stop_oom).
int srv_stop_feed(srv_stop_t *st, const char *text, size_t n, strbuf_t *out);
// The end of generation without a stop string: appends the held-back text.
void srv_stop_flush(srv_stop_t *st, strbuf_t *out);
int srv_stop_oom(const srv_stop_t *st);
