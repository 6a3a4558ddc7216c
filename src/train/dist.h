// Data-parallel communication of the trainer: the ranks of an `mpirun -np N`
// (or srun) job, each with its device. MPI starts the ranks and carries the
// small host messages (loss sums, the gradient norm, checkpoints); the flat
// gradient and weight buffers go through MPI on the CPU backend and through
// NCCL (one communicator, set up over MPI) on CUDA. With one rank every
// collective returns at once: a run without mpirun costs nothing extra
// (unless `force` asks for the collectives anyway, to check their path on one
// device: they then leave every buffer as it is).
//
// The flat buffers are cut into world slices of S elements (the last ones may
// be short or empty): rank r owns [r S, min(n, r S + S)).
#pragma once
#include <stdint.h>

#include "backend/backend.h"

typedef struct {
    int rank, world;             // in MPI_COMM_WORLD
    int local_rank, local_world; // among the ranks of this host (MPI_COMM_TYPE_SHARED)
    int mpi;                     // MPI_Init was called here (dist_finalize ends it)
    int force;                   // the collectives run with one rank too (hylo train --force-collectives)
    be_t *be;                    // the device of the buffer collectives (dist_attach)
    void *nccl;                  // ncclComm_t (CUDA, world > 1 or force)
    // The gradient reduced in ranges (dist_reduce_range): MPI requests in
    // flight (CPU), NCCL's stream and events (CUDA), elements started.
    void *reqs;
    int n_req, cap_req;
    void *comm_stream, *ev_ready, *ev_done;
    int64_t reduced;
} dist_t;

// Whether the collectives run: several ranks, or one when asked (`force`).
int dist_active(const dist_t *d);

// The ranks of the job: MPI_Init (a singleton world of 1 without mpirun).
int dist_init(dist_t *d, int *argc, char ***argv);
// One process, no MPI (library users and tests): rank 0 of 1.
void dist_single(dist_t *d);
// Before the backend is created: on "cuda" the rank takes the GPU of its
// local rank (device 0 when the rank sees only one, as under srun
// --gpus-per-task=1).
int dist_use_device(dist_t *d, const char *device);
// The communicator of be's device for the buffer collectives (CUDA with
// world > 1: NCCL, its unique id broadcast over MPI).
int dist_attach(dist_t *d, be_t *be);
void dist_finalize(dist_t *d);
// After an error on one rank: ends every rank of the job (the others may be
// waiting in a collective). Returns only with one rank.
void dist_abort(dist_t *d, int code);

// The slice length S for n elements: ceil(n / world) rounded up to 64
// elements, so that every slice starts aligned.
int64_t dist_slice(const dist_t *d, int64_t n);

// The gradient grad [S world] (device, fp32) summed over the ranks into each
// owner's slice, in ranges while the backward still runs (the trainer starts
// one per layer as model_backward_told finishes it): starts the sum over
// ranks of grad[lo, hi), each owner's part of it to its owner (CPU: MPI_Ireduce; CUDA: ncclReduce on a stream of its
// own, after the work queued so far on the backend's stream), and returns. [lo, hi) must not be written until
// dist_reduce_wait. The ranges of a step must not overlap, must come in the same order on every rank, and together
// cover [0, S world).
int dist_reduce_range(dist_t *d, float *grad, int64_t lo, int64_t hi, int64_t S);
// Waits for every range started (CUDA: the backend's stream waits for them);
// then grad[rank S, rank S + S) holds the sum over ranks of that slice, the
// rest of grad is left undefined. An error when the ranges did not add up to
// S world elements.
int dist_reduce_wait(dist_t *d, int64_t S);
// w [n] (device, the backend's act dtype), in place: every rank's slice
// [r S, min(n, r S + S)) goes to every rank.
int dist_allgather(dist_t *d, void *w, int64_t n, int64_t S);
// x [k] (host) = the sum over ranks, the same on every rank.
int dist_sum(dist_t *d, double *x, int k);
// Rank 0's all [n] (host) = every rank's slice (mine [min(n, r S + S) - r S],
// host); all is unused on the other ranks.
int dist_gather(dist_t *d, const float *mine, float *all, int64_t n, int64_t S);
int dist_barrier(dist_t *d);
