#include "eval/ev_lmeval.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <math.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/fs.h"
#include "base/strbuf.h"
#include "base/timer.h"
#include "eval/ev_text.h"

// ---- documents from the JSONL rows ------------------------------------------

static const char *str_field(const cJSON *row, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(row, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int int_field(const cJSON *row, const char *key, int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(row, key);
    if (!cJSON_IsNumber(v)) return err_set(ERR_INPUT, "field '%s': expected an integer", key);
    *out = v->valueint;
    return 0;
}

static char *cat2(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    char *s = malloc(la + lb + 1);
    if (!s) return NULL;
    memcpy(s, a, la);
    memcpy(s + la, b, lb + 1);
    return s;
}

static char *catn(const char *a, size_t la, const char *b) {
    size_t lb = strlen(b);
    char *s = malloc(la + lb + 1);
    if (!s) return NULL;
    memcpy(s, a, la);
    memcpy(s + la, b, lb + 1);
    return s;
}

// Fills choices i < n: ctx[i] = ctx (one shared copy per choice), cont[i] = " " + choice.
static int set_choices(ev_doc_t *d, char *ctx, const char *const *choices, int n) {
    if (!ctx) return err_set(ERR_NOMEM, "out of memory");
    if (n < 1 || n > 8) {
        free(ctx);
        return err_set(ERR_INPUT, "field 'choices': expected 1 to 8 strings, found %d", n);
    }
    d->n = n;
    for (int i = 0; i < n; i++) {
        d->ctx[i] = i ? strdup(ctx) : ctx;
        d->cont[i] = cat2(" ", choices[i]);
        d->norm_len[i] = ev_codepoints(choices[i], strlen(choices[i]));
        if (!d->ctx[i] || !d->cont[i]) return err_set(ERR_NOMEM, "out of memory");
    }
    return 0;
}

// The "choices" array and "gold" index of a row.
static int choices_gold(const cJSON *row, const char **ch, int *n, int *gold) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(row, "choices");
    if (!cJSON_IsArray(a)) return err_set(ERR_INPUT, "field 'choices': expected an array of strings");
    *n = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, a) {
        if (!cJSON_IsString(c) || *n >= 8) return err_set(ERR_INPUT, "field 'choices': expected up to 8 strings");
        ch[(*n)++] = c->valuestring;
    }
    TRY(int_field(row, "gold", gold));
    if (*gold < 0 || *gold >= *n)
        return err_set(ERR_INPUT, "field 'gold': %d is not a choice index (%d choices)", *gold, *n);
    return 0;
}

static int has_prefix(const char *s, const char *p) { return !strncmp(s, p, strlen(p)); }

// ARC: "Question: {question}\nAnswer:" (the file's query is "Question: {question}").
static int build_arc(const cJSON *row, ev_doc_t *d) {
    const char *q = str_field(row, "query"), *ch[8];
    int n;
    if (!q || !has_prefix(q, "Question: ")) return err_set(ERR_INPUT, "field 'query': expected \"Question: ...\"");
    TRY(choices_gold(row, ch, &n, &d->gold));
    return set_choices(d, cat2(q, "\nAnswer:"), ch, n);
}

// OpenBookQA: the question stem as it is.
static int build_obqa(const cJSON *row, ev_doc_t *d) {
    const char *q = str_field(row, "query"), *ch[8];
    int n;
    if (!q) return err_set(ERR_INPUT, "field 'query': expected a string");
    TRY(choices_gold(row, ch, &n, &d->gold));
    return set_choices(d, strdup(q), ch, n);
}

// PIQA: "Question: {goal}\nAnswer:" (the file's query is "Question: {goal}\n").
static int build_piqa(const cJSON *row, ev_doc_t *d) {
    const char *q = str_field(row, "query"), *ch[8];
    int n;
    size_t l = q ? strlen(q) : 0;
    if (!q || !has_prefix(q, "Question: ") || !l || q[l - 1] != '\n')
        return err_set(ERR_INPUT, "field 'query': expected \"Question: ...\\n\"");
    TRY(choices_gold(row, ch, &n, &d->gold));
    return set_choices(d, cat2(q, "Answer:"), ch, n);
}

// COPA: premise without its final period + " because" / " therefore"; the
// choices with a lower-case first letter (the file's query is
// "{premise without period}, because").
static int build_copa(const cJSON *row, ev_doc_t *d) {
    const char *q = str_field(row, "query"), *ch[8];
    int n;
    if (!q) return err_set(ERR_INPUT, "field 'query': expected a string");
    size_t l = strlen(q);
    const char *conn = NULL;
    if (l > 9 && !strcmp(q + l - 9, ", because"))
        conn = " because";
    else if (l > 11 && !strcmp(q + l - 11, ", therefore"))
        conn = " therefore";
    if (!conn)
        return err_set(ERR_INPUT, "field 'query': expected a premise ending in \", because\" or \", therefore\"");
    TRY(choices_gold(row, ch, &n, &d->gold));
    char *lowered[8] = {0};
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        if (!(lowered[i] = strdup(ch[i])))
            rc = err_set(ERR_NOMEM, "out of memory");
        else if (lowered[i][0] >= 'A' && lowered[i][0] <= 'Z')
            lowered[i][0] += 32;
    }
    if (rc == 0) rc = set_choices(d, catn(q, l - strlen(conn) - 1, conn), (const char *const *)lowered, n);
    for (int i = 0; i < n; i++)
        free(lowered[i]);
    return rc;
}

// Social IQa: "Q: {context} {question}\nA:", the answers as choices. The file's
// query is "Context: ...\nQuestion: ...\nChoices:\nA. ...\nB. ...\nAnswer:" and
// its choices are the letters; the answers are read back from the query.
static int build_siqa(const cJSON *row, ev_doc_t *d) {
    const char *q = str_field(row, "query");
    if (!q) return err_set(ERR_INPUT, "field 'query': expected a string");
    const char *lines[8];
    size_t lens[8];
    int nl = 0;
    for (const char *p = q; nl < 8;) {
        const char *e = strchr(p, '\n');
        lines[nl] = p, lens[nl] = e ? (size_t)(e - p) : strlen(p), nl++;
        if (!e) break;
        p = e + 1;
    }
    const char *ch[8];
    int n, gold;
    TRY(choices_gold(row, ch, &n, &gold));
    if (nl != 4 + n || !has_prefix(lines[0], "Context: ") || !has_prefix(lines[1], "Question: ") ||
        strncmp(lines[2], "Choices:", lens[2]) || strcmp(lines[nl - 1], "Answer:"))
        return err_set(ERR_INPUT, "field 'query': expected Context / Question / Choices / %d answers / Answer lines",
                       n);
    strbuf_t b = {0};
    strbuf_puts(&b, "Q: ");
    strbuf_putn(&b, lines[0] + 9, lens[0] - 9);
    strbuf_puts(&b, " ");
    strbuf_putn(&b, lines[1] + 10, lens[1] - 10);
    strbuf_puts(&b, "\nA:");
    char *answers[8] = {0};
    int rc = b.oom ? err_set(ERR_NOMEM, "out of memory") : 0;
    for (int i = 0; i < n && rc == 0; i++) {
        const char *l = lines[3 + i];
        if (lens[3 + i] < 3 || l[0] != 'A' + i || l[1] != '.' || l[2] != ' ')
            rc = err_set(ERR_INPUT, "field 'query': answer line %d should start with \"%c. \"", i + 1, 'A' + i);
        else if (!(answers[i] = strndup(l + 3, lens[3 + i] - 3)))
            rc = err_set(ERR_NOMEM, "out of memory");
    }
    d->gold = gold;
    if (rc == 0)
        rc = set_choices(d, b.s, (const char *const *)answers, n);
    else
        free(b.s);
    for (int i = 0; i < n; i++)
        free(answers[i]);
    return rc;
}

// BoolQ: "{passage}\nQuestion: {question}?\nAnswer:", choices no / yes. The
// file's query is "Passage: {passage}\nQuestion: {question}?".
static int build_boolq(const cJSON *row, ev_doc_t *d) {
    const char *q = str_field(row, "query"), *ch[8];
    int n;
    if (!q || !has_prefix(q, "Passage: ")) return err_set(ERR_INPUT, "field 'query': expected \"Passage: ...\"");
    const char *qq = NULL;
    for (const char *p = q; (p = strstr(p, "\nQuestion: ")); p++)
        qq = p;
    if (!qq) return err_set(ERR_INPUT, "field 'query': no \"\\nQuestion: \" line");
    TRY(choices_gold(row, ch, &n, &d->gold));
    if (n != 2 || strcmp(ch[0], "no") || strcmp(ch[1], "yes"))
        return err_set(ERR_INPUT, "field 'choices': expected [\"no\", \"yes\"]");
    return set_choices(d, cat2(q + 9, "\nAnswer:"), ch, n);
}

// WinoGrande (partial scoring): one context per option (the sentence up to the
// blank with the option filled in), the shared continuation " " + the rest.
static int build_winogrande(const cJSON *row, ev_doc_t *d) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(row, "context_options");
    const char *cont = str_field(row, "continuation");
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != 2 || !cont)
        return err_set(ERR_INPUT, "fields 'context_options' (2 strings) and 'continuation' expected");
    TRY(int_field(row, "gold", &d->gold));
    if (d->gold < 0 || d->gold > 1) return err_set(ERR_INPUT, "field 'gold': expected 0 or 1, found %d", d->gold);
    char *c = ev_strip_dup(cont, strlen(cont));
    if (!c) return err_set(ERR_NOMEM, "out of memory");
    d->n = 2;
    for (int i = 0; i < 2; i++) {
        const cJSON *o = cJSON_GetArrayItem(a, i);
        if (!cJSON_IsString(o)) {
            free(c);
            return err_set(ERR_INPUT, "field 'context_options': expected strings");
        }
        d->ctx[i] = strdup(o->valuestring);
        d->cont[i] = cat2(" ", c);
        d->norm_len[i] = ev_codepoints(o->valuestring, strlen(o->valuestring));
        if (!d->ctx[i] || !d->cont[i]) {
            free(c);
            return err_set(ERR_NOMEM, "out of memory");
        }
    }
    free(c);
    return 0;
}

// LAMBADA: the text without its last word, then " " + the last word.
static int build_lambada(const cJSON *row, ev_doc_t *d) {
    const char *ctx = str_field(row, "context"), *cont = str_field(row, "continuation");
    if (!ctx || !cont) return err_set(ERR_INPUT, "fields 'context' and 'continuation' expected");
    d->n = 1, d->gold = 0;
    d->ctx[0] = strdup(ctx);
    d->cont[0] = cat2(" ", cont);
    d->norm_len[0] = ev_codepoints(cont, strlen(cont));
    if (!d->ctx[0] || !d->cont[0]) return err_set(ERR_NOMEM, "out of memory");
    return 0;
}

// GSM8K 0-shot: "Question: {question}\nAnswer:"; the reference is the full
// solution, chain of thought + "\n#### " + the final answer.
static int build_gsm8k(const cJSON *row, ev_doc_t *d) {
    const char *q = str_field(row, "context"), *cot = str_field(row, "chain_of_thought"),
               *ans = str_field(row, "answer");
    if (!q || !cot || !ans) return err_set(ERR_INPUT, "fields 'context', 'chain_of_thought' and 'answer' expected");
    strbuf_t p = {0}, g = {0};
    strbuf_printf(&p, "Question: %s\nAnswer:", q);
    strbuf_printf(&g, "%s\n#### %s", cot, ans);
    d->n = 1, d->gold = 0;
    d->ctx[0] = p.s, d->gold_text = g.s;
    if (p.oom || g.oom || !p.s || !g.s) return err_set(ERR_NOMEM, "out of memory");
    return 0;
}

#define FOUNDRY "MosaicML llm-foundry, scripts/eval/local_data/"
const ev_task_t ev_tasks[] = {
    {"arc_easy", "eval/arc_easy.jsonl", "the ARC-Easy test set as JSONL {query: \"Question: ...\", choices, gold}",
     FOUNDRY "world_knowledge/arc_easy.jsonl", EV_MC, 1, 2376, build_arc},
    {"arc_challenge", "eval/arc_challenge.jsonl", "the ARC-Challenge test set as JSONL {query, choices, gold}",
     FOUNDRY "world_knowledge/arc_challenge.jsonl", EV_MC, 1, 1172, build_arc},
    {"openbookqa", "eval/openbook_qa.jsonl", "the OpenBookQA test set as JSONL {query: question stem, choices, gold}",
     FOUNDRY "commonsense_reasoning/openbook_qa.jsonl", EV_MC, 1, 500, build_obqa},
    {"piqa", "eval/piqa.jsonl", "the PIQA validation set as JSONL {query: \"Question: ...\\n\", choices, gold}",
     FOUNDRY "commonsense_reasoning/piqa.jsonl", EV_MC, 1, 1838, build_piqa},
    {"winogrande", "eval/winogrande.jsonl",
     "the WinoGrande (xl) validation set as JSONL {context_options[2], continuation, gold}",
     FOUNDRY "language_understanding/winogrande.jsonl", EV_MC, 0, 1267, build_winogrande},
    {"copa", "eval/copa.jsonl", "the COPA validation set as JSONL {query: \"premise, because\", choices, gold}",
     FOUNDRY "commonsense_reasoning/copa.jsonl", EV_MC, 0, 100, build_copa},
    {"siqa", "eval/siqa.jsonl", "the Social IQa validation set as JSONL {query: \"Context: ...\", choices, gold}",
     FOUNDRY "commonsense_reasoning/siqa.jsonl", EV_MC, 0, 1954, build_siqa},
    {"boolq", "eval/boolq.jsonl", "the BoolQ validation set as JSONL {query: \"Passage: ...\", choices, gold}",
     FOUNDRY "reading_comprehension/boolq.jsonl", EV_MC, 0, 3270, build_boolq},
    {"lambada_openai", "eval/lambada_openai.jsonl", "LAMBADA (OpenAI) as JSONL {context, continuation}",
     FOUNDRY "language_understanding/lambada_openai.jsonl", EV_LASTWORD, 0, 5153, build_lambada},
    {"gsm8k", "eval/gsm8k.jsonl", "the GSM8K test set as JSONL {context, chain_of_thought, answer}",
     FOUNDRY "symbolic_problem_solving/gsm8k.jsonl", EV_GEN, 0, 1319, build_gsm8k},
};
const int ev_n_tasks = (int)(sizeof ev_tasks / sizeof ev_tasks[0]);

const ev_task_t *ev_task_find(const char *name) {
    for (int i = 0; i < ev_n_tasks; i++)
        if (!strcmp(ev_tasks[i].name, name)) return &ev_tasks[i];
    return NULL;
}

void ev_doc_free(ev_doc_t *d) {
    for (int i = 0; i < 8; i++)
        free(d->ctx[i]), free(d->cont[i]);
    free(d->gold_text);
    memset(d, 0, sizeof *d);
}

// ---- tokenisation --------------------------------------------------------------

int ev_bos_flags(const char *policy) {
    if (!strcmp(policy, "none")) return TOK_SPECIAL;
    if (!strcmp(policy, "auto")) return TOK_SPECIAL | TOK_ADD_BOS;
    if (!strcmp(policy, "always")) return TOK_SPECIAL | EV_TOK_ALWAYS_BOS;
    return -1;
}

int ev_encode(const tok_t *tok, int flags, const char *text, int32_t **ids, int *n) {
    TRY(tok_encode_ex(tok, text, strlen(text), flags & (TOK_SPECIAL | TOK_ADD_BOS), ids, n));
    if ((flags & EV_TOK_ALWAYS_BOS) && tok->bos >= 0 && !(*n && (*ids)[0] == tok->bos)) {
        int32_t *p = realloc(*ids, ((size_t)*n + 1) * sizeof(int32_t));
        if (!p) {
            free(*ids);
            *ids = NULL;
            return err_set(ERR_NOMEM, "out of memory");
        }
        memmove(p + 1, p, (size_t)*n * sizeof(int32_t));
        p[0] = tok->bos;
        *ids = p, (*n)++;
    }
    return 0;
}

int ev_encode_pair(const tok_t *tok, int flags, int32_t prefix_id, const char *ctx, const char *cont, int32_t **ctx_ids,
                   int *n_ctx, int32_t **cont_ids, int *n_cont) {
    *ctx_ids = *cont_ids = NULL;
    if (!ctx[0]) { // lm-eval: the prefix token stands for the empty context
        TRY(tok_encode_ex(tok, cont, strlen(cont), flags & TOK_SPECIAL, cont_ids, n_cont));
        if (!(*ctx_ids = malloc(sizeof(int32_t)))) {
            free(*cont_ids);
            return err_set(ERR_NOMEM, "out of memory");
        }
        (*ctx_ids)[0] = prefix_id, *n_ctx = 1;
        return 0;
    }
    size_t lc = strlen(ctx), b, e;
    ev_strip_span(ctx, lc, &b, &e);
    size_t keep = e; // context.rstrip(): its trailing whitespace moves to the continuation
    (void)b;
    strbuf_t whole = {0};
    strbuf_putn(&whole, ctx, lc);
    strbuf_puts(&whole, cont);
    char *c = strndup(ctx, keep);
    if (whole.oom || !c) {
        free(whole.s), free(c);
        return err_set(ERR_NOMEM, "out of memory");
    }
    int32_t *w = NULL;
    int nw = 0;
    int rc = ev_encode(tok, flags, whole.s, &w, &nw);
    if (rc == 0) rc = ev_encode(tok, flags, c, ctx_ids, n_ctx);
    free(whole.s), free(c);
    if (rc == 0 && *n_ctx > nw) rc = err_set(ERR_INPUT, "context encodes longer than context + continuation");
    if (rc == 0) {
        *n_cont = nw - *n_ctx;
        *cont_ids = malloc(((size_t)*n_cont + 1) * sizeof(int32_t));
        if (!*cont_ids)
            rc = err_set(ERR_NOMEM, "out of memory");
        else
            memcpy(*cont_ids, w + *n_ctx, (size_t)*n_cont * sizeof(int32_t));
    }
    free(w);
    if (rc < 0) {
        free(*ctx_ids), free(*cont_ids);
        *ctx_ids = *cont_ids = NULL;
    }
    return rc;
}

// ---- decisions and metrics ----------------------------------------------------

void ev_mc_decide(const double *ll, const int64_t *norm_len, int n, int *pred, int *pred_norm) {
    *pred = *pred_norm = 0;
    double best = ll[0], best_n = ll[0] / (double)(norm_len[0] > 0 ? norm_len[0] : 1);
    for (int i = 1; i < n; i++) {
        double v = ll[i] / (double)(norm_len[i] > 0 ? norm_len[i] : 1);
        if (ll[i] > best) best = ll[i], *pred = i;
        if (v > best_n) best_n = v, *pred_norm = i;
    }
}

void ev_mean_stderr(const double *x, int n, double *mean, double *stderr_) {
    double s = 0, ss = 0;
    for (int i = 0; i < n; i++)
        s += x[i];
    *mean = n ? s / n : 0;
    for (int i = 0; i < n; i++)
        ss += (x[i] - *mean) * (x[i] - *mean);
    *stderr_ = n > 1 ? sqrt(ss / (n - 1)) / sqrt((double)n) : 0;
}

// ---- GSM8K filters (PCRE2, Python re semantics for these patterns) ----------

static pcre2_code *compile(const char *pat) {
    int e;
    PCRE2_SIZE off;
    return pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF, &e, &off, NULL);
}

// re.findall(pat, s)[first ? 0 : -1], the first non-empty group of that match,
// stripped; "[invalid]" when there is no match.
static char *find_match(const char *pat, const char *s, int first) {
    pcre2_code *re = compile(pat);
    if (!re) return NULL;
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    size_t len = strlen(s), at = 0;
    size_t gb = 0, ge = 0;
    int found = 0;
    while (md && at <= len) {
        int rc = pcre2_match(re, (PCRE2_SPTR)s, len, at, 0, md, NULL);
        if (rc < 0) break;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        // the first group that took part and is non-empty (findall's tuple filter)
        size_t b = 0, e = 0;
        for (int g = 1; g < rc; g++)
            if (ov[2 * g] != PCRE2_UNSET && ov[2 * g + 1] > ov[2 * g]) {
                b = ov[2 * g], e = ov[2 * g + 1];
                break;
            }
        if (rc == 1) b = ov[0], e = ov[1];
        gb = b, ge = e, found = 1;
        if (first) break;
        at = ov[1] > ov[0] ? ov[1] : ov[1] + 1;
    }
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    if (!found) return strdup("[invalid]");
    return ev_strip_dup(s + gb, ge - gb);
}

char *ev_gsm8k_strict(const char *gen) { return find_match("#### (\\-?[0-9\\.\\,]+)", gen, 1); }
char *ev_gsm8k_flexible(const char *gen) { return find_match("(-?[$0-9.,]{2,})|(-?[0-9]+)", gen, 0); }

// re.sub(pat, "", s) for every pattern of the task's regexes_to_ignore, then lower().
static char *normalise(const char *s) {
    static const char *ignore[] = {",", "\\$", "(?s).*#### ", "\\.$"};
    char *cur = strdup(s);
    for (size_t k = 0; cur && k < sizeof ignore / sizeof *ignore; k++) {
        pcre2_code *re = compile(ignore[k]);
        if (!re) {
            free(cur);
            return NULL;
        }
        size_t len = strlen(cur), cap = len + 1;
        char *out = malloc(cap);
        int rc = out ? pcre2_substitute(re, (PCRE2_SPTR)cur, len, 0, PCRE2_SUBSTITUTE_GLOBAL, NULL, NULL,
                                        (PCRE2_SPTR) "", 0, (PCRE2_UCHAR *)out, &cap)
                     : -1;
        pcre2_code_free(re);
        free(cur);
        if (rc < 0) {
            free(out);
            return NULL;
        }
        cur = out;
    }
    if (!cur) return NULL;
    char *low = ev_lower_dup(cur);
    free(cur);
    return low;
}

int ev_gsm8k_match(const char *pred, const char *gold) {
    char *a = normalise(pred), *b = normalise(gold);
    int r = a && b ? !strcmp(a, b) : -1;
    free(a), free(b);
    return r;
}

// ---- running a task --------------------------------------------------------------

static void json_line(afile_t *af, int *rc, cJSON *o) {
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!s) {
        if (*rc == 0) *rc = err_set(ERR_NOMEM, "out of memory");
        return;
    }
    if (*rc == 0) *rc = fs_write(af, s, strlen(s));
    if (*rc == 0) *rc = fs_write(af, "\n", 1);
    free(s);
}

static int score_doc(ev_lm_t *lm, const ev_task_t *t, const ev_doc_t *d, const ev_task_cfg_t *cfg, double *ll,
                     int *greedy, int *ntok, int *truncated, ev_gen_t *gen) {
    *truncated = 0;
    if (t->kind == EV_GEN) {
        int32_t *ids;
        int n;
        TRY(ev_encode(lm->tok, cfg->flags, d->ctx[0], &ids, &n));
        // lm-eval left-truncates the context to max_length - max_gen_toks
        int keep = lm->max_len - cfg->max_gen;
        int off = n > keep && keep > 0 ? n - keep : 0;
        *truncated = off > 0;
        static const char *const stops[] = {"Question:", "</s>", "<|im_end|>"};
        int rc = lm->generate(lm, ids + off, n - off, cfg->max_gen, stops, 3, gen);
        free(ids);
        return rc;
    }
    // Choices with the same context go to the model together.
    int done[8] = {0}, rc = 0;
    for (int i = 0; i < d->n && rc == 0; i++) {
        if (done[i]) continue;
        int32_t *cids[8] = {0}, *ctx = NULL;
        int nc[8] = {0}, nctx = 0, members[8], m = 0;
        for (int j = i; j < d->n && rc == 0; j++) {
            if (done[j] || strcmp(d->ctx[j], d->ctx[i])) continue;
            int32_t *cx;
            int ncx;
            rc = ev_encode_pair(lm->tok, cfg->flags, lm->prefix_id, d->ctx[j], d->cont[j], &cx, &ncx, &cids[m], &nc[m]);
            if (rc < 0) break;
            if (!ctx)
                ctx = cx, nctx = ncx;
            else
                free(cx); // the same context encodes the same
            members[m++] = j, done[j] = 1;
        }
        ev_span_t spans[8];
        ev_ll_t out[8];
        for (int k = 0; k < m; k++) {
            spans[k] = (ev_span_t){cids[k], nc[k]};
            if (nctx + nc[k] > lm->max_len + 1) *truncated = 1;
        }
        if (rc == 0) rc = lm->loglik(lm, ctx, nctx, spans, m, out);
        for (int k = 0; rc == 0 && k < m; k++)
            ll[members[k]] = out[k].ll, greedy[members[k]] = out[k].greedy, ntok[members[k]] = nc[k];
        for (int k = 0; k < m; k++)
            free(cids[k]);
        free(ctx);
    }
    return rc;
}

int ev_task_run(ev_lm_t *lm, const ev_task_t *t, cJSON **rows, int n_rows, const ev_task_cfg_t *cfg,
                ev_task_result_t *res) {
    memset(res, 0, sizeof *res);
    int n = cfg->limit > 0 && cfg->limit < n_rows ? cfg->limit : n_rows;
    double *a = calloc((size_t)n + 1, sizeof(double)), *an = calloc((size_t)n + 1, sizeof(double));
    double *lls = calloc((size_t)n + 1, sizeof(double));
    if (!a || !an || !lls) {
        free(a), free(an), free(lls);
        return err_set(ERR_NOMEM, "out of memory");
    }
    afile_t af;
    int rc = 0, open = 0;
    if (cfg->samples_path) {
        rc = fs_atomic_open(&af, cfg->samples_path);
        open = rc == 0;
    }
    ev_progress_t pg;
    ev_progress_start(&pg, t->name, n);
    double t0 = time_now();
    for (int i = 0; i < n && rc == 0; i++) {
        ev_doc_t d = {0};
        double ll[8] = {0};
        int greedy[8] = {0}, ntok[8] = {0}, trunc = 0;
        ev_gen_t gen = {0};
        rc = t->build(rows[i], &d);
        if (rc < 0) rc = err_wrap(rc, "%s: item %d: ", t->name, i + 1);
        if (rc == 0) rc = score_doc(lm, t, &d, cfg, ll, greedy, ntok, &trunc, &gen);
        res->truncated += trunc;
        cJSON *o = cJSON_CreateObject();
        if (o) cJSON_AddNumberToObject(o, "doc", i);
        if (rc == 0 && t->kind == EV_GEN) {
            char *s = ev_gsm8k_strict(gen.text), *f = ev_gsm8k_flexible(gen.text);
            int ms = s ? ev_gsm8k_match(s, d.gold_text) : -1, mf = f ? ev_gsm8k_match(f, d.gold_text) : -1;
            if (ms < 0 || mf < 0) rc = err_set(ERR_NOMEM, "out of memory");
            a[i] = ms, an[i] = mf;
            res->gen_tokens += gen.n_new;
            if (o) {
                cJSON_AddStringToObject(o, "prompt", d.ctx[0]);
                cJSON_AddStringToObject(o, "generation", gen.text);
                cJSON_AddStringToObject(o, "strict", s ? s : "");
                cJSON_AddStringToObject(o, "flexible", f ? f : "");
                cJSON_AddNumberToObject(o, "exact_match_strict", ms);
                cJSON_AddNumberToObject(o, "exact_match_flexible", mf);
                cJSON_AddNumberToObject(o, "new_tokens", gen.n_new);
            }
            free(s), free(f);
        } else if (rc == 0) {
            int p, pn;
            ev_mc_decide(ll, d.norm_len, d.n, &p, &pn);
            if (t->kind == EV_LASTWORD)
                a[i] = greedy[0], lls[i] = ll[0];
            else
                a[i] = p == d.gold, an[i] = pn == d.gold;
            if (o) {
                cJSON_AddItemToObject(o, "ctx", cJSON_CreateStringArray((const char *const *)d.ctx, d.n));
                cJSON_AddItemToObject(o, "cont", cJSON_CreateStringArray((const char *const *)d.cont, d.n));
                cJSON_AddItemToObject(o, "ll", cJSON_CreateDoubleArray(ll, d.n));
                cJSON_AddItemToObject(o, "cont_tokens", cJSON_CreateIntArray(ntok, d.n));
                cJSON_AddItemToObject(o, "greedy", cJSON_CreateIntArray(greedy, d.n));
                cJSON_AddNumberToObject(o, "gold", d.gold);
                cJSON_AddNumberToObject(o, "pred", p);
                cJSON_AddNumberToObject(o, "pred_norm", pn);
                cJSON_AddNumberToObject(o, "acc", a[i]);
                if (t->kind == EV_MC) cJSON_AddNumberToObject(o, "acc_norm", an[i]);
            }
        }
        if (o && trunc) cJSON_AddBoolToObject(o, "truncated", 1);
        if (open && o)
            json_line(&af, &rc, o);
        else
            cJSON_Delete(o);
        free(gen.text);
        ev_doc_free(&d);
        ev_progress_add(&pg, 1);
    }
    ev_progress_end(&pg);
    res->seconds = time_now() - t0;
    if (rc == 0) {
        res->n = n;
        if (t->kind == EV_GEN) {
            ev_mean_stderr(a, n, &res->em_strict, &res->em_strict_stderr);
            ev_mean_stderr(an, n, &res->em_flexible, &res->em_flexible_stderr);
        } else {
            ev_mean_stderr(a, n, &res->acc, &res->acc_stderr);
            if (t->kind == EV_MC) ev_mean_stderr(an, n, &res->acc_norm, &res->acc_norm_stderr);
            if (t->kind == EV_LASTWORD) {
                double m, s;
                ev_mean_stderr(lls, n, &m, &s);
                res->perplexity = exp(-m);
            }
        }
    }
    if (open) {
        if (rc == 0)
            rc = fs_atomic_commit(&af);
        else
            fs_atomic_abort(&af);
    }
    free(a), free(an), free(lls);
    return rc;
}
