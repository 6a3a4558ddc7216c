// libFuzzer target for the Hugging Face config readers: the input is
// config.json, a NUL byte, hybrid_config.json, a NUL byte,
// generation_config.json (the later parts optional). config.json is read
// from an in-memory file by path (cfg_read_config_json, as from disk), the
// others parsed from text on top of it. Every architecture that validates
// must give a parameter table and cache sizes without overflow (UBSan), and
// one written back must read back the same (config.json + hybrid_config.json
// in a tmpfs folder).
// Build: make fuzz; run: see docs/FUZZING.md.
#include <sys/stat.h>

#include "base/err.h"
#include "base/fs.h"
#include "fuzz_util.h"
#include "io/config.h"
#include "model/params.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

// What a valid arch must allow: a parameter table (or a limit error, never an
// overflow), non-negative cache sizes.
static void use_arch(const arch_t *a) {
    if (arch_validate(a, "again") != 0) abort(); // the readers finish with it: it must hold
    ptable_t pt;
    if (ptable_build(&pt, a) == 0) {
        int64_t n = ptable_count(&pt);
        if (n <= 0 || pt.total < n) abort();
        for (int i = 0; i < pt.n; i++)
            if (pt.p[i].numel <= 0 || pt.p[i].off < 0 || pt.p[i].off + pt.p[i].numel > pt.total) abort();
        ptable_free(&pt);
    }
    if (arch_cache_bytes_per_token(a, 2) < 0 || arch_state_bytes(a, 4, 2) < 0) abort();
}

// A written config (and hybrid config) reads back to the same layer plan and dimensions.
static void roundtrip(const arch_t *a) {
    static char dir[64];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/dev/shm/hylo_fuzz_config_%d", (int)getpid());
        mkdir(dir, 0700);
    }
    char p[128];
    snprintf(p, sizeof p, "%s/config.json", dir);
    if (cfg_write_config_json(a, p) != 0) return;
    snprintf(p, sizeof p, "%s/hybrid_config.json", dir);
    unlink(p);
    if (a->is_hybrid && cfg_write_hybrid_config(a, p) != 0) return; // plans with no hybrid_config.json form
    arch_t b;
    if (cfg_load_dir(dir, &b) != 0) {
        fprintf(stderr, "written config does not read back: %s\n", err_msg());
        abort();
    }
    if (b.d != a->d || b.n_layers != a->n_layers || b.H != a->H || b.Hkv != a->Hkv || b.dh != a->dh ||
        b.ffn != a->ffn || b.V != a->V || b.eps != a->eps || b.rope.theta != a->rope.theta ||
        b.rope.scaling != a->rope.scaling || b.is_hybrid != a->is_hybrid)
        abort();
    for (int l = 0; l < a->n_layers; l++)
        if (b.kind[l] != a->kind[l]) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *part[FUZZ_MAX_PARTS];
    size_t len[FUZZ_MAX_PARTS];
    int n = fuzz_split(data, size, part, len);
    arch_t a;
    if (cfg_read_config_json(fuzz_memfile(0, part[0], len[0]), &a) == 0) {
        use_arch(&a);
        if (n > 2) cfg_parse_generation_config(part[2], "generation_config.json", &a);
        roundtrip(&a);
        if (n > 1 && cfg_parse_hybrid_config(part[1], "hybrid_config.json", &a) == 0) {
            use_arch(&a);
            roundtrip(&a);
        }
    }
    fuzz_free_parts(part);
    return 0;
}
