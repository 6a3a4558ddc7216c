// Where evaluation data comes from. Nothing is bundled with hylo: every task
// reads a file given by flag, or found under a data folder (--data DIR, or
// ../shared/data when that exists, which is then said on stderr). A missing
// file is an error naming what was expected, where it was looked for and where
// such a file can come from.
#pragma once
#include <stddef.h>

typedef struct {
    char root[1024]; // the data folder, "" when there is none
    int defaulted;   // root is ../shared/data, taken because no --data was given
} ev_data_t;

// flag: the --data value, or NULL.
int ev_data_init(ev_data_t *d, const char *flag);
// The path of one input: `override` (a --file / --haystack ... value) when
// given (it must exist), else <root>/<rel> (a file, or a folder when rel ends
// in '/'); else ERR_INPUT: "<task>: <path> not found: expected <what> (<origin>)".
int ev_data_path(const ev_data_t *d, const char *task, const char *override, const char *rel, const char *what,
                 const char *origin, char *out, size_t cap);
