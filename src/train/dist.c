// The trainer's collectives (dist.h): MPI for the host messages and, on the
// CPU backend, for the flat buffers; NCCL for the flat buffers on CUDA.
//
// The all-gather of the weights is a broadcast from each slice's owner (MPI:
// one MPI_Bcast per rank; NCCL: one grouped ncclBroadcast per rank, which
// NCCL runs together): the weight buffer has n elements, not S world, so a
// plain all-gather would need a padded copy of it.
#include "train/dist.h"
#include "base/log.h"

#include <limits.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"

#ifdef HYLO_CUDA
#include <cuda_runtime.h>
#include <nccl.h>
#endif

// OpenMPI keeps what MPI_Init and its first collectives allocate past
// MPI_Finalize, in components it unloads at the end (so no suppression by
// library name matches): under the leak checker (MODE=asan) what the MPI
// calls allocate is not counted.
#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/lsan_interface.h>
#define LSAN_OFF() __lsan_disable()
#define LSAN_ON() __lsan_enable()
#else
#define LSAN_OFF() ((void)0)
#define LSAN_ON() ((void)0)
#endif

static int mpi_fail(int code, const char *what) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(code, msg, &len);
    return err_set(ERR_RUNTIME, "MPI: %s failed: %.*s", what, len, msg);
}
#define MPI_TRY(call, what)                                                                                            \
    do {                                                                                                               \
        LSAN_OFF();                                                                                                    \
        int mpi_rc_ = (call);                                                                                          \
        LSAN_ON();                                                                                                     \
        if (mpi_rc_ != MPI_SUCCESS) return mpi_fail(mpi_rc_, what);                                                    \
    } while (0)

#ifdef HYLO_CUDA
static int nccl_fail(ncclResult_t r, const char *what) {
    return err_set(ERR_RUNTIME, "NCCL: %s failed: %s", what, ncclGetErrorString(r));
}
#define NCCL_TRY(call, what)                                                                                           \
    do {                                                                                                               \
        ncclResult_t nccl_rc_ = (call);                                                                                \
        if (nccl_rc_ != ncclSuccess) return nccl_fail(nccl_rc_, what);                                                 \
    } while (0)
#endif

int dist_active(const dist_t *d) { return d->world > 1 || d->force; }

void dist_single(dist_t *d) {
    memset(d, 0, sizeof *d);
    d->world = d->local_world = 1;
}

int dist_init(dist_t *d, int *argc, char ***argv) {
    dist_single(d);
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        LSAN_OFF();
        int rc = MPI_Init(argc, argv);
        LSAN_ON();
        if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Init");
        d->mpi = 1;
    }
    // errors come back as codes (reported through err_set), not as an abort
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_TRY(MPI_Comm_rank(MPI_COMM_WORLD, &d->rank), "MPI_Comm_rank");
    MPI_TRY(MPI_Comm_size(MPI_COMM_WORLD, &d->world), "MPI_Comm_size");
    MPI_Comm local;
    LSAN_OFF();
    int rc = MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, d->rank, MPI_INFO_NULL, &local);
    LSAN_ON();
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Comm_split_type");
    MPI_Comm_rank(local, &d->local_rank);
    MPI_Comm_size(local, &d->local_world);
    MPI_Comm_free(&local);
    return 0;
}

int dist_use_device(dist_t *d, const char *device) {
#ifdef HYLO_CUDA
    if (strcmp(device, "cuda")) return 0;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) return 0; // the backend reports it
    int dev = n == 1 ? 0 : d->local_rank;
    if (dev >= n)
        return err_set(ERR_INPUT, "rank %d: local rank %d of %d on this host, but only %d GPUs are visible", d->rank,
                       d->local_rank, d->local_world, n);
    if ((e = cudaSetDevice(dev)) != cudaSuccess)
        return err_set(ERR_RUNTIME, "rank %d: cudaSetDevice(%d): %s", d->rank, dev, cudaGetErrorString(e));
#else
    (void)d, (void)device;
#endif
    return 0;
}

int dist_attach(dist_t *d, be_t *be) {
    d->be = be;
    if (!dist_active(d) || be->kind != BE_CUDA) return 0;
#ifdef HYLO_CUDA
    ncclUniqueId id;
    if (d->rank == 0) NCCL_TRY(ncclGetUniqueId(&id), "ncclGetUniqueId");
    MPI_TRY(MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD), "MPI_Bcast(NCCL id)");
    ncclComm_t comm;
    NCCL_TRY(ncclCommInitRank(&comm, d->world, id, d->rank), "ncclCommInitRank");
    d->nccl = comm;
    // the gradient's ranges reduce on their own stream, beside the backward
    cudaStream_t cs;
    cudaEvent_t e1, e2;
    cudaError_t e = cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking);
    if (e != cudaSuccess)
        return err_set(ERR_RUNTIME, "cudaStreamCreate(gradient reduction): %s", cudaGetErrorString(e));
    d->comm_stream = cs;
    if ((e = cudaEventCreateWithFlags(&e1, cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&e2, cudaEventDisableTiming)) != cudaSuccess)
        return err_set(ERR_RUNTIME, "cudaEventCreate(gradient reduction): %s", cudaGetErrorString(e));
    d->ev_ready = e1, d->ev_done = e2;
    if (d->rank == 0) log_info("NCCL: a communicator of %d rank%s, set up over MPI", d->world, d->world > 1 ? "s" : "");
    return 0;
#else
    return err_set(ERR_UNSUP, "a CUDA backend in a build without CUDA");
#endif
}

void dist_finalize(dist_t *d) {
#ifdef HYLO_CUDA
    if (d->nccl) ncclCommDestroy((ncclComm_t)d->nccl);
    if (d->ev_ready) cudaEventDestroy((cudaEvent_t)d->ev_ready);
    if (d->ev_done) cudaEventDestroy((cudaEvent_t)d->ev_done);
    if (d->comm_stream) cudaStreamDestroy((cudaStream_t)d->comm_stream);
#endif
    d->nccl = d->ev_ready = d->ev_done = d->comm_stream = NULL;
    free(d->reqs);
    d->reqs = NULL, d->n_req = d->cap_req = 0;
    LSAN_OFF();
    if (d->mpi) MPI_Finalize();
    LSAN_ON();
    d->mpi = 0;
}

void dist_abort(dist_t *d, int code) {
    if (d->world > 1) MPI_Abort(MPI_COMM_WORLD, code);
}

int64_t dist_slice(const dist_t *d, int64_t n) {
    int64_t S = (n + d->world - 1) / d->world;
    return (S + 63) / 64 * 64;
}

// The CPU path hands counts to MPI as int.
static int mpi_count(int64_t k, const char *what) {
    if (k > INT_MAX)
        return err_set(ERR_UNSUP, "%s: %lld elements per rank; the CPU backend's MPI path takes at most %d", what,
                       (long long)k, INT_MAX);
    return 0;
}

// One owner's part grad[a, b) of a range, summed into rank r's copy: queued
// on the reduction stream (NCCL, inside the caller's group) or started as a
// non-blocking MPI reduction kept in d->reqs.
static int reduce_piece(dist_t *d, float *grad, int64_t a, int64_t b, int r) {
#ifdef HYLO_CUDA
    if (d->nccl) {
        NCCL_TRY(ncclReduce(grad + a, grad + a, (size_t)(b - a), ncclFloat32, ncclSum, r, (ncclComm_t)d->nccl,
                            (cudaStream_t)d->comm_stream),
                 "ncclReduce(gradient)");
        return 0;
    }
#endif
    if (d->n_req == d->cap_req) {
        int cap = d->cap_req ? 2 * d->cap_req : 64;
        void *q = realloc(d->reqs, (size_t)cap * sizeof(MPI_Request));
        if (!q) return err_set(ERR_NOMEM, "out of memory");
        d->reqs = q, d->cap_req = cap;
    }
    MPI_Request *req = (MPI_Request *)d->reqs + d->n_req;
    MPI_TRY(MPI_Ireduce(d->rank == r ? MPI_IN_PLACE : (const void *)(grad + a), grad + a, (int)(b - a), MPI_FLOAT,
                        MPI_SUM, r, MPI_COMM_WORLD, req),
            "MPI_Ireduce(gradient)");
    d->n_req++;
    return 0;
}

int dist_reduce_range(dist_t *d, float *grad, int64_t lo, int64_t hi, int64_t S) {
    if (!dist_active(d) || hi <= lo) return 0;
    if (lo < 0 || hi > S * d->world)
        return err_set(ERR_RUNTIME, "internal: gradient range [%lld, %lld) outside [0, %lld)", (long long)lo,
                       (long long)hi, (long long)(S * d->world));
    d->reduced += hi - lo;
    if (!d->nccl) TRY(mpi_count(S, "reduction of the gradient"));
#ifdef HYLO_CUDA
    if (d->nccl) { // after the backward's work queued so far, beside what it queues next
        cudaError_t e = cudaEventRecord((cudaEvent_t)d->ev_ready, (cudaStream_t)cuda_stream_of(d->be));
        if (e == cudaSuccess) e = cudaStreamWaitEvent((cudaStream_t)d->comm_stream, (cudaEvent_t)d->ev_ready, 0);
        if (e != cudaSuccess) return err_set(ERR_RUNTIME, "gradient reduction: %s", cudaGetErrorString(e));
        NCCL_TRY(ncclGroupStart(), "ncclGroupStart");
    }
#endif
    int rc = 0;
    for (int64_t r = lo / S; r < d->world && r * S < hi && rc == 0; r++)
        rc = reduce_piece(d, grad, lo > r * S ? lo : r * S, hi < r * S + S ? hi : r * S + S, (int)r);
#ifdef HYLO_CUDA
    if (d->nccl) {
        ncclResult_t x = ncclGroupEnd();
        if (rc == 0 && x != ncclSuccess) rc = nccl_fail(x, "ncclGroupEnd(gradient)");
        return rc;
    }
#endif
    TRY(rc);
    // MPI moves non-blocking collectives on when called: let the earlier ones go on
    int flag;
    MPI_TRY(MPI_Testall(d->n_req, (MPI_Request *)d->reqs, &flag, MPI_STATUSES_IGNORE), "MPI_Testall(gradient)");
    return 0;
}

int dist_reduce_wait(dist_t *d, int64_t S) {
    if (!dist_active(d)) return 0;
    int64_t got = d->reduced;
    d->reduced = 0;
#ifdef HYLO_CUDA
    if (d->nccl) {
        cudaError_t e = cudaEventRecord((cudaEvent_t)d->ev_done, (cudaStream_t)d->comm_stream);
        if (e == cudaSuccess) e = cudaStreamWaitEvent((cudaStream_t)cuda_stream_of(d->be), (cudaEvent_t)d->ev_done, 0);
        if (e != cudaSuccess) return err_set(ERR_RUNTIME, "gradient reduction: %s", cudaGetErrorString(e));
    }
#endif
    if (d->n_req) {
        int n = d->n_req;
        d->n_req = 0;
        MPI_TRY(MPI_Waitall(n, (MPI_Request *)d->reqs, MPI_STATUSES_IGNORE), "MPI_Waitall(gradient)");
    }
    if (got != S * d->world)
        return err_set(ERR_RUNTIME, "internal: the gradient's reduced ranges cover %lld elements, not %lld",
                       (long long)got, (long long)(S * d->world));
    return 0;
}

int dist_allgather(dist_t *d, void *w, int64_t n, int64_t S) {
    if (!dist_active(d)) return 0;
    size_t es = d->be->act_size;
#ifdef HYLO_CUDA
    if (d->nccl) {
        ncclDataType_t t = d->be->act_dtype == DT_BF16 ? ncclBfloat16 : ncclFloat32;
        NCCL_TRY(ncclGroupStart(), "ncclGroupStart");
        for (int r = 0; r < d->world; r++) {
            int64_t a = (int64_t)r * S, k = n - a < S ? n - a : S;
            if (k <= 0) break;
            char *p = (char *)w + (size_t)a * es;
            ncclResult_t e =
                ncclBroadcast(p, p, (size_t)k, t, r, (ncclComm_t)d->nccl, (cudaStream_t)cuda_stream_of(d->be));
            if (e != ncclSuccess) {
                ncclGroupEnd();
                return nccl_fail(e, "ncclBroadcast(weights)");
            }
        }
        NCCL_TRY(ncclGroupEnd(), "ncclGroupEnd(weights)");
        return 0;
    }
#endif
    TRY(mpi_count(S, "all-gather of the weights"));
    for (int r = 0; r < d->world; r++) {
        int64_t a = (int64_t)r * S, k = n - a < S ? n - a : S;
        if (k <= 0) break;
        MPI_TRY(MPI_Bcast((char *)w + (size_t)a * es, (int)k, es == 4 ? MPI_FLOAT : MPI_UINT16_T, r, MPI_COMM_WORLD),
                "MPI_Bcast(weights)");
    }
    return 0;
}

int dist_sum(dist_t *d, double *x, int k) {
    if (!dist_active(d)) return 0;
    MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, x, k, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
    return 0;
}

int dist_gather(dist_t *d, const float *mine, float *all, int64_t n, int64_t S) {
    int64_t lo = (int64_t)d->rank * S, k = n - lo < S ? (n - lo > 0 ? n - lo : 0) : S;
    if (d->rank == 0) memcpy(all, mine, (size_t)k * sizeof(float));
    if (!dist_active(d)) return 0;
    const int64_t chunk = (int64_t)1 << 28; // point to point, in chunks whose count fits an int
    if (d->rank) {
        for (int64_t i = 0; i < k; i += chunk)
            MPI_TRY(MPI_Send(mine + i, (int)(k - i < chunk ? k - i : chunk), MPI_FLOAT, 0, 7, MPI_COMM_WORLD),
                    "MPI_Send(optimizer slice)");
        return 0;
    }
    for (int r = 1; r < d->world; r++) {
        int64_t a = (int64_t)r * S, kr = n - a < S ? (n - a > 0 ? n - a : 0) : S;
        for (int64_t i = 0; i < kr; i += chunk)
            MPI_TRY(MPI_Recv(all + a + i, (int)(kr - i < chunk ? kr - i : chunk), MPI_FLOAT, r, 7, MPI_COMM_WORLD,
                             MPI_STATUS_IGNORE),
                    "MPI_Recv(optimizer slice)");
    }
    return 0;
}

int dist_barrier(dist_t *d) {
    if (!dist_active(d)) return 0;
    MPI_TRY(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
    return 0;
}
