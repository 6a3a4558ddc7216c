// One evaluation run: the tasks asked for, on one model, into one JSON object
// (the "result" that reports are drawn from). hylo eval calls it for the model
// and, with --against, for the teacher.
#pragma once
#include <cjson/cJSON.h>
#include <stdint.h>

#include "eval/ev_data.h"
#include "eval/ev_model.h"

#define EV_MAX_ITEMS 64

typedef struct {
    // what to run
    const char *short_tasks[EV_MAX_ITEMS]; // lm-eval tasks (ev_tasks names)
    int n_short;
    const char *ruler_tasks[EV_MAX_ITEMS]; // RULER tasks (ev_ruler_tasks names)
    int n_ruler;
    int ppl; // perplexity on the text files

    // data
    ev_data_t data;
    char file_task[EV_MAX_ITEMS][32]; // --file TASK=PATH: the task names
    const char *file_path[EV_MAX_ITEMS];
    int n_files;
    const char *haystack, *words, *squad, *hotpot; // RULER inputs by flag (NULL: from the data folder)
    const char *texts[EV_MAX_ITEMS];               // perplexity inputs (files or folders of .txt)
    int n_texts;

    // settings
    const char *bos; // none | auto | always
    int limit;       // short tasks: first N documents (0 = all)
    int max_gen;     // GSM8K max_gen_toks
    int lengths[16], n_lengths;
    int ruler_samples;
    int ruler_max_new; // caps the tokens generated per RULER sample (0 = each task's own; prompts unchanged)
    uint64_t seed;
    int ppl_max_len;            // rolling window length (0 = the model length)
    int ppl_window, ppl_stride; // strided variant (stride 0 = off)
    int generate_only;          // RULER: write the samples, do not run the model
    const char *samples_dir;    // per-item outputs (NULL: none)
} ev_run_cfg_t;

// Runs everything cfg asks for on lm and adds the sections "tasks", "ruler",
// "perplexity" (those that ran) to out.
int ev_run(ev_lm_t *lm, const ev_run_cfg_t *cfg, cJSON *out);

// The settings as a JSON object (for the result's "settings").
cJSON *ev_run_settings(const ev_run_cfg_t *cfg);
