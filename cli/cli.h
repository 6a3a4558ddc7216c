// hylo's command line: one file per subcommand, a tiny shared option parser.
#pragma once
#include <stdint.h>

#include "backend/backend.h"
#include "io/weights.h"
#include "model/model.h"
#include "tok/tok.h"

// Prints "hylo: error: <err_msg()>" and returns the exit status for an ERR_* code:
// 2 for bad input / unsupported, 1 for runtime failures.
int cli_fail(int rc);
// Usage error: prints "hylo: error: <msg>" plus a hint to --help; returns 2.
int cli_usage(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

// Option scanning: `cli_opt(cmd, argc, argv, &i, "--temp", &val)` matches
// argv[i] as "--temp VALUE" or "--temp=VALUE", advancing i past the value: 1
// when it matched, 0 when it did not, ERR_INPUT with the message set when the
// value is missing (the caller returns it, as for cli_int). Flags without
// value: cli_flag.
int cli_opt(const char *cmd, int argc, char **argv, int *i, const char *name, const char **val);
int cli_flag(char **argv, int i, const char *name);
// Numeric option values: 0, or ERR_INPUT with the message set (the caller
// returns it; the command then exits through cli_fail with status 2).
int cli_int(const char *cmd, const char *name, const char *s, long lo, long hi, long *out);
int cli_float(const char *cmd, const char *name, const char *s, double lo, double hi, double *out);
int cli_wants_help(int argc, char **argv);

// The tokenizer that belongs with an open model source: the GGUF's metadata,
// or the folder's tokenizer.json + tokenizer_config.json.
int cli_load_tokenizer(const wsrc_t *src, tok_t *tok);
// The model's weights at path onto be and, when tok is not NULL, its
// tokenizer, from one open source: a GGUF is opened and parsed once. On
// failure neither is left loaded (m->be is NULL). Runs over the weights take
// CLI_RUN_ARENA bytes of activation arena (model_run_create). flags: 0 or
// MODEL_QUANT (model.h: inference on the stored block formats), which on a
// GPU backend applies only with CLI_GPU_BLOCKS as well (--gpu-blocks): which
// of the two decodes faster there depends on the model (docs/PERFORMANCE.md,
// runs 35-36), so a GPU dequantises to bf16 by default.
int cli_load_model(const char *path, be_t *be, model_t *m, tok_t *tok, int flags);
enum { CLI_GPU_BLOCKS = 1 << 16 };
#define CLI_RUN_ARENA ((size_t)1 << 30)
// The tokenizer to write beside a checkpoint made from an open source (export,
// convert): from the open GGUF's metadata or the folder's tokenizer files. 1
// when loaded; 0 when the folder has none (a warning says the output is written
// without tokenizer files); or an error.
int cli_source_tokenizer(const wsrc_t *src, tok_t *tok);
// A backend by name with a scratch arena sized for it: the CUDA chunked
// recurrences and fused losses take their temporaries from the arena (up to a
// few hundred MiB at long contexts); the CPU ops fall back to the heap.
int cli_backend(const char *device, be_t **be);
// "--dtype" values f32 | bf16 | f16 -> safetensors dtype, or -1.
int cli_dtype(const char *s);
// --quantize q8_0|q4_0|q4_1 -> the checkpoint dtype CKPT_QUANT + type (model/checkpoint.h), -1 otherwise.
int cli_quant_dtype(const char *s);

int cmd_info(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_export(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_compare(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_data(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_serve(int argc, char **argv);
