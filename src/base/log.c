#include "base/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int log_lvl = -1;

void log_set_level(int level) { log_lvl = level; }

int log_level(void) {
    if (log_lvl < 0) {
        const char *e = getenv("HYLO_LOG");
        log_lvl = LOG_INFO;
        if (e && !strcmp(e, "debug")) log_lvl = LOG_DEBUG;
        if (e && !strcmp(e, "warn")) log_lvl = LOG_WARN;
        if (e && !strcmp(e, "error")) log_lvl = LOG_ERROR;
        if (e && !strcmp(e, "quiet")) log_lvl = LOG_QUIET;
    }
    return log_lvl;
}

void log_msg(int level, const char *fmt, ...) {
    if (level < log_level()) return;
    static const char *tag[] = {"debug", "info", "warn", "error"};
    fprintf(stderr, "hylo: %s: ", tag[level]);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}
