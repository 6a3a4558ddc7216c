#include "backend/backend.h"

#include <assert.h>
#include <string.h>

#include "base/err.h"

int cpu_backend_create(be_t **out, size_t scratch_bytes);
#ifdef HYLO_CUDA
int cuda_backend_create(be_t **out, size_t scratch_bytes);
#endif

size_t be_act_size_of(const char *name) { return !strcmp(name, "cpu") ? 4 : !strcmp(name, "cuda") ? 2 : 0; }

int be_create(be_t **out, const char *name, size_t scratch_bytes) {
    *out = NULL;
    if (!strcmp(name, "cpu")) {
        int rc = cpu_backend_create(out, scratch_bytes);
        assert(rc < 0 || (*out)->act_size == be_act_size_of(name));
        return rc;
    }
    if (!strcmp(name, "cuda")) {
#ifdef HYLO_CUDA
        int rc = cuda_backend_create(out, scratch_bytes);
        assert(rc < 0 || (*out)->act_size == be_act_size_of(name));
        return rc;
#else
        return err_set(ERR_UNSUP, "--device cuda: this hylo was built without CUDA (make CUDA=1)");
#endif
    }
    return err_set(ERR_INPUT, "unknown device '%s' (expected cpu or cuda)", name);
}

void be_destroy(be_t *be) {
    if (be) be->destroy(be);
}

int be_scratch_reserve(be_t *be, size_t bytes) {
    if (be->scratch.cap >= bytes) return 0;
    return be_scratch_resize(be, bytes);
}

int be_scratch_resize(be_t *be, size_t bytes) {
    if (be->scratch.cap == bytes) return 0;
    if (!bytes) {
        be->free(be, be->scratch.base);
        arena_init(&be->scratch, NULL, 0, be->scratch.what);
        return 0;
    }
    void *p = be->alloc(be, bytes);
    if (!p) return err_wrap(ERR_NOMEM, "%s scratch arena of %.1f MiB: ", be->name, bytes / 1048576.0);
    be->free(be, be->scratch.base);
    arena_init(&be->scratch, p, bytes, be->scratch.what);
    return 0;
}
