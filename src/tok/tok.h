// Byte-level BPE tokenizer (GPT-2 family: SmolLM2, Llama 3, Qwen2/3) and chat
// templates. Loaded from GGUF `tokenizer.ggml.*` metadata or from Hugging Face
// tokenizer.json (+ tokenizer_config.json); both fill the same tok_t, which can
// be written back as HF files (tok_write_hf).
//
// Encoding: added tokens are cut out of the text first (longest match at the
// leftmost position, never split); the rest goes through the pre-tokenizer
// regex passes (PCRE2, UTF + UCP), the GPT-2 byte->unicode mapping and BPE by
// merge rank. Same ids as Hugging Face `tokenizers` for the same tokenizer.json
// (checked against tests/fixtures/tok/smollm2_ids.json).
//
// Thread safety: a loaded tok_t may be shared by threads for encode/decode/
// chat rendering (the word cache inside is guarded by a mutex); loading,
// tok_set_chat_template and tok_free need exclusive access.
#pragma once
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "io/gguf.h"

#ifdef __cplusplus
extern "C" {
#endif

// Token types, as GGUF tokenizer.ggml.token_type.
enum { TOK_NORMAL = 1, TOK_UNKNOWN = 2, TOK_CONTROL = 3, TOK_USER = 4, TOK_UNUSED = 5, TOK_BYTE = 6 };

// Pre-tokenizer families (formats.md §2.6). TOK_PRE_CUSTOM: regex passes taken
// from a tokenizer.json that matches none of the known ones.
typedef enum { TOK_PRE_GPT2 = 0, TOK_PRE_SMOLLM, TOK_PRE_LLAMA3, TOK_PRE_QWEN2, TOK_PRE_CUSTOM } tok_pre_t;

// Chat template families recognised from the template text.
typedef enum { TOK_CHAT_NONE = 0, TOK_CHAT_UNKNOWN, TOK_CHAT_CHATML, TOK_CHAT_LLAMA3 } tok_chat_t;

// Encode flags.
enum {
    TOK_SPECIAL = 1, // match special (control) tokens in the text; else they are ordinary text
    TOK_ADD_BOS = 2, // prepend BOS / append EOS when the tokenizer says so (add_bos_token, add_eos_token)
};
// Decode flags.
enum { TOK_SKIP_SPECIAL = 1 }; // drop control tokens instead of rendering their text

#define TOK_MAX_PASSES 4

// Word cache: pre-tokenized piece -> ids (open addressing; see tok.c).
typedef struct {
    uint32_t *slot; // index+1 into ent, 0 = empty
    uint32_t cap;   // power of two
    uint32_t n;
    struct tok_cache_ent *ent;
    char *keys;
    size_t keys_len, keys_cap;
    int32_t *ids;
    size_t ids_len, ids_cap;
    pthread_mutex_t mu;
} tok_cache_t;

typedef struct {
    // Vocabulary: token i's text (byte-level form for normal tokens) is
    // blob[off[i] .. off[i]+len[i]); dec_* is what it decodes to (bytes).
    int n_vocab;
    char *blob;
    uint32_t *off, *len;
    char *dec;
    uint32_t *dec_off, *dec_len;
    uint8_t *type;  // TOK_NORMAL, TOK_CONTROL, ...
    uint32_t *vmap; // vocab hash: slot -> id+1 (0 empty)
    uint32_t vmap_cap;

    // Merges in rank order (ids of the left and right parts); pair hash.
    int n_merges;
    int32_t *merge_l, *merge_r, *merge_res; // res: id of l+r
    uint64_t *mmap_key;                     // (l << 32 | r) + 1, 0 empty
    uint32_t *mmap_val;                     // rank
    uint32_t mmap_cap;
    int ignore_merges; // a piece that is a whole vocab token is not merged (Llama 3)

    int32_t byte_tok[256]; // id of the single-byte token for each byte, -1 if absent

    // Added tokens (matched in raw text before pre-tokenisation), sorted by
    // first byte then decreasing length; special = control (only with TOK_SPECIAL).
    int n_added;
    int32_t *added;       // ids
    int added_first[257]; // added[added_first[b] .. added_first[b+1]) start with byte b

    // Special ids (-1 when absent) and behaviour.
    int32_t bos, eos, unk, pad, eot, eom;
    int add_bos, add_eos;
    int unk_model; // the BPE model has an unk token (HF model.unk_token); else unknown bytes are dropped

    // Pre-tokenizer: each regex pass splits every piece of the previous one
    // (matches and the gaps between them are both pieces, HF "Isolated").
    tok_pre_t pre;
    char pre_name[32]; // GGUF tokenizer.ggml.pre or the family name
    int n_pass;
    char *pass_src[TOK_MAX_PASSES];
    void *pass_re[TOK_MAX_PASSES]; // pcre2_code_8 *

    // tokenizer_config.json data, kept for tok_write_hf.
    char *chat_template;
    tok_chat_t chat;
    char *chat_system;        // default system prompt injected by the template (NULL: none)
    int chat_date;            // Llama 3.1+: "Cutting Knowledge Date" system header
    int64_t model_max_length; // 0 = unknown
    char tokenizer_class[64];

    tok_cache_t cache;
    int loaded;
} tok_t;

// Loaders. tok_load_gguf needs tokenizer.ggml.model = gpt2 (SentencePiece
// `llama` is ERR_UNSUP). tok_load_json: tokenizer_config_path may be NULL.
int tok_load_gguf(tok_t *t, const gguf_t *g);
int tok_load_json(tok_t *t, const char *tokenizer_json_path, const char *tokenizer_config_path);
void tok_free(tok_t *t);

// Replaces the chat template (NULL removes it) and recognises its family.
int tok_set_chat_template(tok_t *t, const char *tmpl);

// Encoding. *ids is malloc'ed (caller frees); *n its length.
int tok_encode_ex(const tok_t *t, const char *text, size_t len, int flags, int32_t **ids, int *n);
// tok_encode_ex where a control token is matched (with TOK_SPECIAL) only when
// none of its bytes is marked in plain (plain[i] != 0: byte i came from a
// user, e.g. a chat message; NULL marks nothing). User text spelling
// "<|im_end|>" stays text: only the template's own bytes give control tokens.
int tok_encode_marked(const tok_t *t, const char *text, size_t len, int flags, const uint8_t *plain, int32_t **ids,
                      int *n);
// tok_encode = tok_encode_ex with TOK_ADD_BOS and, when parse_special, TOK_SPECIAL.
int tok_encode(const tok_t *t, const char *text, size_t len, int parse_special, int32_t **ids, int *n);

// Decoding to bytes (*out malloc'ed, NUL-terminated; *len without the NUL).
int tok_decode(const tok_t *t, const int32_t *ids, int n, int flags, char **out, size_t *len);

// Token lookups. tok_find: exact vocabulary text -> id, or -1.
int32_t tok_find(const tok_t *t, const char *text, size_t len);
const char *tok_text(const tok_t *t, int32_t id, size_t *len);  // vocabulary form (NULL if out of range)
const char *tok_bytes(const tok_t *t, int32_t id, size_t *len); // decoded bytes
int tok_is_special(const tok_t *t, int32_t id);                 // control token

// End-of-turn ids for the generation loop: eos, eot, eom and whichever of
// <|im_end|>, <|eot_id|>, <|eom_id|>, <|endoftext|> exist; deduplicated.
// Returns the count (at most cap are written).
int tok_eot_ids(const tok_t *t, int32_t *ids, int cap);

// Streaming decoder: fed one id at a time, hands out only complete UTF-8
// sequences; bytes that cannot become valid are replaced by U+FFFD as soon as
// that is known, a partial sequence is held until the next id or the flush.
typedef struct {
    const tok_t *t;
    int flags;
    uint8_t pend[4];
    int n_pend;
    char *buf;
    size_t cap;
} tok_stream_t;
void tok_stream_init(tok_stream_t *s, const tok_t *t, int flags);
// *out points into the stream's buffer, valid until the next call; *len may be 0.
int tok_stream_feed(tok_stream_t *s, int32_t id, const char **out, size_t *len);
int tok_stream_flush(tok_stream_t *s, const char **out, size_t *len);
void tok_stream_free(tok_stream_t *s);

// Chat. Roles are free text ("system", "user", "assistant", "tool").
typedef struct {
    const char *role;
    const char *content;
} tok_msg_t;
// Renders msgs with the tokenizer's chat template family (see tok_chat.c for
// what each family does). *out malloc'ed. No template or an unrecognised one:
// ERR_UNSUP naming it (the caller may fall back to plain text).
int tok_chat_render(const tok_t *t, const tok_msg_t *msgs, int n, int add_generation_prompt, char **out);
// The same, and *plain (malloc'ed, one byte per byte of *out): 1 where the
// byte comes from a message's role or content, 0 where the template wrote it;
// encode the text with tok_encode_marked so that message text never becomes
// control tokens.
int tok_chat_render_marked(const tok_t *t, const tok_msg_t *msgs, int n, int add_generation_prompt, char **out,
                           uint8_t **plain);

// Writes tokenizer.json, tokenizer_config.json and special_tokens_map.json into
// dir (created if missing), each atomically; out of memory: ERR_NOMEM and no file.
int tok_write_hf(const tok_t *t, const char *dir);
const char *tok_pre_name(tok_pre_t p);

// A stable 64-bit fingerprint of everything that decides how text encodes:
// vocabulary (texts and types), merges, bos / eos / unk and the add_bos /
// add_eos / unk_model / ignore_merges switches, pre-tokenizer passes (not the
// chat template, pad, eot or eom). Identical on every machine and for a GGUF
// and the HF files written from it; token shards record it (src/train/shard.h).
uint64_t tok_hash(const tok_t *t);

#ifdef __cplusplus
}
#endif
