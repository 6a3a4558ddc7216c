// Deterministic random numbers (splitmix64 seeding + xoshiro256**), identical on
// every machine, so seeded initialisations and test inputs are reproducible.
#pragma once
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    uint64_t s[4];
} rng_t;

void rng_seed(rng_t *r, uint64_t seed);
uint64_t rng_u64(rng_t *r);
float rng_uniform(rng_t *r);                   // [0, 1)
float rng_range(rng_t *r, float lo, float hi); // [lo, hi)
float rng_normal(rng_t *r);                    // N(0, 1), Box-Muller
void rng_fill_uniform(rng_t *r, float *x, long n, float lo, float hi);
void rng_fill_normal(rng_t *r, float *x, long n, float mean, float std);

#ifdef __cplusplus
}
#endif
