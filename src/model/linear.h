// Linear layers in PyTorch convention (W [out, in], y = x W^T) on the op table.
#pragma once
#include "backend/backend.h"

// y[N, out] = x[N, in] W^T
void lin_fwd(be_t *be, void *y, const void *x, const void *W, int64_t N, int64_t in, int64_t out);
// dx[N, in] = dy W (overwritten, or added when acc); dW[out, in] += dy^T x (float).
void lin_bwd(be_t *be, void *dx, int acc, void *dW, const void *dy, const void *x, const void *W, int64_t N, int64_t in,
             int64_t out);
