// Errors with context. Library functions return 0 on success or a negative code
// and leave a message in a per-thread slot: which file / tensor / field, what was
// expected, what was found. Nothing in the library exits; the CLI prints the slot.
#pragma once
#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    ERR_OK = 0,
    ERR_INPUT = -1,   // bad input: malformed file, wrong shape, unknown field (CLI exit 2)
    ERR_IO = -2,      // a read/write/open failed (CLI exit 1)
    ERR_NOMEM = -3,   // allocation failed
    ERR_UNSUP = -4,   // valid but not supported (architecture, quant type) (CLI exit 2)
    ERR_RUNTIME = -5, // device or library failure (CLI exit 1)
};

// Record a message (printf-style) and return `code`, so callers write
// `return err_set(ERR_INPUT, "%s: tensor %s: ...", path, name);`
int err_set(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// Prefix the current message with more context ("loading model: " + old message).
int err_wrap(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *err_msg(void);
int err_code(void);
void err_clear(void);

// Propagate a negative return code unchanged.
#define TRY(expr)                                                                                                      \
    do {                                                                                                               \
        int try_rc_ = (expr);                                                                                          \
        if (try_rc_ < 0) return try_rc_;                                                                               \
    } while (0)

#ifdef __cplusplus
}
#endif
