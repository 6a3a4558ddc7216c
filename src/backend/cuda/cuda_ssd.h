// What cuda_ssd.cu offers beyond the op table, for bench/bench_ssd.c and for
// callers that size the scratch arena. Plain C declarations.
#pragma once
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif
// Bytes of scratch the chunked SSD forward (backward = 0) or backward
// (backward = 1) takes from the arena at these sizes.
size_t cuda_ssd_scratch_bytes(int B, int T, int H, int P, int N, int chunk, int backward);
#ifdef __cplusplus
}
#endif
