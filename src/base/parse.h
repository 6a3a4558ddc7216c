// Whole-string parsing of the numbers and index lists that the command line
// and the recipe files give as text, so both accept and refuse the same
// spellings. The functions only answer yes or no: the caller names the option
// or key in its own error message.
#pragma once
#include <stdint.h>

// 1 when all of s is a decimal integer in [lo, hi] (stored in *out), else 0.
int parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out);
// 1 when all of s is a finite number in [lo, hi] (stored in *out), else 0.
int parse_double(const char *s, double lo, double hi, double *out);
// Integers in [lo, hi] separated by commas, "0,3,6", optionally in brackets,
// "[0, 3, 6]" (spaces around items allowed; "[]" is the empty list): the
// count stored in out (at most cap; strlen(s) / 2 + 1 is always enough), or -1
// when s is not such a list.
int parse_int_list(const char *s, int lo, int hi, int *out, int cap);
