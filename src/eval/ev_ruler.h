// RULER (NVIDIA/RULER, HEAD semantics, eval.md §1): the 13 synthetic
// long-context tasks, generated deterministically with the model's own
// tokenizer and scored by string match.
//
// Determinism: every task and length draws from fresh streams seeded with
// `seed` (Python random and numpy legacy, ev_pyrand.h), in the reference's
// order, so the same seed, data and tokenizer give the same prompt bytes.
// Fidelity (eval.md §1.11): the random draws, word lists, templates, length
// search and scoring follow the reference exactly; the essay haystack's
// sentence split uses a rule-based splitter instead of NLTK Punkt (whose
// English model is not available offline), so essay needle positions are
// distribution-faithful (level B) rather than byte-identical.
#pragma once
#include <stdint.h>

#include "eval/ev_model.h"
#include "eval/ev_text.h"

typedef enum { EV_GEN_NIAH, EV_GEN_VT, EV_GEN_CWE, EV_GEN_FWE, EV_GEN_QA } ev_ruler_gen_t;
typedef enum { EV_HAY_NOISE, EV_HAY_ESSAY, EV_HAY_NEEDLE } ev_hay_t;
typedef enum { EV_KEY_WORDS, EV_KEY_NUMBERS, EV_KEY_UUIDS } ev_keytype_t;

typedef struct {
    const char *name;
    ev_ruler_gen_t gen;
    int max_new; // tokens to generate
    int part;    // string_match_part (QA) instead of string_match_all
    ev_hay_t hay;
    ev_keytype_t k, v;
    int K, V, Q; // keys, values per key, queried keys (NIAH)
    int qa;      // 1 SQuAD, 2 HotpotQA
} ev_ruler_task_t;

extern const ev_ruler_task_t ev_ruler_tasks[];
extern const int ev_ruler_n_tasks;
const ev_ruler_task_t *ev_ruler_find(const char *name);

// One QA dataset as RULER reads it: the sorted distinct documents and the
// answerable questions with their gold / related document ids.
typedef struct {
    char **docs;
    int n_docs;
    struct ev_qa_item {
        char *query;
        ev_strs_t outputs;
        int *ctx, n_ctx;   // gold paragraph(s)
        int *more, n_more; // the other paragraphs of the same article (SQuAD)
    } * qas;
    int n_qas;
} ev_qa_t;

// What the generators read. Load what the chosen tasks need; a task whose
// data is missing fails with the message of the loader that was not called.
typedef struct {
    ev_strs_t adj, noun, verb; // wonderwords lists, each line right-stripped
    // NIAH word keys: sorted(set(adj + "-" + noun)), held as clusters of
    // adjectives (see ev_ruler.c) so that the 6 million strings are never built.
    struct ev_key_cluster {
        int64_t first; // index of its first key
        int64_t count;
        int adj;     // single-adjective cluster: its adjective (index into adj_sorted)
        char **strs; // multi-adjective cluster: its keys, sorted and distinct
    } * clusters;
    int n_clusters;
    char **adj_sorted, **noun_sorted;
    int n_adj_u, n_noun_u;
    int64_t n_keys;
    char **cwe_pool; // sorted(set(noun + adj + verb)) shuffled with Random(seed)
    int n_cwe;
    char *hay;        // the essay haystack, whitespace runs made one space
    size_t *hw_start; // its words (split on " ")
    uint32_t *hw_len;
    int64_t n_hw;
    ev_qa_t squad, hotpot;
    int have_words, have_hay, have_squad, have_hotpot;
    uint64_t seed;
} ev_ruler_data_t;

// The wonderwords folder (adjectivelist.txt, nounlist.txt, verblist.txt).
int ev_ruler_load_words(ev_ruler_data_t *d, const char *dir, uint64_t seed);
// The essay haystack: a folder's .txt files sorted by name and concatenated
// without separator (RULER's PaulGrahamEssays), or one text file.
int ev_ruler_load_haystack(ev_ruler_data_t *d, const char *path);
// SQuAD v2.0 dev JSON (qa_1), HotpotQA dev distractor JSON (qa_2).
int ev_ruler_load_squad(ev_ruler_data_t *d, const char *path);
int ev_ruler_load_hotpot(ev_ruler_data_t *d, const char *path);
void ev_ruler_data_free(ev_ruler_data_t *d);
// The i-th NIAH word key (0 <= i < n_keys) into out (cap bytes).
void ev_ruler_word_key(const ev_ruler_data_t *d, int64_t i, char *out, size_t cap);

// One generated sample (RULER's jsonl fields).
typedef struct {
    char *input;         // the prompt before the answer prefix
    char *answer_prefix; // the rest of the prompt; prompt = input + answer_prefix
    ev_strs_t outputs;   // gold strings
    int length;          // tok(prompt) + max_new
    int n_haystack;      // the haystack size it was built with (sentences, words, documents...)
} ev_ruler_sample_t;

typedef struct {
    const tok_t *tok; // counts tokens (no special tokens added; special tokens in the text matched)
    int max_len;      // the target sequence length (prompt + generation)
    int n_samples;
    uint64_t seed;
} ev_ruler_cfg_t;

// Generates n_samples samples of a task at one length into out[0..n_samples).
int ev_ruler_generate(const ev_ruler_data_t *d, const ev_ruler_task_t *t, const ev_ruler_cfg_t *cfg,
                      ev_ruler_sample_t *out);
void ev_ruler_sample_free(ev_ruler_sample_t *s);

// RULER's postprocessing of a prediction (strip, control characters to "\n",
// strip) in place, and the per-sample scores in [0, 1]: the fraction of gold
// strings contained in the prediction (string_match_all), or whether any is
// (string_match_part), both case-insensitive.
void ev_ruler_postprocess(char *pred);
double ev_ruler_match_all(const char *pred, char *const *refs, int n);
double ev_ruler_match_part(const char *pred, char *const *refs, int n);
