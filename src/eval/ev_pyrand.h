// The random streams RULER's Python generators draw from, reproduced bit for
// bit (eval.md §1.11): MT19937 seeded as CPython's random.seed(int) or as
// numpy's legacy np.random.seed(int), and the CPython algorithms built on it
// (random, getrandbits, randbelow, randint, choice, choices, shuffle, sample)
// plus numpy's legacy randint. With these, a generator that draws in the same
// order as the reference produces the same sample bytes.
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint32_t mt[624];
    int i;
} ev_mt_t;

// random.seed(seed): init_by_array over the 32-bit words of |seed|.
void ev_py_seed(ev_mt_t *r, uint64_t seed);
// numpy.random.seed(seed) (legacy RandomState): init_genrand(seed).
void ev_np_seed(ev_mt_t *r, uint32_t seed);
uint32_t ev_mt_u32(ev_mt_t *r);

double ev_py_random(ev_mt_t *r);               // random()
uint64_t ev_py_getrandbits(ev_mt_t *r, int k); // getrandbits(k), 1 <= k <= 64
// getrandbits(128): the low and high 64 bits.
void ev_py_getrandbits128(ev_mt_t *r, uint64_t *lo, uint64_t *hi);
uint64_t ev_py_randbelow(ev_mt_t *r, uint64_t n);        // _randbelow(n), n >= 1
int64_t ev_py_randint(ev_mt_t *r, int64_t a, int64_t b); // randint(a, b), inclusive
size_t ev_py_choices_index(ev_mt_t *r, size_t n);        // one draw of choices(pop) over n items
// shuffle(x) over n elements of `size` bytes each.
void ev_py_shuffle(ev_mt_t *r, void *x, size_t n, size_t size);
// sample(range(n), k) into out[k] (the indices sample(pop, k) would take
// from any population of n items). 0, or -1 when k > n or memory runs out.
int ev_py_sample(ev_mt_t *r, int64_t n, int k, int64_t *out);
// numpy legacy randint(low, high): int64 in [low, high).
int64_t ev_np_randint(ev_mt_t *r, int64_t low, int64_t high);
// A uuid4 string from getrandbits(128) (str(uuid.UUID(int=..., version=4))),
// out has room for 37 bytes.
void ev_py_uuid4(ev_mt_t *r, char *out);
