// Mamba-2 SSD on the CPU, outside the op table: the naive backward through time
// that serves as the oracle for be->ssd_chunk_bwd in the tests.
#pragma once
#include <stdint.h>

// Backward of the token-by-token recurrence (be->ssd_recurrent_fwd run from
// state0) by walking back through the T+1 stored states of each (b, head).
// Same arguments and conventions as be->ssd_chunk_bwd, with act = float:
// dx, dB, dC (row strides ldx, ldb, ldc; only their own columns are written) =,
// ddt [B,T,H] =, dA_log, dD [H] +=, dstate0 [B,H,P,N] = (may be NULL);
// dstate_final and state0 may be NULL (zeros). Returns 0, or ERR_NOMEM (error
// slot set) when the T+1 states of one head do not fit in memory.
int cpu_ssd_recurrent_bwd(float *dx, float *dB, float *dC, float *ddt, float *dA_log, float *dD, float *dstate0,
                          const float *dy, const float *dstate_final, const float *x, int64_t ldx, const float *Bm,
                          int64_t ldb, const float *Cm, int64_t ldc, const float *dt, const float *A_log,
                          const float *D, const float *state0, int B, int T, int H, int Hx, int GB, int GC, int P,
                          int N);
