// libFuzzer target for the token shard reader (src/train/shard.c): the input
// is a whole shard file, written to an in-memory file (memfd) and opened by
// path with data_shard_open, exactly as a file on disk. Before that the target
// recomputes both CRC-32Cs over the input (when it is long enough to hold a
// header), so mutated inputs reach the field checks behind them instead of
// stopping at a CRC mismatch. A shard that opens has every token, mask bit and
// document start read, and each must satisfy what the reader promised.
// Build: make fuzz; run: see docs/FUZZING.md.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/crc32c.h"
#include "base/log.h"
#include "train/shard.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        log_set_level(LOG_QUIET);
        fd = memfd_create("fuzz.shard", 0);
        if (fd < 0) abort();
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) abort();
    memcpy(buf, data, size);
    if (size >= DATA_SHARD_HEADER_BYTES) { // little-endian CRCs at 52 (payload) and 60 (header)
        uint32_t pc = crc32c(0, buf + DATA_SHARD_HEADER_BYTES, size - DATA_SHARD_HEADER_BYTES);
        memcpy(buf + 52, &pc, 4);
        uint32_t hc = crc32c(0, buf, 60);
        memcpy(buf + 60, &hc, 4);
    }
    if (ftruncate(fd, 0) != 0) abort();
    if (size && pwrite(fd, buf, size, 0) != (ssize_t)size) abort();
    free(buf);

    data_shard_t s;
    if (data_shard_open(&s, path) < 0) return 0;
    if (s.n_tokens < 1 || s.n_docs < 1 || s.n_docs > s.n_tokens) abort();
    const uint8_t *end = s.mf.data + s.mf.size;
    if (s.tokens + s.n_tokens * s.token_bytes > end || s.mask + (s.n_tokens + 7) / 8 > end ||
        s.docs + 8 * s.n_docs > end)
        abort();
    int64_t prev = -1;
    volatile int sink = 0;
    for (int64_t i = 0; i < s.n_tokens; i++) {
        int32_t id = data_shard_token(&s, i);
        if (id < 0 || id >= s.n_vocab) abort();
        sink += data_shard_mask(&s, i);
    }
    for (int64_t i = 0; i < s.n_docs; i++) {
        int64_t st = data_shard_doc_start(&s, i);
        if (st <= prev || st >= s.n_tokens || (i == 0 && st != 0)) abort();
        prev = st;
    }
    (void)sink;
    data_shard_close(&s);
    return 0;
}
