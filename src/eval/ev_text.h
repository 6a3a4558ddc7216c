// Text helpers of the evaluation module: the Python string semantics the
// reference scorers rely on (str.strip / str.lower / str.isspace on Unicode
// code points), reading word lists and JSONL files, formatted appends to a
// strbuf_t, and the sentence splitter the essay haystack uses.
#pragma once
#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "base/strbuf.h"

// Python's str.isspace() for one code point.
int ev_is_space(uint32_t cp);
// Byte offsets of s[0..n) without leading / trailing Unicode whitespace
// (Python str.strip()): the stripped text is s[*b .. *e).
void ev_strip_span(const char *s, size_t n, size_t *b, size_t *e);
// A malloc'ed copy of s[0..n) stripped; NULL when out of memory.
char *ev_strip_dup(const char *s, size_t n);
// Python str.lower() (simple case mapping, code point by code point), malloc'ed.
char *ev_lower_dup(const char *s);
// Number of Unicode code points of s[0..n) (Python len(str)).
int64_t ev_codepoints(const char *s, size_t n);
// len(re.split(r"\s+", s)): whitespace runs + 1, counting the empty pieces that
// leading and trailing whitespace make (lm-eval's word count).
int64_t ev_count_words(const char *s, size_t n);

// Replaces every occurrence of `from` in *s by `to` (Python str.replace); 0 or ERR_NOMEM.
int ev_replace_all(char **s, const char *from, const char *to);

// A list of malloc'ed strings.
typedef struct {
    char **s;
    int n, cap;
} ev_strs_t;
int ev_strs_add(ev_strs_t *l, const char *s, size_t n);
void ev_strs_free(ev_strs_t *l);

// The lines of a text file, each right-stripped (Python line.rstrip()); empty
// lines dropped. `what` names the file's contents in errors.
int ev_read_lines(const char *path, ev_strs_t *out);
// The JSON objects of a JSONL file (one per non-empty line); an unparsable
// line is ERR_INPUT naming the file and line.
int ev_read_jsonl(const char *path, cJSON ***items, int *n);
void ev_free_jsonl(cJSON **items, int n);

// Sentence boundaries of text (NLTK Punkt's sent_tokenize stands in the
// reference; Punkt's English parameters are not available offline, so this is
// a rule-based splitter: a sentence ends at . ? or ! (after any closing quotes
// or brackets) followed by whitespace, except after a known abbreviation or a
// single-letter initial). Sentences are the stripped spans between boundaries:
// starts and ends in bytes, malloc'ed arrays of *n entries.
int ev_split_sentences(const char *text, size_t n, size_t **starts, size_t **ends, int *count);

// Python round(x, 2) on a binary double (correctly rounded, ties to even on
// the exact binary value, as glibc's printf does).
double ev_round2(double x);
