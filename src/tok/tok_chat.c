// Chat templates. Not a Jinja engine: the template text is only used to
// recognise its family, which is then rendered here in C.
//
//  - ChatML (SmolLM2, Qwen2/2.5/3): "<|im_start|>" role "\n" content "<|im_end|>\n"
//    per message, generation prompt "<|im_start|>assistant\n". When the template
//    holds a literal default system prompt ("<|im_start|>system\n" + plain
//    text + "<|im_end|>", as SmolLM2's and Qwen2.5's do), it is injected before
//    the first message when that message is not a system message. Not
//    rendered: tools, Qwen3's stripping of <think> blocks from earlier
//    assistant turns, and Qwen3's enable_thinking switch (left undefined, which
//    is the template's default: no empty <think></think> is added).
//  - Llama 3 (<|start_header_id|> headers): BOS text, then per message
//    "<|start_header_id|>" role "<|end_header_id|>\n\n" trim(content) "<|eot_id|>",
//    generation prompt "<|start_header_id|>assistant<|end_header_id|>\n\n".
//    Llama 3.1+ templates ("Cutting Knowledge Date") first get the system
//    header with the template's fixed date fallback "26 Jul 2024" (what the
//    template renders when no strftime_now is provided) and the first system
//    message, trimmed, as its text. Tools are not rendered. trim() strips ASCII
//    whitespace only.
//  Roles and contents are the messages' text: tok_chat_render_marked marks
//  their bytes so that tok_encode_marked never makes control tokens of them.
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/strbuf.h"
#include "tok/tok_internal.h"

// The literal text after "<|im_start|>system" + newline up to "<|im_end|>",
// when it is plain text in a Jinja string literal (no quotes, no expressions).
// The newline may be a real one or the escape "\n".
static char *chatml_default_system(const char *s) {
    static const char tag[] = "<|im_start|>system";
    for (const char *p = strstr(s, tag); p; p = strstr(p + 1, tag)) {
        const char *q = p + sizeof tag - 1;
        if (*q == '\n')
            q++;
        else if (q[0] == '\\' && q[1] == 'n')
            q += 2;
        else
            continue;
        const char *end = strstr(q, "<|im_end|>");
        if (!end || end == q) continue;
        if (memchr(q, '\'', (size_t)(end - q)) || memchr(q, '"', (size_t)(end - q)) ||
            memchr(q, '{', (size_t)(end - q)) || memchr(q, '}', (size_t)(end - q)))
            continue;
        char *out = malloc((size_t)(end - q) + 1);
        if (!out) return NULL;
        size_t k = 0;
        for (const char *c = q; c < end; c++) { // undo Jinja string escapes
            if (c[0] == '\\' && c + 1 < end) {
                c++;
                out[k++] = *c == 'n' ? '\n' : *c == 't' ? '\t' : *c;
            } else {
                out[k++] = *c;
            }
        }
        out[k] = 0;
        return out;
    }
    return NULL;
}

void tok_chat_detect(tok_t *t) {
    free(t->chat_system);
    t->chat_system = NULL;
    t->chat_date = 0;
    const char *s = t->chat_template;
    if (!s || !*s) {
        t->chat = TOK_CHAT_NONE;
        return;
    }
    if (strstr(s, "<|start_header_id|>") && strstr(s, "<|end_header_id|>") && strstr(s, "<|eot_id|>")) {
        t->chat = TOK_CHAT_LLAMA3;
        t->chat_date = strstr(s, "Cutting Knowledge Date") != NULL;
    } else if (strstr(s, "<|im_start|>") && strstr(s, "<|im_end|>")) {
        t->chat = TOK_CHAT_CHATML;
        t->chat_system = chatml_default_system(s);
    } else {
        t->chat = TOK_CHAT_UNKNOWN;
    }
}

int tok_set_chat_template(tok_t *t, const char *tmpl) {
    free(t->chat_template);
    t->chat_template = NULL;
    if (tmpl && !(t->chat_template = tok_strndup(tmpl, strlen(tmpl))))
        return err_set(ERR_NOMEM, "tok_set_chat_template: out of memory");
    tok_chat_detect(t);
    return 0;
}

// ---------------------------------------------------------------------------

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

// The rendered text and, byte for byte, whether it came from a message (1)
// or from the template (0).
typedef struct {
    strbuf_t text, plain;
} render_t;

static void put(render_t *r, const char *s, size_t n, int plain) {
    strbuf_putn(&r->text, s, n);
    size_t at = r->plain.n;
    strbuf_putn(&r->plain, s, n); // the right length; the bytes are set below
    if (!r->plain.oom) memset(r->plain.s + at, plain, n);
}
static void tmpl(render_t *r, const char *s) { put(r, s, strlen(s), 0); }
static void msg(render_t *r, const char *s) { put(r, s, strlen(s), 1); }

static void msg_trim(render_t *r, const char *s) {
    size_t n = strlen(s);
    while (n && is_ws(*s))
        s++, n--;
    while (n && is_ws(s[n - 1]))
        n--;
    put(r, s, n, 1);
}

int tok_chat_render_marked(const tok_t *t, const tok_msg_t *msgs, int n, int add_generation_prompt, char **out,
                           uint8_t **plain) {
    *out = NULL;
    if (plain) *plain = NULL;
    if (t->chat == TOK_CHAT_NONE) return err_set(ERR_UNSUP, "tokenizer has no chat template");
    if (t->chat == TOK_CHAT_UNKNOWN)
        return err_set(ERR_UNSUP, "chat template not recognised (neither ChatML nor Llama 3): \"%.80s%s\"",
                       t->chat_template, strlen(t->chat_template) > 80 ? "..." : "");
    for (int i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].content)
            return err_set(ERR_INPUT, "chat: messages[%d]: %s is NULL", i, msgs[i].role ? "content" : "role");
    render_t r = {{0}, {0}};
    tmpl(&r, ""); // an empty conversation still yields a string
    if (t->chat == TOK_CHAT_CHATML) {
        if (t->chat_system && n > 0 && strcmp(msgs[0].role, "system") != 0) {
            tmpl(&r, "<|im_start|>system\n");
            tmpl(&r, t->chat_system);
            tmpl(&r, "<|im_end|>\n");
        }
        for (int i = 0; i < n; i++) {
            tmpl(&r, "<|im_start|>");
            msg(&r, msgs[i].role);
            tmpl(&r, "\n");
            msg(&r, msgs[i].content);
            tmpl(&r, "<|im_end|>\n");
        }
        if (add_generation_prompt) tmpl(&r, "<|im_start|>assistant\n");
    } else { // TOK_CHAT_LLAMA3
        size_t bl = 0;
        const char *bos = t->bos >= 0 ? tok_text(t, t->bos, &bl) : NULL;
        if (bos)
            put(&r, bos, bl, 0);
        else
            tmpl(&r, "<|begin_of_text|>");
        int first = 0;
        if (t->chat_date) {
            tmpl(&r, "<|start_header_id|>system<|end_header_id|>\n\n");
            tmpl(&r, "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n");
            if (n > 0 && !strcmp(msgs[0].role, "system")) {
                msg_trim(&r, msgs[0].content);
                first = 1;
            }
            tmpl(&r, "<|eot_id|>");
        }
        for (int i = first; i < n; i++) {
            tmpl(&r, "<|start_header_id|>");
            msg(&r, msgs[i].role);
            tmpl(&r, "<|end_header_id|>\n\n");
            msg_trim(&r, msgs[i].content);
            tmpl(&r, "<|eot_id|>");
        }
        if (add_generation_prompt) tmpl(&r, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    }
    if (r.text.oom || r.plain.oom) {
        free(r.text.s);
        free(r.plain.s);
        return err_set(ERR_NOMEM, "chat: out of memory rendering %d messages", n);
    }
    *out = r.text.s;
    if (plain)
        *plain = (uint8_t *)r.plain.s;
    else
        free(r.plain.s);
    return 0;
}

int tok_chat_render(const tok_t *t, const tok_msg_t *msgs, int n, int add_generation_prompt, char **out) {
    return tok_chat_render_marked(t, msgs, n, add_generation_prompt, out, NULL);
}
