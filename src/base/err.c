#include "base/err.h"

#include <stdio.h>
#include <string.h>

static _Thread_local char err_buf[2048];
static _Thread_local int err_last;

int err_set(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err_buf, sizeof err_buf, fmt, ap);
    va_end(ap);
    err_last = code;
    return code;
}

int err_wrap(int code, const char *fmt, ...) {
    char prefix[1024], old[sizeof err_buf];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err_buf, sizeof old);
    size_t n = strlen(prefix);
    memcpy(err_buf, prefix, n);
    size_t m = strnlen(old, sizeof err_buf - 1 - n);
    memcpy(err_buf + n, old, m);
    err_buf[n + m] = 0;
    err_last = code;
    return code;
}

const char *err_msg(void) { return err_buf[0] ? err_buf : "unknown error"; }
int err_code(void) { return err_last; }
void err_clear(void) {
    err_buf[0] = 0;
    err_last = 0;
}
