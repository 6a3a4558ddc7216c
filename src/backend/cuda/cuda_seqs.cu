// Packed sequences of different lengths (backend.h be_seqs_t) as padded
// batches, for the chunked rules whose kernels take B sequences of one
// length T (gdn_chunk_seqs, ssd_chunk_seqs). A group's sequences are copied
// into [n, T] buffers zero-padded after each sequence's end; the callers
// choose inputs for which padding rows leave the state as it is (zero gates
// and step sizes), so each sequence's final state is its own.
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_vec.cuh"

enum { CU_SEQS_GROUP = 64, CU_PACK_ARRAYS = 6 };
typedef struct {
    int n, T;
    int idx[CU_SEQS_GROUP]; // sequence numbers in sq
} cu_seqs_group_t;

// Up to CU_PACK_ARRAYS arrays copied between the packed rows (packed[a], rows
// ld[a] elements apart) and dense [n, T, cols[a]] buffers (dense[a]), esz[a]
// bytes an element (2 or 4). Passed to the kernel by value.
typedef struct {
    int n_arr, T;
    const void *packed[CU_PACK_ARRAYS];
    void *dense[CU_PACK_ARRAYS];
    int64_t ld[CU_PACK_ARRAYS];
    int cols[CU_PACK_ARRAYS], esz[CU_PACK_ARRAYS];
    int32_t row0[CU_SEQS_GROUP], len[CU_SEQS_GROUP];
} cu_pack_t;

// The groups of sq (cuda.h) into groups (room for sq.n); how many, -1 when
// out of host memory.
static int cu_seqs_groups(be_seqs_t sq, cu_seqs_group_t *groups) {
    int *ord = (int *)malloc((size_t)(sq.n > 0 ? sq.n : 1) * sizeof(int)), m = 0, ng = 0;
    if (!ord) return -1;
    for (int s = 0; s < sq.n; s++) // a sequence of no rows keeps its state: nothing to run
        if (sq.cu[s + 1] > sq.cu[s]) ord[m++] = s;
    for (int i = 1; i < m; i++) { // longest first; equal lengths in index order (insertion sort: stable)
        int s = ord[i], L = sq.cu[s + 1] - sq.cu[s], j = i;
        for (; j > 0 && sq.cu[ord[j - 1] + 1] - sq.cu[ord[j - 1]] < L; j--)
            ord[j] = ord[j - 1];
        ord[j] = s;
    }
    for (int i = 0; i < m; ng++) {
        cu_seqs_group_t *g = &groups[ng];
        g->T = sq.cu[ord[i] + 1] - sq.cu[ord[i]];
        g->n = 0;
        int64_t real = 0;
        while (i < m && g->n < CU_SEQS_GROUP) {
            int L = sq.cu[ord[i] + 1] - sq.cu[ord[i]];
            if (g->n && (int64_t)(g->n + 1) * g->T > 2 * (real + L)) break;
            g->idx[g->n++] = ord[i++], real += L;
        }
    }
    free(ord);
    return ng;
}

// Whether the group's rows are already its [n, T] batch: sequences idx[0],
// idx[0] + 1, ... in order, all of length T (no copy needed).
static int cu_seqs_consecutive(be_seqs_t sq, const cu_seqs_group_t *g) {
    for (int i = 1; i < g->n; i++)
        if (g->idx[i] != g->idx[0] + i || sq.cu[g->idx[i] + 1] - sq.cu[g->idx[i]] != g->T) return 0;
    return 1;
}

// Whether the group's states (ptr[idx[i]], bytes each) lie one after another.
static int cu_seqs_adjacent(void *const *ptr, const cu_seqs_group_t *g, size_t bytes) {
    for (int i = 1; i < g->n; i++)
        if ((char *)ptr[g->idx[i]] != (char *)ptr[g->idx[0]] + (size_t)i * bytes) return 0;
    return 1;
}

// Block r: padded row r = (s, t) of every array. Pack: packed row cu + t of
// sequence s (rows ld elements apart) -> dense row s * T + t, zeros where t is
// past the sequence's end. Unpack: the reverse, rows past the end skipped.
__global__ void k_seqs_pack(const __grid_constant__ cu_pack_t p, int unpack) {
    const int s = blockIdx.x / p.T, t = blockIdx.x % p.T;
    const bool real = t < p.len[s];
    if (unpack && !real) return;
    for (int a = 0; a < p.n_arr; a++) {
        const int64_t n = p.cols[a];
        const int64_t pr = ((int64_t)p.row0[s] + t) * p.ld[a], dr = ((int64_t)s * p.T + t) * n;
        if (p.esz[a] == 2) {
            unsigned short *packed = (unsigned short *)p.packed[a] + pr, *dense = (unsigned short *)p.dense[a] + dr;
            for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
                if (unpack)
                    packed[j] = dense[j];
                else
                    dense[j] = real ? packed[j] : 0;
        } else {
            unsigned *packed = (unsigned *)p.packed[a] + pr, *dense = (unsigned *)p.dense[a] + dr;
            for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
                if (unpack)
                    packed[j] = dense[j];
                else
                    dense[j] = real ? packed[j] : 0u;
        }
    }
}

// unpack 0: the group's rows into the dense buffers, zeros after each
// sequence's end; 1: the dense rows back (padding rows dropped). One launch.
static void cu_seqs_pack(be_t *be, cu_pack_t *p, be_seqs_t sq, const cu_seqs_group_t *g, int unpack) {
    p->T = g->T;
    for (int i = 0; i < g->n; i++)
        p->row0[i] = sq.cu[g->idx[i]], p->len[i] = sq.cu[g->idx[i] + 1] - sq.cu[g->idx[i]];
    k_seqs_pack<<<(unsigned)((int64_t)g->n * g->T), 256, 0, cuda_stream(be)>>>(*p, unpack);
    cuda_check_launch(be, unpack ? "seqs unpack" : "seqs pack");
}

// The group's states (ptr[idx[i]], bytes each) into dense [n] (back 0), or
// dense back into them (1). 0, or < 0 with the error recorded.
static int cu_seqs_states(be_t *be, void *dense, void *const *ptr, const cu_seqs_group_t *g, size_t bytes, int back) {
    for (int i = 0; i < g->n; i++) {
        char *d = (char *)dense + (size_t)i * bytes, *s = (char *)ptr[g->idx[i]];
        cudaError_t e = cudaMemcpyAsync(back ? s : d, back ? d : s, bytes, cudaMemcpyDeviceToDevice, cuda_stream(be));
        if (e != cudaSuccess) return cuda_fail(be, back ? "seqs states (scatter)" : "seqs states (gather)", e);
    }
    return 0;
}

// A group's sequence s: its rows of array a start at row cu[s].
static const void *seq_rows(const cu_seqs_arr_t &a, be_seqs_t sq, int s) {
    return (const char *)a.p + (size_t)sq.cu[s] * a.ld * a.esz;
}

void cu_seqs_run(be_t *be, const char *op, be_seqs_t sq, void *const *state, size_t state_bytes,
                 const cu_seqs_arr_t *in, int n_in, cu_seqs_arr_t out, cu_seqs_scratch_fn scratch, cu_seqs_fn run,
                 const void *ctx) {
    cu_seqs_group_t *gr = (cu_seqs_group_t *)malloc((size_t)(sq.n > 0 ? sq.n : 1) * sizeof *gr);
    int ng = gr ? cu_seqs_groups(sq, gr) : -1;
    if (ng < 0) {
        free(gr);
        cu_op_error(be, "%s: out of host memory for %d sequences", op, sq.n);
        return;
    }
    cu_seqs_arr_t a[CU_PACK_ARRAYS];
    for (int i = 0; i < ng; i++) {
        cu_seqs_group_t *g = &gr[i];
        const int n = g->n, T = g->T, s0 = g->idx[0];
        const int in_place = cu_seqs_consecutive(sq, g), st_in_place = cu_seqs_adjacent(state, g, state_bytes);
        const size_t mark = arena_mark(&be->scratch);
        void *dense[CU_PACK_ARRAYS] = {0}, *sp = NULL;
        int ok = 1;
        for (int j = 0; j <= n_in && !in_place && ok; j++) { // the inputs', then the output's dense buffer
            const cu_seqs_arr_t &x = j < n_in ? in[j] : out;
            ok = (dense[j] = cu_scratch_try(be, (size_t)n * T * x.cols * x.esz)) != NULL;
        }
        if (ok && !st_in_place) ok = (sp = cu_scratch_try(be, (size_t)n * state_bytes)) != NULL;
        // the group's own buffers need room beside the kernels' scratch
        if (ok) ok = be->scratch.cap - cu_round256(be->scratch.used) >= scratch(ctx, n, T);
        if (!ok || n == 1) { // one by one, in place
            arena_reset(&be->scratch, mark);
            for (int j = 0; j < n; j++) {
                const int s = g->idx[j];
                for (int k = 0; k < n_in; k++)
                    a[k] = in[k], a[k].p = seq_rows(in[k], sq, s);
                run(be, ctx, a, (void *)seq_rows(out, sq, s), out.ld, (float *)state[s], 1, sq.cu[s + 1] - sq.cu[s]);
            }
            continue;
        }
        cu_pack_t pk;
        memset(&pk, 0, sizeof pk);
        for (int k = 0; k < n_in; k++) {
            a[k] = in[k];
            if (in_place) {
                a[k].p = seq_rows(in[k], sq, s0);
            } else {
                a[k].p = dense[k], a[k].ld = in[k].cols;
                pk.packed[k] = in[k].p, pk.dense[k] = dense[k], pk.ld[k] = in[k].ld;
                pk.cols[k] = in[k].cols, pk.esz[k] = in[k].esz;
            }
        }
        if (!in_place) pk.n_arr = n_in, cu_seqs_pack(be, &pk, sq, g, 0);
        int rc = st_in_place ? 0 : cu_seqs_states(be, sp, state, g, state_bytes, 0);
        if (rc == 0) {
            void *o = in_place ? (void *)seq_rows(out, sq, s0) : dense[n_in];
            run(be, ctx, a, o, in_place ? out.ld : out.cols, st_in_place ? (float *)state[s0] : (float *)sp, n, T);
            if (!in_place) { // the output alone, back to the packed rows
                pk.n_arr = 1, pk.packed[0] = out.p, pk.dense[0] = dense[n_in], pk.ld[0] = out.ld;
                pk.cols[0] = out.cols, pk.esz[0] = out.esz;
                cu_seqs_pack(be, &pk, sq, g, 1);
            }
            if (!st_in_place) rc = cu_seqs_states(be, sp, state, g, state_bytes, 1);
        }
        arena_reset(&be->scratch, mark);
        if (rc < 0) break;
    }
    free(gr);
}
