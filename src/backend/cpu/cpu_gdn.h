// Gated DeltaNet on the CPU: what is not in the op table.
#pragma once

// Naive backward of the token-by-token gated delta rule (the recurrence of
// gdn_recurrent_fwd, spec linear_blocks.md section 1.5), by backpropagation
// through time over the stored per-token states. A test oracle for
// gdn_chunk_bwd (same arguments and semantics, plain host fp32 pointers):
// dq, dk, dv, dg, dbeta are overwritten; dstate0 (NULL = not wanted) receives
// the gradient of the initial state state0 (NULL = zeros); dstate_final
// (NULL = 0) is the incoming gradient of the final state. Memory: (T+1)*Dv*K
// floats per value head, allocated with malloc - tests only.
// Returns 0, or ERR_NOMEM with the error slot set.
int cpu_gdn_recurrent_bwd(float *dq, float *dk, float *dv, float *dg, float *dbeta, float *dstate0, const float *dout,
                          const float *dstate_final, const float *q, const float *k, const float *v, const float *g,
                          const float *beta, const float *state0, float scale, int B, int T, int H, int HV, int K,
                          int Dv);
