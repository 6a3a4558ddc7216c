#include "model/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/err.h"
#include "base/fs.h"
#include "io/config.h"
#include "io/safetensors.h"

static int dir_is_empty(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 1;
    struct dirent *e;
    int empty = 1;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) empty = 0;
    closedir(d);
    return empty;
}

static int write_files(const char *tmp, const arch_t *a, const ptable_t *pt, const float *host, int dtype,
                       const tok_t *tok, const char *const *meta) {
    char path[1200];
    TRY(fs_join(path, sizeof path, tmp, "config.json"));
    TRY(cfg_write_config_json(a, path));
    if (a->is_hybrid) {
        TRY(fs_join(path, sizeof path, tmp, "hybrid_config.json"));
        TRY(cfg_write_hybrid_config(a, path));
    }
    TRY(fs_join(path, sizeof path, tmp, "generation_config.json"));
    TRY(cfg_write_generation_config(a, path));
    if (tok) TRY(tok_write_hf(tok, tmp));
    st_writer_t w;
    st_writer_init(&w);
    int rc = 0;
    for (int i = 0; i < pt->n && rc == 0; i++) {
        const param_t *p = &pt->p[i];
        // 1-D parameters (norms, A_log, dt_bias, D) stay fp32 whatever the dtype:
        // they are tiny and the recurrences are sensitive to their precision.
        rc = st_writer_add(&w, p->name, p->nd == 1 ? ST_F32 : dtype, p->nd, p->shape, host + p->off);
    }
    if (rc == 0) rc = fs_join(path, sizeof path, tmp, "model.safetensors");
    if (rc == 0) rc = st_writer_write(&w, path, meta);
    st_writer_free(&w);
    return rc;
}

int ckpt_write(const char *dir, const arch_t *a, const ptable_t *pt, const float *host, int dtype, const tok_t *tok,
               const char *const *meta) {
    return ckpt_write_with(dir, a, pt, host, dtype, tok, meta, NULL, NULL);
}

int ckpt_write_with(const char *dir, const arch_t *a, const ptable_t *pt, const float *host, int dtype,
                    const tok_t *tok, const char *const *meta, int (*extra)(const char *tmp, void *user), void *user) {
    if (fs_exists(dir) && (!fs_is_dir(dir) || !dir_is_empty(dir)))
        return err_set(ERR_INPUT, "%s: output folder exists and is not empty", dir);
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", dir, (int)getpid());
    fs_remove_tree(tmp);
    TRY(fs_mkdir_p(tmp));
    int rc = write_files(tmp, a, pt, host, dtype, tok, meta);
    if (rc == 0 && extra) rc = extra(tmp, user);
    if (rc == 0) {
        if (fs_exists(dir)) rmdir(dir); // empty, checked above
        if (rename(tmp, dir) != 0) rc = err_set(ERR_IO, "%s: cannot rename %s onto it: %s", dir, tmp, strerror(errno));
    }
    if (rc < 0) fs_remove_tree(tmp);
    return rc;
}
