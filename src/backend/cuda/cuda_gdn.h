// What cuda_gdn.cu offers beyond the op table, for bench/bench_gdn.c and for
// callers that size the scratch arena. Plain C declarations.
#pragma once
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif
// Bytes of scratch the chunked forward (bwd = 0) or backward (bwd = 1) takes
// from the arena at these sizes.
size_t gdn_chunk_scratch_bytes(int B, int T, int H, int HV, int K, int Dv, int bwd);
// gdn_cuda_timing(1): every chunked op records per-kernel times (and becomes
// synchronous); gdn_cuda_timing_read returns up to max (name, ms, calls)
// totals, clears them, and returns how many.
void gdn_cuda_timing(int on);
int gdn_cuda_timing_read(const char **names, double *ms, int *calls, int max);
#ifdef __cplusplus
}
#endif
