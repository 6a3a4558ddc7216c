// Training text -> token shard: the inputs of `hylo data` (.txt, .jsonl,
// .jsonl.zst), one document each, encoded in parallel and written in input
// order (train/shard.h).
//
// Documents:
//  - .txt: the whole file is one document; with split_lines, every line that
//    is not blank (empty or spaces and tabs only) is one, without its newline.
//  - .jsonl / .jsonl.zst: one JSON object per line (blank lines are skipped):
//      {"text": "..."}  plain text, encoded with special tokens NOT parsed
//                       (user text never becomes control tokens);
//      {"messages": [{"role": "...", "content": "..."}, ...]}  a conversation,
//                       rendered with the tokenizer's chat template (no
//                       generation prompt) and encoded with special tokens
//                       parsed (the template inserts them).
//    Other fields are ignored; a line with both "text" and "messages" is
//    malformed (which one is meant is not guessed).
//  - A text document starts with BOS when the tokenizer adds one (add_bos);
//    a conversation has what its template renders. Every document ends with
//    the tokenizer's EOS id.
// Loss mask: 1 on every token, except with assistant_only, where a
// conversation has 1 only on tokens that overlap an assistant message's
// rendered content or the end-of-turn token closing it (ChatML <|im_end|>,
// Llama 3 <|eot_id|>); its other tokens and its EOS are 0. Text documents stay
// all 1.
// Malformed input (bad JSON, no text/messages, a field of the wrong type, bad
// UTF-8, an empty document) is reported as "FILE:LINE: what is wrong" and the
// document skipped (counted), or, with strict, is the error.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "tok/tok.h"

typedef struct {
    int split_lines;    // .txt: one document per line that is not blank
    int assistant_only; // conversations: loss only on assistant content + end of turn
    int strict;         // a malformed document is an error, not a skip
    int threads;        // encoding threads (0: OpenMP's default)
} data_build_cfg_t;

typedef struct {
    int64_t files, docs, tokens, loss_tokens, skipped;
    int64_t bytes; // text read (after decompression)
    double seconds;
} data_build_stats_t;

// Every input file: files as given, folders expanded into every .txt, .jsonl
// and .jsonl.zst under them (recursively, sorted by path). Any other file named
// on the command line is an error. *files: malloc'ed array of malloc'ed paths.
int data_list_inputs(const char *const *inputs, int n_inputs, char ***files, int *n_files);
void data_free_list(char **files, int n_files);

// One encoded document: ids [n] and mask [n] (mask NULL = all in the loss).
typedef struct {
    int32_t *ids;
    uint8_t *mask;
    int64_t n;
} data_doc_t;
void data_doc_free(data_doc_t *d);

// The document of one JSONL line (without its newline). Returns 0 with d
// filled, 1 when the line is malformed (why[0..cap) says what is wrong), or
// a negative error (out of memory, a tokenizer without a chat template).
int data_doc_json(const tok_t *t, const char *line, size_t len, int assistant_only, data_doc_t *d, char *why,
                  size_t cap);
// The document of a plain text. 1 when malformed as above; *bad_line is then
// the 1-based line of text the problem is on.
int data_doc_text(const tok_t *t, const char *text, size_t len, data_doc_t *d, char *why, size_t cap,
                  int64_t *bad_line);

// Encodes every input into the shard out_path (written to a temporary name and
// renamed when complete; nothing is left on failure). Malformed documents are
// reported through log_warn as "FILE:LINE: what is wrong (skipped)".
int data_build(const char *out_path, const tok_t *tok, const char *const *inputs, int n_inputs,
               const data_build_cfg_t *cfg, data_build_stats_t *st);
