// Packed sequences of different lengths (backend.h be_seqs_t) as padded
// batches, for the chunked rules whose kernels take B sequences of one
// length T (gdn_chunk_seqs, ssd_chunk_seqs). A group's sequences are copied
// into [n, T] buffers zero-padded after each sequence's end; the callers
// choose inputs for which padding rows leave the state as it is (zero gates
// and step sizes), so each sequence's final state is its own.
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_vec.cuh"

int cu_seqs_groups(be_seqs_t sq, cu_seqs_group_t *groups) {
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

int cu_seqs_consecutive(be_seqs_t sq, const cu_seqs_group_t *g) {
    for (int i = 1; i < g->n; i++)
        if (g->idx[i] != g->idx[0] + i || sq.cu[g->idx[i] + 1] - sq.cu[g->idx[i]] != g->T) return 0;
    return 1;
}

int cu_seqs_adjacent(void *const *ptr, const cu_seqs_group_t *g, size_t bytes) {
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

void cu_seqs_pack(be_t *be, cu_pack_t *p, be_seqs_t sq, const cu_seqs_group_t *g, int unpack) {
    p->T = g->T;
    for (int i = 0; i < g->n; i++)
        p->row0[i] = sq.cu[g->idx[i]], p->len[i] = sq.cu[g->idx[i] + 1] - sq.cu[g->idx[i]];
    k_seqs_pack<<<(unsigned)((int64_t)g->n * g->T), 256, 0, cuda_stream(be)>>>(*p, unpack);
    cuda_check_launch(be, unpack ? "seqs unpack" : "seqs pack");
}

int cu_seqs_states(be_t *be, void *dense, void *const *ptr, const cu_seqs_group_t *g, size_t bytes, int back) {
    for (int i = 0; i < g->n; i++) {
        char *d = (char *)dense + (size_t)i * bytes, *s = (char *)ptr[g->idx[i]];
        cudaError_t e = cudaMemcpyAsync(back ? s : d, back ? d : s, bytes, cudaMemcpyDeviceToDevice, cuda_stream(be));
        if (e != cudaSuccess) return cuda_fail(be, back ? "seqs states (scatter)" : "seqs states (gather)", e);
    }
    return 0;
}
