#include "eval/ev_data.h"

#include <stdio.h>
#include <string.h>

#include "base/err.h"
#include "base/fs.h"
#include "base/log.h"

static const char *shared_default = "../shared/data";

int ev_data_init(ev_data_t *d, const char *flag) {
    memset(d, 0, sizeof *d);
    if (flag) {
        if (!fs_is_dir(flag)) return err_set(ERR_INPUT, "--data %s: not a folder", flag);
        snprintf(d->root, sizeof d->root, "%s", flag);
        return 0;
    }
    if (fs_is_dir(shared_default)) {
        snprintf(d->root, sizeof d->root, "%s", shared_default);
        d->defaulted = 1;
        log_info("eval: data from %s (no --data given)", shared_default);
    }
    return 0;
}

int ev_data_path(const ev_data_t *d, const char *task, const char *override, const char *rel, const char *what,
                 const char *origin, char *out, size_t cap) {
    size_t rl = strlen(rel);
    int want_dir = rl && rel[rl - 1] == '/';
    if (override) {
        snprintf(out, cap, "%s", override);
    } else if (d->root[0]) {
        if ((size_t)snprintf(out, cap, "%s/%.*s", d->root, (int)(want_dir ? rl - 1 : rl), rel) >= cap)
            return err_set(ERR_INPUT, "%s: data path too long", task);
    } else {
        return err_set(ERR_INPUT,
                       "%s: no data: expected %s (%s) as %s under --data DIR (../shared/data does not exist here), "
                       "or given by its own flag",
                       task, what, origin, rel);
    }
    // a flag may name a file where the default is a folder (--haystack FILE)
    int ok = override ? fs_exists(out) : want_dir ? fs_is_dir(out) : fs_exists(out) && !fs_is_dir(out);
    if (!ok) return err_set(ERR_INPUT, "%s: %s not found: expected %s (%s)", task, out, what, origin);
    return 0;
}
