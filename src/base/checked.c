#include "base/checked.h"

#include <math.h>

#include "base/err.h"

int ck_int(const char *src, const char *field, int64_t v, int64_t lo, int64_t hi) {
    if (v >= lo && v <= hi) return 0;
    return err_set(ERR_INPUT, "%s: %s = %lld is out of range [%lld, %lld]", src, field, (long long)v, (long long)lo,
                   (long long)hi);
}

int ck_mul(const char *src, const char *field, int64_t a, int64_t b, int64_t limit, int64_t *out) {
    int64_t p;
    if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &p) || p > limit)
        return err_set(ERR_INPUT, "%s: %s = %lld x %lld exceeds the limit of %lld", src, field, (long long)a,
                       (long long)b, (long long)limit);
    *out = p;
    return 0;
}

int ck_add(const char *src, const char *field, int64_t a, int64_t b, int64_t limit, int64_t *out) {
    int64_t s;
    if (a < 0 || b < 0 || __builtin_add_overflow(a, b, &s) || s > limit)
        return err_set(ERR_INPUT, "%s: %s = %lld + %lld exceeds the limit of %lld", src, field, (long long)a,
                       (long long)b, (long long)limit);
    *out = s;
    return 0;
}

int ck_real(const char *src, const char *field, double v, double lo, double hi) {
    if (!isfinite(v)) return err_set(ERR_INPUT, "%s: %s = %g is not finite", src, field, v);
    if (v < lo || v > hi) return err_set(ERR_INPUT, "%s: %s = %g is out of range [%g, %g]", src, field, v, lo, hi);
    return 0;
}

int ck_positive(const char *src, const char *field, double v, double hi) {
    if (!isfinite(v)) return err_set(ERR_INPUT, "%s: %s = %g is not finite", src, field, v);
    if (!(v > 0) || v > hi) return err_set(ERR_INPUT, "%s: %s = %g must be in (0, %g]", src, field, v, hi);
    return 0;
}
