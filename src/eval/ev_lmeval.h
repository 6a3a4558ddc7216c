// The short benchmarks scored as lm-evaluation-harness scores them (eval.md
// §2): multiple choice by log-likelihood (acc, acc_norm), LAMBADA last-word
// accuracy, GSM8K greedy generation with its two answer filters. Each task
// rebuilds lm-eval's prompt from the fields of the MosaicML JSONL copies in
// ../shared/data/eval (their own query strings differ from lm-eval's).
#pragma once
#include <cjson/cJSON.h>
#include <stdint.h>

#include "eval/ev_model.h"
#include "eval/ev_progress.h"

typedef enum { EV_MC = 0, EV_LASTWORD, EV_GEN } ev_kind_t;

// One document as lm-eval's requests: per choice i the context ctx[i] and the
// continuation cont[i] (target delimiter included); norm_len[i] is the choice
// text's length in code points without the delimiter (acc_norm). Multiple
// choice: every ctx[i] is the same string except for WinoGrande (one context
// per option, one shared continuation). LAMBADA: one choice, gold 0. GSM8K:
// ctx[0] is the prompt and gold_text the reference solution.
typedef struct {
    int n;
    char *ctx[8], *cont[8];
    int64_t norm_len[8];
    int gold;
    char *gold_text;
} ev_doc_t;

typedef struct {
    const char *name;   // lm-eval's task name
    const char *file;   // under the data folder
    const char *what;   // for errors: what the file must hold
    const char *origin; // for errors: where such a file comes from
    ev_kind_t kind;
    int norm;      // lm-eval reports acc_norm for it
    int max_items; // items in the full set (for reports)
    // Builds the document from one JSONL row; ERR_INPUT naming the field.
    int (*build)(const cJSON *row, ev_doc_t *d);
} ev_task_t;

extern const ev_task_t ev_tasks[];
extern const int ev_n_tasks;
const ev_task_t *ev_task_find(const char *name);
void ev_doc_free(ev_doc_t *d);

// Tokenizer flags for a BOS policy: "none" (lm-eval <= 0.4.9.1: no special
// tokens added), "auto" (the tokenizer's default, lm-eval >= 0.4.9.2),
// "always" (BOS prepended whatever the tokenizer says); special tokens in the
// text are matched, as Hugging Face tokenizers do. -1 for an unknown name.
int ev_bos_flags(const char *policy);
// Encodes one (context, continuation) pair as lm-eval's _encode_pair: trailing
// whitespace of the context moves to the continuation, the pair is encoded
// whole and split at the context's own token count. always_bos: prepend BOS
// to the context when the tokenizer has one and it is not there. An empty
// context becomes [prefix_id] and the continuation is encoded alone.
int ev_encode_pair(const tok_t *tok, int flags, int32_t prefix_id, const char *ctx, const char *cont, int32_t **ctx_ids,
                   int *n_ctx, int32_t **cont_ids, int *n_cont);
// Encodes text with the policy's flags (BOS prepended for "always").
int ev_encode(const tok_t *tok, int flags, const char *text, int32_t **ids, int *n);
enum { EV_TOK_ALWAYS_BOS = 1 << 8 }; // added to the tok flags by ev_bos_flags("always")

// lm-eval's decisions for one document: argmax of the log-likelihoods (acc)
// and of ll / norm_len (acc_norm), the first index among equals.
void ev_mc_decide(const double *ll, const int64_t *norm_len, int n, int *pred, int *pred_norm);

// GSM8K answer filters and comparison (eval.md §2.2.8). Each returns a
// malloc'ed string ("[invalid]" when nothing matched).
char *ev_gsm8k_strict(const char *gen);
char *ev_gsm8k_flexible(const char *gen);
// exact_match with the task's ignore regexes and ignore_case: 1 or 0 (-1: out of memory).
int ev_gsm8k_match(const char *pred, const char *gold);

typedef struct {
    int n;         // documents scored
    int truncated; // documents whose input the model saw left-truncated
    double acc, acc_stderr, acc_norm, acc_norm_stderr;
    double perplexity;                      // LAMBADA: exp(-mean ll)
    double em_strict, em_strict_stderr;     // GSM8K
    double em_flexible, em_flexible_stderr; // GSM8K
    int64_t gen_tokens;                     // GSM8K: tokens generated
    double seconds;
} ev_task_result_t;

typedef struct {
    int flags;                // tokenizer flags (ev_bos_flags)
    int limit;                // first N documents (0 = all)
    int max_gen;              // GSM8K max_gen_toks (256)
    const char *samples_path; // per-document JSONL written here (NULL: none)
} ev_task_cfg_t;

// Scores a task over rows[0..n_rows) (or the first cfg->limit).
int ev_task_run(ev_lm_t *lm, const ev_task_t *t, cJSON **rows, int n_rows, const ev_task_cfg_t *cfg,
                ev_task_result_t *res);

// mean and lm-eval's stderr (sample std with n - 1, over sqrt(n); 0 for n < 2)
void ev_mean_stderr(const double *x, int n, double *mean, double *stderr_);
