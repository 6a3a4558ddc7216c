#include "eval/ev_ruler.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/fs.h"
#include "base/strbuf.h"
#include "base/utf8.h"
#include "eval/ev_pyrand.h"

// ---- the task table (eval.md §1.1) -------------------------------------------------

const ev_ruler_task_t ev_ruler_tasks[] = {
    {"niah_single_1", EV_GEN_NIAH, 128, 0, EV_HAY_NOISE, EV_KEY_WORDS, EV_KEY_NUMBERS, 1, 1, 1, 0},
    {"niah_single_2", EV_GEN_NIAH, 128, 0, EV_HAY_ESSAY, EV_KEY_WORDS, EV_KEY_NUMBERS, 1, 1, 1, 0},
    {"niah_single_3", EV_GEN_NIAH, 128, 0, EV_HAY_ESSAY, EV_KEY_WORDS, EV_KEY_UUIDS, 1, 1, 1, 0},
    {"niah_multikey_1", EV_GEN_NIAH, 128, 0, EV_HAY_ESSAY, EV_KEY_WORDS, EV_KEY_NUMBERS, 4, 1, 1, 0},
    {"niah_multikey_2", EV_GEN_NIAH, 128, 0, EV_HAY_NEEDLE, EV_KEY_WORDS, EV_KEY_NUMBERS, 1, 1, 1, 0},
    {"niah_multikey_3", EV_GEN_NIAH, 128, 0, EV_HAY_NEEDLE, EV_KEY_UUIDS, EV_KEY_UUIDS, 1, 1, 1, 0},
    {"niah_multivalue", EV_GEN_NIAH, 128, 0, EV_HAY_ESSAY, EV_KEY_WORDS, EV_KEY_NUMBERS, 1, 4, 1, 0},
    {"niah_multiquery", EV_GEN_NIAH, 128, 0, EV_HAY_ESSAY, EV_KEY_WORDS, EV_KEY_NUMBERS, 4, 1, 4, 0},
    {"vt", EV_GEN_VT, 30, 0, EV_HAY_NOISE, 0, 0, 0, 0, 0, 0},
    {"cwe", EV_GEN_CWE, 120, 0, 0, 0, 0, 0, 0, 0, 0},
    {"fwe", EV_GEN_FWE, 50, 0, 0, 0, 0, 0, 0, 0, 0},
    {"qa_1", EV_GEN_QA, 32, 1, 0, 0, 0, 0, 0, 0, 1},
    {"qa_2", EV_GEN_QA, 32, 1, 0, 0, 0, 0, 0, 0, 2},
};
const int ev_ruler_n_tasks = (int)(sizeof ev_ruler_tasks / sizeof ev_ruler_tasks[0]);

const ev_ruler_task_t *ev_ruler_find(const char *name) {
    for (int i = 0; i < ev_ruler_n_tasks; i++)
        if (!strcmp(ev_ruler_tasks[i].name, name)) return &ev_ruler_tasks[i];
    return NULL;
}

static const char *noise_sentence =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";
static const char *niah_template =
    "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. I will quiz "
    "you about the {type_needle_v} afterwards.\n{context}\nWhat are all the special magic {type_needle_v} for "
    "{query} mentioned in the provided text?";
static const char *niah_prefix = " The special magic {type_needle_v} for {query} mentioned in the provided text are";
static const char *vt_template = "Memorize and track the chain(s) of variable assignment hidden in the following "
                                 "text.\n\n{context}\nQuestion: Find all variables that are assigned the value "
                                 "{query} in the text above.";
static const char *vt_prefix = " Answer: According to the chain(s) of variable assignment in the text above, {num_v} "
                               "variables are assigned the value {query}, they are: ";
static const char *cwe_template =
    "Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones that "
    "appear most often.\n{context}\nQuestion: What are the 10 most common words in the above list?";
static const char *cwe_prefix = " Answer: The top 10 words that appear most often in the list are:";
static const char *fwe_template =
    "Read the following coded text and track the frequency of each coded word. Find the three most frequently "
    "appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore the dots '....'. What "
    "are the three most frequently appeared words in the above coded text?";
static const char *fwe_prefix =
    " Answer: According to the coded text above, the three most frequently appeared words are:";
static const char *qa_template =
    "Answer the question based on the given documents. Only give me the answer and do not output any other "
    "words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the question based on the given documents. "
    "Only give me the answer and do not output any other words.\n\nQuestion: {query}";
static const char *qa_prefix = " Answer:";

// round(100 k / 39), k = 0..39 (np.round of linspace(0, 100, 40))
static const int depths[40] = {0,  3,  5,  8,  10, 13, 15, 18, 21, 23, 26, 28, 31, 33, 36, 38, 41, 44, 46, 49,
                               51, 54, 56, 59, 62, 64, 67, 69, 72, 74, 77, 79, 82, 85, 87, 90, 92, 95, 97, 100};

// ---- data ------------------------------------------------------------------------------

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

// Sorted distinct copies (pointers into l) of a list.
static char **sorted_unique(const ev_strs_t *l, int *n) {
    char **s = malloc((size_t)(l->n ? l->n : 1) * sizeof *s);
    if (!s) return NULL;
    memcpy(s, l->s, (size_t)l->n * sizeof *s);
    qsort(s, (size_t)l->n, sizeof *s, cmp_str);
    int k = 0;
    for (int i = 0; i < l->n; i++)
        if (!k || strcmp(s[k - 1], s[i])) s[k++] = s[i];
    *n = k;
    return s;
}

static int starts_with(const char *s, const char *p, size_t pl) { return !strncmp(s, p, pl); }

// sorted(set(adj + "-" + noun)) without building it: with the adjectives sorted
// by adj + "-", every adjective whose key is not an extension of an earlier
// one ("blue-" vs "blue-eyed-") owns a contiguous run of keys in noun order.
// Adjectives whose keys extend one another interleave; those few clusters are
// built, sorted and deduplicated.
static int build_key_clusters(ev_ruler_data_t *d) {
    int na = d->n_adj_u, nn = d->n_noun_u;
    size_t nal = na > 0 ? (size_t)na : 1;
    char **keys = malloc(nal * sizeof *keys);
    if (!keys) return err_set(ERR_NOMEM, "out of memory");
    int rc = 0;
    for (int i = 0; i < na && rc == 0; i++) {
        size_t l = strlen(d->adj_sorted[i]);
        if (!(keys[i] = malloc(l + 2)))
            rc = err_set(ERR_NOMEM, "out of memory");
        else
            memcpy(keys[i], d->adj_sorted[i], l), keys[i][l] = '-', keys[i][l + 1] = 0;
    }
    // order the adjectives by their keys (adj_sorted follows)
    int *ord = malloc(nal * sizeof *ord);
    if (rc == 0 && !ord) rc = err_set(ERR_NOMEM, "out of memory");
    for (int i = 0; rc == 0 && i < na; i++)
        ord[i] = i;
    for (int i = 1; rc == 0 && i < na; i++) { // insertion sort: ~900 items
        int v = ord[i], j = i;
        while (j > 0 && strcmp(keys[ord[j - 1]], keys[v]) > 0)
            ord[j] = ord[j - 1], j--;
        ord[j] = v;
    }
    d->clusters = calloc(nal, sizeof *d->clusters);
    if (rc == 0 && !d->clusters) rc = err_set(ERR_NOMEM, "out of memory");
    int64_t total = 0;
    for (int i = 0; rc == 0 && i < na;) {
        const char *root = keys[ord[i]];
        size_t rl = strlen(root);
        int j = i + 1;
        while (j < na && starts_with(keys[ord[j]], root, rl))
            j++;
        struct ev_key_cluster *c = &d->clusters[d->n_clusters++];
        c->first = total;
        if (j == i + 1) {
            c->adj = ord[i];
            c->count = nn;
        } else {
            int64_t m = (int64_t)(j - i) * nn, k = 0;
            c->strs = malloc((size_t)m * sizeof *c->strs);
            if (!c->strs) rc = err_set(ERR_NOMEM, "out of memory");
            for (int a = i; rc == 0 && a < j; a++)
                for (int b = 0; b < nn && rc == 0; b++) {
                    size_t la = strlen(keys[ord[a]]), lb = strlen(d->noun_sorted[b]);
                    char *s = malloc(la + lb + 1);
                    if (!s)
                        rc = err_set(ERR_NOMEM, "out of memory");
                    else
                        memcpy(s, keys[ord[a]], la), memcpy(s + la, d->noun_sorted[b], lb + 1), c->strs[k++] = s;
                }
            if (rc == 0) {
                qsort(c->strs, (size_t)k, sizeof *c->strs, cmp_str);
                int64_t u = 0;
                for (int64_t q = 0; q < k; q++)
                    if (!u || strcmp(c->strs[u - 1], c->strs[q]))
                        c->strs[u++] = c->strs[q];
                    else
                        free(c->strs[q]);
                c->count = u;
            } else {
                c->count = k;
            }
        }
        total += c->count;
        i = j;
    }
    d->n_keys = total;
    for (int i = 0; i < na; i++)
        free(keys[i]);
    free(keys);
    free(ord);
    return rc;
}

void ev_ruler_word_key(const ev_ruler_data_t *d, int64_t i, char *out, size_t cap) {
    int lo = 0, hi = d->n_clusters - 1;
    while (lo < hi) { // the last cluster whose first <= i
        int mid = (lo + hi + 1) / 2;
        if (d->clusters[mid].first <= i)
            lo = mid;
        else
            hi = mid - 1;
    }
    const struct ev_key_cluster *c = &d->clusters[lo];
    int64_t j = i - c->first;
    if (c->strs)
        snprintf(out, cap, "%s", c->strs[j]);
    else
        snprintf(out, cap, "%s-%s", d->adj_sorted[c->adj], d->noun_sorted[j]);
}

int ev_ruler_load_words(ev_ruler_data_t *d, const char *dir, uint64_t seed) {
    static const char *names[3] = {"adjectivelist.txt", "nounlist.txt", "verblist.txt"};
    ev_strs_t *lists[3] = {&d->adj, &d->noun, &d->verb};
    for (int i = 0; i < 3; i++) {
        char p[1100];
        TRY(fs_join(p, sizeof p, dir, names[i]));
        int rc = ev_read_lines(p, lists[i]);
        if (rc < 0) return err_wrap(rc, "RULER word lists (wonderwords %s): ", names[i]);
        if (!lists[i]->n) return err_set(ERR_INPUT, "%s: no words", p);
    }
    if (!(d->adj_sorted = sorted_unique(&d->adj, &d->n_adj_u)) ||
        !(d->noun_sorted = sorted_unique(&d->noun, &d->n_noun_u)))
        return err_set(ERR_NOMEM, "out of memory");
    TRY(build_key_clusters(d));
    // CWE's pool: sorted(set(noun + adj + verb)); shuffled per run (generate)
    ev_strs_t all = {0};
    all.n = d->noun.n + d->adj.n + d->verb.n;
    all.s = malloc((size_t)all.n * sizeof *all.s);
    if (!all.s) return err_set(ERR_NOMEM, "out of memory");
    memcpy(all.s, d->noun.s, (size_t)d->noun.n * sizeof *all.s);
    memcpy(all.s + d->noun.n, d->adj.s, (size_t)d->adj.n * sizeof *all.s);
    memcpy(all.s + d->noun.n + d->adj.n, d->verb.s, (size_t)d->verb.n * sizeof *all.s);
    d->cwe_pool = sorted_unique(&all, &d->n_cwe);
    free(all.s);
    if (!d->cwe_pool) return err_set(ERR_NOMEM, "out of memory");
    d->seed = seed;
    d->have_words = 1;
    return 0;
}

static int cmp_name(const struct dirent **a, const struct dirent **b) { return strcmp((*a)->d_name, (*b)->d_name); }

int ev_ruler_load_haystack(ev_ruler_data_t *d, const char *path) {
    strbuf_t raw = {0};
    if (fs_is_dir(path)) {
        struct dirent **ents;
        int k = scandir(path, &ents, NULL, cmp_name), rc = 0, nf = 0;
        if (k < 0) return err_set(ERR_INPUT, "%s: cannot list the haystack folder", path);
        for (int i = 0; i < k; i++) {
            size_t l = strlen(ents[i]->d_name);
            if (rc == 0 && l > 4 && !strcmp(ents[i]->d_name + l - 4, ".txt")) {
                char p[2048], *buf;
                size_t len;
                snprintf(p, sizeof p, "%s/%s", path, ents[i]->d_name);
                if ((rc = fs_read_all(p, &buf, &len)) == 0) {
                    strbuf_putn(&raw, buf, len);
                    free(buf);
                    nf++;
                }
            }
            free(ents[i]);
        }
        free(ents);
        if (rc == 0 && !nf) rc = err_set(ERR_INPUT, "%s: no .txt files for the haystack", path);
        if (rc < 0) {
            free(raw.s);
            return rc;
        }
    } else {
        char *buf;
        size_t len;
        TRY(fs_read_all(path, &buf, &len));
        strbuf_putn(&raw, buf, len);
        free(buf);
    }
    if (raw.oom || !raw.s) {
        free(raw.s);
        return raw.oom ? err_set(ERR_NOMEM, "out of memory") : err_set(ERR_INPUT, "%s: empty haystack", path);
    }
    // re.sub(r"\s+", " ", text).split(" ")
    char *h = malloc(raw.n + 1);
    size_t o = 0;
    int in_space = 0;
    for (size_t i = 0; h && i < raw.n;) {
        uint32_t cp;
        int l = utf8_next((const uint8_t *)raw.s + i, raw.n - i, &cp);
        if (l <= 0) cp = 0xfffd, l = 1;
        if (ev_is_space(cp)) {
            if (!in_space) h[o++] = ' ';
            in_space = 1;
        } else {
            memcpy(h + o, raw.s + i, (size_t)l);
            o += (size_t)l, in_space = 0;
        }
        i += (size_t)l;
    }
    free(raw.s);
    if (!h) return err_set(ERR_NOMEM, "out of memory");
    h[o] = 0;
    int64_t nw = 1;
    for (size_t i = 0; i < o; i++)
        nw += h[i] == ' ';
    d->hw_start = malloc((size_t)nw * sizeof *d->hw_start);
    d->hw_len = malloc((size_t)nw * sizeof *d->hw_len);
    if (!d->hw_start || !d->hw_len) {
        free(h);
        return err_set(ERR_NOMEM, "out of memory");
    }
    int64_t w = 0;
    size_t s = 0;
    for (size_t i = 0; i <= o; i++)
        if (i == o || h[i] == ' ') d->hw_start[w] = s, d->hw_len[w] = (uint32_t)(i - s), w++, s = i + 1;
    d->hay = h, d->n_hw = w;
    d->have_hay = 1;
    return 0;
}

// ---- QA data (RULER's read_squad / read_hotpotqa) -------------------------------------

static int doc_id(char **docs, int n, const char *s) {
    char *const *p = bsearch(&s, docs, (size_t)n, sizeof *docs, cmp_str);
    return p ? (int)(p - docs) : -1;
}

// Sorted distinct docs from a list of strings (the list's strings are freed or kept).
static int finish_docs(ev_qa_t *q, ev_strs_t *all) {
    qsort(all->s, (size_t)all->n, sizeof *all->s, cmp_str);
    int k = 0;
    for (int i = 0; i < all->n; i++)
        if (!k || strcmp(all->s[k - 1], all->s[i]))
            all->s[k++] = all->s[i];
        else
            free(all->s[i]);
    q->docs = all->s, q->n_docs = k;
    all->s = NULL, all->n = 0;
    return 0;
}

static int add_qa(ev_qa_t *q, int *cap, const char *query) {
    if (q->n_qas == *cap) {
        *cap = *cap ? *cap * 2 : 256;
        void *p = realloc(q->qas, (size_t)*cap * sizeof *q->qas);
        if (!p) return err_set(ERR_NOMEM, "out of memory");
        q->qas = p;
    }
    memset(&q->qas[q->n_qas], 0, sizeof q->qas[0]);
    if (!(q->qas[q->n_qas].query = strdup(query))) return err_set(ERR_NOMEM, "out of memory");
    q->n_qas++;
    return 0;
}

static int read_json(const char *path, cJSON **root) {
    char *buf;
    size_t len;
    TRY(fs_read_all(path, &buf, &len));
    *root = cJSON_ParseWithLength(buf, len);
    free(buf);
    if (!*root) return err_set(ERR_INPUT, "%s: not valid JSON", path);
    return 0;
}

int ev_ruler_load_squad(ev_ruler_data_t *d, const char *path) {
    cJSON *root;
    TRY(read_json(path, &root));
    ev_qa_t *q = &d->squad;
    const cJSON *data = cJSON_GetObjectItemCaseSensitive(root, "data"), *art, *par, *qa, *an;
    int rc = cJSON_IsArray(data) ? 0 : err_set(ERR_INPUT, "%s: expected SQuAD v2.0 JSON with a 'data' array", path);
    ev_strs_t all = {0};
    cJSON_ArrayForEach(art, data) {
        cJSON_ArrayForEach(par, cJSON_GetObjectItemCaseSensitive(art, "paragraphs")) {
            const cJSON *c = cJSON_GetObjectItemCaseSensitive(par, "context");
            if (rc == 0 && !cJSON_IsString(c)) rc = err_set(ERR_INPUT, "%s: a paragraph without 'context'", path);
            if (rc == 0) rc = ev_strs_add(&all, c->valuestring, strlen(c->valuestring));
        }
    }
    if (rc == 0) rc = finish_docs(q, &all);
    ev_strs_free(&all);
    int cap = 0;
    cJSON_ArrayForEach(art, data) {
        const cJSON *pars = cJSON_GetObjectItemCaseSensitive(art, "paragraphs");
        int np = cJSON_GetArraySize(pars), *ids = calloc((size_t)(np ? np : 1), sizeof(int)), k = 0;
        if (rc == 0 && !ids) rc = err_set(ERR_NOMEM, "out of memory");
        cJSON_ArrayForEach(par, pars) if (rc == 0) ids[k++] =
            doc_id(q->docs, q->n_docs, cJSON_GetObjectItemCaseSensitive(par, "context")->valuestring);
        int pi = 0;
        cJSON_ArrayForEach(par, pars) {
            cJSON_ArrayForEach(qa, cJSON_GetObjectItemCaseSensitive(par, "qas")) {
                if (rc < 0) break;
                const cJSON *imp = cJSON_GetObjectItemCaseSensitive(qa, "is_impossible");
                const cJSON *qs = cJSON_GetObjectItemCaseSensitive(qa, "question");
                if (cJSON_IsTrue(imp)) continue;
                if (!cJSON_IsString(qs)) {
                    rc = err_set(ERR_INPUT, "%s: a question without 'question'", path);
                    break;
                }
                if ((rc = add_qa(q, &cap, qs->valuestring)) < 0) break;
                struct ev_qa_item *it = &q->qas[q->n_qas - 1];
                cJSON_ArrayForEach(an, cJSON_GetObjectItemCaseSensitive(qa, "answers")) {
                    const cJSON *t = cJSON_GetObjectItemCaseSensitive(an, "text");
                    if (rc == 0 && cJSON_IsString(t))
                        rc = ev_strs_add(&it->outputs, t->valuestring, strlen(t->valuestring));
                }
                it->ctx = malloc(sizeof(int));
                it->more = malloc((size_t)(np ? np : 1) * sizeof(int));
                if (!it->ctx || !it->more) {
                    rc = err_set(ERR_NOMEM, "out of memory");
                    break;
                }
                it->ctx[0] = ids[pi], it->n_ctx = 1;
                for (int j = 0; j < np; j++)
                    if (ids[j] != ids[pi]) it->more[it->n_more++] = ids[j];
            }
            pi++;
        }
        free(ids);
    }
    cJSON_Delete(root);
    if (rc == 0 && !q->n_qas) rc = err_set(ERR_INPUT, "%s: no answerable questions", path);
    if (rc == 0) d->have_squad = 1;
    return rc;
}

// HotpotQA document: title + "\n" + the sentences joined without separator.
static char *hotpot_doc(const cJSON *pair) {
    const cJSON *t = cJSON_GetArrayItem(pair, 0), *ss = cJSON_GetArrayItem(pair, 1), *s;
    if (!cJSON_IsString(t) || !cJSON_IsArray(ss)) return NULL;
    strbuf_t b = {0};
    strbuf_puts(&b, t->valuestring);
    strbuf_puts(&b, "\n");
    cJSON_ArrayForEach(s, ss) if (cJSON_IsString(s)) strbuf_puts(&b, s->valuestring);
    if (b.oom) {
        free(b.s);
        return NULL;
    }
    return b.s;
}

int ev_ruler_load_hotpot(ev_ruler_data_t *d, const char *path) {
    cJSON *root;
    TRY(read_json(path, &root));
    ev_qa_t *q = &d->hotpot;
    int rc = cJSON_IsArray(root) ? 0 : err_set(ERR_INPUT, "%s: expected HotpotQA JSON (an array of questions)", path);
    ev_strs_t all = {0};
    const cJSON *it, *pair;
    cJSON_ArrayForEach(it, root) {
        cJSON_ArrayForEach(pair, cJSON_GetObjectItemCaseSensitive(it, "context")) {
            char *doc = rc == 0 ? hotpot_doc(pair) : NULL;
            if (rc == 0 && !doc) rc = err_set(ERR_INPUT, "%s: a context entry is not [title, [sentences]]", path);
            if (rc == 0) rc = ev_strs_add(&all, doc, strlen(doc));
            free(doc);
        }
    }
    if (rc == 0) rc = finish_docs(q, &all);
    ev_strs_free(&all);
    int cap = 0;
    cJSON_ArrayForEach(it, root) {
        if (rc < 0) break;
        const cJSON *qs = cJSON_GetObjectItemCaseSensitive(it, "question"),
                    *an = cJSON_GetObjectItemCaseSensitive(it, "answer"),
                    *ctx = cJSON_GetObjectItemCaseSensitive(it, "context");
        if (!cJSON_IsString(qs) || !cJSON_IsString(an)) {
            rc = err_set(ERR_INPUT, "%s: a question without 'question' / 'answer'", path);
            break;
        }
        if ((rc = add_qa(q, &cap, qs->valuestring)) < 0) break;
        struct ev_qa_item *x = &q->qas[q->n_qas - 1];
        rc = ev_strs_add(&x->outputs, an->valuestring, strlen(an->valuestring));
        int nc = cJSON_GetArraySize(ctx);
        x->ctx = malloc((size_t)(nc ? nc : 1) * sizeof(int));
        if (rc == 0 && !x->ctx) rc = err_set(ERR_NOMEM, "out of memory");
        cJSON_ArrayForEach(pair, ctx) {
            char *doc = rc == 0 ? hotpot_doc(pair) : NULL;
            if (doc) x->ctx[x->n_ctx++] = doc_id(q->docs, q->n_docs, doc);
            free(doc);
        }
    }
    cJSON_Delete(root);
    if (rc == 0 && !q->n_qas) rc = err_set(ERR_INPUT, "%s: no questions", path);
    if (rc == 0) d->have_hotpot = 1;
    return rc;
}

static void qa_free(ev_qa_t *q) {
    for (int i = 0; i < q->n_docs; i++)
        free(q->docs[i]);
    free(q->docs);
    for (int i = 0; i < q->n_qas; i++) {
        free(q->qas[i].query);
        ev_strs_free(&q->qas[i].outputs);
        free(q->qas[i].ctx), free(q->qas[i].more);
    }
    free(q->qas);
}

void ev_ruler_data_free(ev_ruler_data_t *d) {
    ev_strs_free(&d->adj), ev_strs_free(&d->noun), ev_strs_free(&d->verb);
    for (int i = 0; i < d->n_clusters; i++) {
        if (d->clusters[i].strs)
            for (int64_t j = 0; j < d->clusters[i].count; j++)
                free(d->clusters[i].strs[j]);
        free(d->clusters[i].strs);
    }
    free(d->clusters), free(d->adj_sorted), free(d->noun_sorted), free(d->cwe_pool);
    free(d->hay), free(d->hw_start), free(d->hw_len);
    qa_free(&d->squad), qa_free(&d->hotpot);
    memset(d, 0, sizeof *d);
}

// ---- generation ------------------------------------------------------------------------

typedef struct {
    const ev_ruler_data_t *d;
    const ev_ruler_task_t *t;
    const ev_ruler_cfg_t *cfg;
    ev_mt_t py, np;  // the global Python and numpy streams
    char **cwe_pool; // the CWE pool shuffled with Random(seed)
    char *vt_icl;    // VT's one-shot example
    int vt_icl_tokens;
    int icl_build; // building VT's example: 3-letter names, value 12345, bare template
    int qa_index;  // the question a QA sample asks
} gen_t;

static int count_tokens(const gen_t *g, const char *s, int *n) {
    int32_t *ids;
    TRY(tok_encode_ex(g->cfg->tok, s, strlen(s), TOK_SPECIAL, &ids, n));
    free(ids);
    return 0;
}

// Python str.format with named fields: "{name}" replaced by its value.
static void fill(strbuf_t *b, const char *tmpl, const char *const *names, const char *const *vals, int n) {
    const char *p = tmpl;
    while (*p) {
        const char *o = strchr(p, '{');
        if (!o) {
            strbuf_puts(b, p);
            break;
        }
        strbuf_putn(b, p, (size_t)(o - p));
        const char *c = strchr(o, '}');
        int k = -1;
        for (int i = 0; c && i < n; i++)
            if ((size_t)(c - o - 1) == strlen(names[i]) && !strncmp(o + 1, names[i], (size_t)(c - o - 1))) k = i;
        if (k < 0) { // not a field: literal
            strbuf_putn(b, o, 1);
            p = o + 1;
            continue;
        }
        strbuf_puts(b, vals[k]);
        p = c + 1;
    }
}

static void random_value(gen_t *g, ev_keytype_t type, char *out, size_t cap) {
    switch (type) {
    case EV_KEY_WORDS:
        ev_ruler_word_key(g->d, (int64_t)ev_py_randbelow(&g->py, (uint64_t)g->d->n_keys), out, cap);
        break;
    case EV_KEY_NUMBERS: snprintf(out, cap, "%lld", (long long)ev_py_randint(&g->py, 1000000, 9999999)); break;
    case EV_KEY_UUIDS: ev_py_uuid4(&g->py, out); break;
    }
}

static const char *type_word(ev_keytype_t t) {
    return t == EV_KEY_WORDS ? "words" : t == EV_KEY_NUMBERS ? "numbers" : "uuids";
}

static void append_essay_words(const ev_ruler_data_t *d, int64_t n, strbuf_t *b) {
    for (int64_t i = 0; i < n; i++) {
        int64_t w = i % d->n_hw;
        if (i) strbuf_putn(b, " ", 1);
        strbuf_putn(b, d->hay + d->hw_start[w], d->hw_len[w]);
    }
}

static int cmp_int(const void *a, const void *b) {
    return (*(const int *)a > *(const int *)b) - (*(const int *)a < *(const int *)b);
}
static int cmp_i64_desc(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x < y) - (x > y);
}

// niah.py generate_input_output(n)
static int build_niah(gen_t *g, int n, strbuf_t *text, ev_strs_t *outs) {
    const ev_ruler_task_t *t = g->t;
    int K = t->K > t->Q ? t->K : t->Q, V = t->V, m = K * V, rc = 0;
    char keys[16][64], vals[16][4][64];
    char *needles[64];
    const char *tv = type_word(t->v);
    for (int k = 0, q = 0; k < K; k++) {
        random_value(g, t->k, keys[k], sizeof keys[k]);
        for (int v = 0; v < V; v++, q++) {
            random_value(g, t->v, vals[k][v], sizeof vals[k][v]);
            strbuf_t nb = {0};
            strbuf_printf(&nb, "One of the special magic %s for %s is: %s.", tv, keys[k], vals[k][v]);
            needles[q] = nb.s;
        }
    }
    ev_mt_t fresh;
    ev_py_seed(&fresh, g->cfg->seed);
    ev_py_shuffle(&fresh, needles, (size_t)m, sizeof *needles);
    strbuf_t ctx = {0};
    if (t->hay == EV_HAY_ESSAY) {
        strbuf_t words = {0};
        append_essay_words(g->d, n, &words);
        size_t b = 0, e = 0, *ss = NULL, *se = NULL;
        int ns = 0;
        if (words.s) ev_strip_span(words.s, words.n, &b, &e);
        rc = words.oom ? err_set(ERR_NOMEM, "out of memory")
                       : ev_split_sentences(words.s ? words.s + b : "", e - b, &ss, &se, &ns);
        int64_t dsel[64];
        if (rc == 0 && ev_py_sample(&g->py, 40, m, dsel) < 0) rc = err_set(ERR_NOMEM, "out of memory");
        int pos[66];
        pos[0] = 0;
        for (int i = 0; rc == 0 && i < m; i++)
            pos[i + 1] = (int)((double)ns * ((double)depths[dsel[i]] / 100.0));
        if (rc == 0) qsort(pos + 1, (size_t)m, sizeof *pos, cmp_int);
        pos[m + 1] = ns;
        for (int i = 1; rc == 0 && i <= m + 1; i++) {
            if (i > 1) strbuf_puts(&ctx, " ");
            for (int s = pos[i - 1]; s < pos[i]; s++) {
                if (s > pos[i - 1]) strbuf_puts(&ctx, " ");
                strbuf_putn(&ctx, words.s + b + ss[s], se[s] - ss[s]);
            }
            if (i - 1 < m) {
                strbuf_puts(&ctx, " ");
                strbuf_puts(&ctx, needles[i - 1]);
            }
        }
        free(ss), free(se), free(words.s);
    } else {
        // n haystack lines (noise sentences, or distractor needles), the needles
        // inserted before the lines at sample(range(n), m), highest index first
        char **lines = calloc((size_t)n, sizeof *lines);
        int64_t idx[64];
        if (!lines) rc = err_set(ERR_NOMEM, "out of memory");
        for (int i = 0; rc == 0 && i < n; i++) {
            if (t->hay == EV_HAY_NOISE) continue;
            char k[64], v[64];
            random_value(g, t->k, k, sizeof k);
            random_value(g, t->v, v, sizeof v);
            strbuf_t nb = {0};
            strbuf_printf(&nb, "One of the special magic %s for %s is: %s.", tv, k, v);
            if (!(lines[i] = nb.s)) rc = err_set(ERR_NOMEM, "out of memory");
        }
        if (rc == 0 && ev_py_sample(&g->py, n, m, idx) < 0)
            rc = err_set(ERR_INPUT, "haystack of %d lines is smaller than %d needles", n, m);
        if (rc == 0) qsort(idx, (size_t)m, sizeof *idx, cmp_i64_desc);
        for (int i = 0; rc == 0 && i < n; i++) {
            for (int j = 0; j < m; j++)
                if (idx[j] == i) {
                    strbuf_puts(&ctx, needles[j]);
                    strbuf_puts(&ctx, "\n");
                }
            strbuf_puts(&ctx, lines[i] ? lines[i] : noise_sentence);
            if (i + 1 < n) strbuf_puts(&ctx, "\n");
        }
        for (int i = 0; lines && i < n; i++)
            free(lines[i]);
        free(lines);
    }
    int64_t sel[16];
    if (rc == 0 && ev_py_sample(&g->py, K, t->Q, sel) < 0) rc = err_set(ERR_NOMEM, "out of memory");
    strbuf_t query = {0};
    for (int i = 0; rc == 0 && i < t->Q; i++) {
        if (i) strbuf_puts(&query, i + 1 == t->Q ? ", and " : ", ");
        strbuf_puts(&query, keys[sel[i]]);
        for (int v = 0; v < V && rc == 0; v++)
            rc = ev_strs_add(outs, vals[sel[i]][v], strlen(vals[sel[i]][v]));
    }
    // template + answer prefix; for one answer the plural wording becomes singular
    char *tmpl = NULL;
    strbuf_t tb = {0};
    strbuf_puts(&tb, niah_template);
    strbuf_puts(&tb, niah_prefix);
    tmpl = tb.s;
    char tvs[16];
    snprintf(tvs, sizeof tvs, "%s", tv);
    if (rc == 0 && t->Q * V == 1) {
        static const char *rep[4][2] = {{"Some", "A"}, {"are all", "is"}, {"are", "is"}, {"answers", "answer"}};
        for (int i = 0; i < 4 && rc == 0; i++)
            rc = ev_replace_all(&tmpl, rep[i][0], rep[i][1]);
        tvs[strlen(tvs) - 1] = 0;
    }
    if (rc == 0 && (ctx.oom || query.oom || tb.oom || !tmpl)) rc = err_set(ERR_NOMEM, "out of memory");
    if (rc == 0) {
        const char *names[3] = {"type_needle_v", "context", "query"};
        const char *vs[3] = {tvs, ctx.s ? ctx.s : "", query.s ? query.s : ""};
        fill(text, tmpl, names, vs, 3);
    }
    free(tmpl), free(ctx.s), free(query.s);
    for (int i = 0; i < m; i++)
        free(needles[i]);
    return rc;
}

static void random_name(gen_t *g, int k, char *out) {
    for (int i = 0; i < k; i++)
        out[i] = (char)('A' + ev_py_choices_index(&g->py, 26));
    out[k] = 0;
}

// variable_tracking.py generate_input_output(n) (1 chain of 4 hops)
static int build_vt(gen_t *g, int n, strbuf_t *text, ev_strs_t *outs) {
    int icl = g->icl_build, k = icl ? 3 : 5, hops = 4, need = hops + 1, rc = 0; // ICL: min(10, hops) = 4
    char names[64][8];
    int nn = 0;
    for (; nn < need; nn++)
        random_name(g, k, names[nn]);
    for (;;) { // fresh names until the set is large enough (the first slice is used as it is)
        int distinct = 0;
        for (int i = 0; i < nn; i++) {
            int dup = 0;
            for (int j = 0; j < i && !dup; j++)
                dup = !strcmp(names[i], names[j]);
            distinct += !dup;
        }
        if (distinct >= need || nn == 64) break;
        random_name(g, k, names[nn++]);
    }
    char chain[16][64];
    long long value = icl ? 12345 : (long long)ev_np_randint(&g->np, 10000, 99999);
    snprintf(chain[0], sizeof chain[0], "VAR %.7s = %lld", names[0], value);
    for (int j = 1; j <= hops; j++)
        snprintf(chain[j], sizeof chain[j], "VAR %.7s = VAR %.7s ", names[j], names[j - 1]);
    int64_t pos[16];
    if (ev_py_sample(&g->py, n, need, pos) < 0) return err_set(ERR_INPUT, "%d noise lines for a chain of %d", n, need);
    // sorted positions; chain line j goes to pos[j] + j of the growing list
    for (int i = 1; i < need; i++)
        for (int j = i; j > 0 && pos[j - 1] > pos[j]; j--) {
            int64_t tmp = pos[j];
            pos[j] = pos[j - 1], pos[j - 1] = tmp;
        }
    strbuf_t ctx = {0};
    int total = n + need, c = 0;
    for (int i = 0; i < total; i++) {
        if (i) strbuf_puts(&ctx, "\n");
        if (c < need && i == pos[c] + c)
            strbuf_puts(&ctx, chain[c++]);
        else
            strbuf_puts(&ctx, noise_sentence);
    }
    if (ctx.oom || !ctx.s) {
        free(ctx.s);
        return err_set(ERR_NOMEM, "out of memory");
    }
    rc = ev_replace_all(&ctx.s, ". \n", ".\n");
    char q[32], nv[8];
    snprintf(q, sizeof q, "%lld", value);
    snprintf(nv, sizeof nv, "%d", need);
    strbuf_t tb = {0};
    strbuf_puts(&tb, vt_template);
    strbuf_puts(&tb, vt_prefix);
    const char *fnames[3] = {"context", "query", "num_v"}, *vals[3] = {ctx.s, q, nv};
    if (rc == 0 && !tb.oom) fill(text, tb.s, fnames, vals, 3);
    for (int i = 0; rc == 0 && i < need; i++)
        rc = ev_strs_add(outs, names[i], strlen(names[i]));
    free(tb.s), free(ctx.s);
    return rc;
}

// common_words_extraction.py get_example: "1. w 2. w ..." and the common words.
static int cwe_example(gen_t *g, int n, int cr, int ur, strbuf_t *ctx, char **common) {
    if (n > g->d->n_cwe)
        return err_set(ERR_UNSUP,
                       "cwe: %d distinct words needed, the word pool has %d (RULER then draws from "
                       "english_words.json, which is not available)",
                       n, g->d->n_cwe);
    int64_t *idx = malloc((size_t)n * sizeof *idx);
    int len = 10 * cr + (n - 10) * ur;
    char **list = malloc((size_t)(len ? len : 1) * sizeof *list);
    if (!idx || !list || ev_py_sample(&g->py, g->d->n_cwe, n, idx) < 0) {
        free(idx), free(list);
        return err_set(ERR_NOMEM, "out of memory");
    }
    int k = 0;
    for (int r = 0; r < cr; r++)
        for (int i = 0; i < 10; i++)
            list[k++] = g->cwe_pool[idx[i]];
    for (int r = 0; r < ur; r++)
        for (int i = 10; i < n; i++)
            list[k++] = g->cwe_pool[idx[i]];
    for (int i = 0; i < 10; i++)
        common[i] = g->cwe_pool[idx[i]];
    ev_mt_t fresh;
    ev_py_seed(&fresh, g->cfg->seed);
    ev_py_shuffle(&fresh, list, (size_t)k, sizeof *list);
    for (int i = 0; i < k; i++)
        strbuf_printf(ctx, i ? " %d. %s" : "%d. %s", i + 1, list[i]);
    free(idx), free(list);
    return ctx->oom ? err_set(ERR_NOMEM, "out of memory") : 0;
}

static int build_cwe(gen_t *g, int n, strbuf_t *text, ev_strs_t *outs) {
    int small = g->cfg->max_len < 4096;
    strbuf_t fs = {0}, main = {0};
    char *fs_common[10], *common[10];
    int rc = cwe_example(g, small ? 20 : 40, small ? 3 : 10, small ? 1 : 3, &fs, fs_common);
    if (rc == 0) rc = cwe_example(g, n, small ? 6 : 30, small ? 1 : 3, &main, common);
    strbuf_t tb = {0};
    strbuf_puts(&tb, cwe_template);
    strbuf_puts(&tb, cwe_prefix);
    const char *fnames[1] = {"context"};
    if (rc == 0 && !tb.oom) {
        const char *v1[1] = {fs.s};
        fill(text, tb.s, fnames, v1, 1);
        strbuf_puts(text, " ");
        for (int i = 0; i < 10; i++)
            strbuf_printf(text, i ? " %d. %s" : "%d. %s", i + 1, fs_common[i]);
        strbuf_puts(text, "\n");
        const char *v2[1] = {main.s};
        fill(text, tb.s, fnames, v2, 1);
    }
    for (int i = 0; rc == 0 && i < 10; i++)
        rc = ev_strs_add(outs, common[i], strlen(common[i]));
    free(fs.s), free(main.s), free(tb.s);
    return rc;
}

// freq_words_extraction.py: a coded vocabulary, and a text of n words drawn
// by Zipf counts over it.
typedef struct {
    char (*w)[8];
    int n;
} fwe_vocab_t;

static int cmp_word8(const void *a, const void *b) { return strcmp((const char *)a, (const char *)b); }

// Sorted distinct words of w[0..n) into a new array (count in *u).
static char (*distinct8(char (*w)[8], int n, int *u))[8] {
    char(*s)[8] = malloc((size_t)(n > 0 ? n : 1) * sizeof *s);
    if (!s) return NULL;
    memcpy(s, w, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, cmp_word8);
    int k = 0;
    for (int i = 0; i < n; i++)
        if (!k || strcmp(s[k - 1], s[i])) memmove(s[k++], s[i], 8);
    *u = k;
    return s;
}

static int fwe_vocab(gen_t *g, int size, fwe_vocab_t *v) {
    int cap = size + 16, n = 0, u = 0;
    char(*w)[8] = malloc((size_t)cap * sizeof *w);
    if (!w) return err_set(ERR_NOMEM, "out of memory");
    for (;;) { // size draws, then one more at a time while len(set(vocab)) < size
        while (n < size) {
            for (int i = 0; i < 6; i++)
                w[n][i] = (char)('a' + ev_py_choices_index(&g->py, 26));
            w[n][6] = 0, n++;
        }
        char(*s)[8] = distinct8(w, n, &u);
        if (!s) {
            free(w);
            return err_set(ERR_NOMEM, "out of memory");
        }
        if (u >= size) {
            v->w = s, v->n = u;
            break;
        }
        free(s);
        if (n == cap) {
            char(*w2)[8] = realloc(w, (size_t)cap * 2 * sizeof *w);
            if (!w2) {
                free(w);
                return err_set(ERR_NOMEM, "out of memory");
            }
            w = w2, cap *= 2;
        }
        for (int i = 0; i < 6; i++)
            w[n][i] = (char)('a' + ev_py_choices_index(&g->py, 26));
        w[n][6] = 0, n++;
    }
    free(w);
    ev_mt_t fresh;
    ev_py_seed(&fresh, g->cfg->seed);
    ev_py_shuffle(&fresh, v->w, (size_t)v->n, sizeof *v->w);
    snprintf(v->w[0], 8, "...");
    return 0;
}

static int fwe_text(gen_t *g, const fwe_vocab_t *v, int n, strbuf_t *text) {
    const double zeta2 = 1.6449340668482264; // scipy zeta(2.0) = pi^2 / 6
    int64_t total = 0;
    for (int k = 1; k <= v->n; k++)
        total += (int64_t)((double)n * pow((double)k, -2.0) / zeta2);
    const char **list = malloc((size_t)(total ? total : 1) * sizeof *list);
    if (!list) return err_set(ERR_NOMEM, "out of memory");
    int64_t q = 0;
    for (int k = 1; k <= v->n; k++) {
        int64_t c = (int64_t)((double)n * pow((double)k, -2.0) / zeta2);
        for (int64_t i = 0; i < c; i++)
            list[q++] = v->w[k - 1];
    }
    ev_mt_t fresh;
    ev_py_seed(&fresh, g->cfg->seed);
    ev_py_shuffle(&fresh, list, (size_t)q, sizeof *list);
    strbuf_t ctx = {0};
    for (int64_t i = 0; i < q; i++) {
        if (i) strbuf_putn(&ctx, " ", 1);
        strbuf_puts(&ctx, list[i]);
    }
    free(list);
    strbuf_t tb = {0};
    strbuf_puts(&tb, fwe_template);
    strbuf_puts(&tb, fwe_prefix);
    const char *fnames[1] = {"context"}, *vals[1] = {ctx.s ? ctx.s : ""};
    text->n = 0;
    if (text->s) text->s[0] = 0;
    if (!tb.oom) fill(text, tb.s, fnames, vals, 1);
    int oom = ctx.oom || tb.oom || text->oom;
    free(ctx.s), free(tb.s);
    return oom ? err_set(ERR_NOMEM, "out of memory") : 0;
}

// qa.py generate_input_output(index, n)
static int build_qa(gen_t *g, int n, strbuf_t *text, ev_strs_t *outs) {
    const ev_qa_t *qa = g->t->qa == 1 ? &g->d->squad : &g->d->hotpot;
    const struct ev_qa_item *it = &qa->qas[g->qa_index];
    int *all = malloc((size_t)(n > 0 ? n : 1) * sizeof *all), k = 0, rc = 0;
    if (!all) return err_set(ERR_NOMEM, "out of memory");
    if (n < qa->n_docs) {
        if (n < it->n_ctx) {
            free(all);
            return err_set(ERR_INPUT, "%d documents cannot hold the %d of question %d", n, it->n_ctx, g->qa_index);
        }
        for (int i = 0; i < it->n_ctx; i++)
            all[k++] = it->ctx[i];
        if (n - it->n_ctx > it->n_more) {
            for (int i = 0; i < it->n_more; i++)
                all[k++] = it->more[i];
            int nr = 0, *rest = malloc((size_t)qa->n_docs * sizeof *rest);
            int64_t *sel = malloc((size_t)(n > 0 ? n : 1) * sizeof *sel);
            if (!rest || !sel) rc = err_set(ERR_NOMEM, "out of memory");
            for (int i = 0; rc == 0 && i < qa->n_docs; i++) {
                int used = 0;
                for (int j = 0; j < it->n_ctx && !used; j++)
                    used = it->ctx[j] == i;
                for (int j = 0; j < it->n_more && !used; j++)
                    used = it->more[j] == i;
                if (!used) rest[nr++] = i;
            }
            int want = n - it->n_ctx - it->n_more;
            if (rc == 0 && ev_py_sample(&g->py, nr, want, sel) < 0) rc = err_set(ERR_NOMEM, "out of memory");
            for (int i = 0; rc == 0 && i < want; i++)
                all[k++] = rest[sel[i]];
            free(rest), free(sel);
        } else {
            int64_t sel[4096];
            int want = n - it->n_ctx;
            if (want > 4096 || ev_py_sample(&g->py, it->n_more, want, sel) < 0)
                rc = err_set(ERR_NOMEM, "out of memory");
            for (int i = 0; rc == 0 && i < want; i++)
                all[k++] = it->more[sel[i]];
        }
    } else {
        for (int i = 0; i < n; i++)
            all[k++] = i % qa->n_docs;
    }
    ev_mt_t fresh;
    ev_py_seed(&fresh, g->cfg->seed);
    if (rc == 0) ev_py_shuffle(&fresh, all, (size_t)k, sizeof *all);
    strbuf_t ctx = {0};
    for (int i = 0; rc == 0 && i < k; i++)
        strbuf_printf(&ctx, i ? "\n\nDocument %d:\n%s" : "Document %d:\n%s", i + 1, qa->docs[all[i]]);
    strbuf_t tb = {0};
    strbuf_puts(&tb, qa_template);
    strbuf_puts(&tb, qa_prefix);
    const char *fnames[2] = {"context", "query"}, *vals[2] = {ctx.s ? ctx.s : "", it->query};
    if (rc == 0 && !tb.oom && !ctx.oom) fill(text, tb.s, fnames, vals, 2);
    for (int i = 0; rc == 0 && i < it->outputs.n; i++)
        rc = ev_strs_add(outs, it->outputs.s[i], strlen(it->outputs.s[i]));
    free(all), free(ctx.s), free(tb.s);
    return rc;
}

typedef int (*build_fn)(gen_t *g, int n, strbuf_t *text, ev_strs_t *outs);

// Builds a sample of size n and counts its tokens (plus `extra`).
static int build_count(gen_t *g, build_fn f, int n, strbuf_t *text, ev_strs_t *outs, int *tokens) {
    text->n = 0;
    if (text->s) text->s[0] = 0;
    ev_strs_free(outs);
    TRY(f(g, n, text, outs));
    if (text->oom || !text->s) return err_set(ERR_NOMEM, "out of memory");
    return count_tokens(g, text->s, tokens);
}

// The largest haystack size whose sample fits max_len with `extra` tokens
// (max_new, VT's example) beside it: probe one sample of size `probe` for the
// tokens per unit, then binary-search [inc, upper] with a fresh sample per
// step (eval.md §1.4). cwe: upper = int(max_len // per_unit) * 2.
static int fit_length(gen_t *g, build_fn f, int inc, int probe, int extra, int max_len, int cwe, int *best) {
    strbuf_t text = {0};
    ev_strs_t outs = {0};
    int tokens = 0;
    int rc = build_count(g, f, probe, &text, &outs, &tokens);
    int lo = inc, hi = 0, found = -1;
    if (rc == 0) {
        double per = (double)tokens / probe;
        hi = cwe ? (int)floor((double)max_len / per) * 2 : (int)((double)max_len / per * 3);
        if (hi < 2 * inc) hi = 2 * inc;
    }
    while (rc == 0 && lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cwe && mid > g->d->n_cwe) { // beyond the word pool: too long (RULER 2024's cap)
            hi = mid - 1;
            continue;
        }
        rc = build_count(g, f, mid, &text, &outs, &tokens);
        if (rc < 0) break;
        if (tokens + extra <= max_len)
            found = mid, lo = mid + 1;
        else
            hi = mid - 1;
    }
    free(text.s);
    ev_strs_free(&outs);
    *best = found >= 0 ? found : inc;
    return rc;
}

// One sample at size n, shrinking by inc until it fits (fails below inc).
static int fit_sample(gen_t *g, build_fn f, int n, int inc, int extra, int max_len, strbuf_t *text, ev_strs_t *outs,
                      int *used, int *tokens) {
    for (;;) {
        TRY(build_count(g, f, n, text, outs, tokens));
        if (*tokens + extra <= max_len) break;
        if (n <= inc)
            return err_set(ERR_INPUT, "%s: a sample of the smallest haystack (%d) takes %d tokens, more than %d",
                           g->t->name, n, *tokens + extra, max_len);
        n -= inc;
    }
    *used = n;
    return 0;
}

// Splits text at the last occurrence of the answer prefix's first 10 characters.
static int finish_sample(const char *text, const char *prefix, ev_strs_t *outs, int tokens, int max_new, int used,
                         ev_ruler_sample_t *s) {
    char key[11];
    snprintf(key, sizeof key, "%.10s", prefix);
    const char *cut = NULL;
    for (const char *p = text; (p = strstr(p, key)); p++)
        cut = p;
    if (!cut) return err_set(ERR_INPUT, "answer prefix '%s' not in the sample", key);
    s->input = strndup(text, (size_t)(cut - text));
    s->answer_prefix = strdup(cut);
    s->outputs = *outs;
    memset(outs, 0, sizeof *outs);
    s->length = tokens + max_new;
    s->n_haystack = used;
    if (!s->input || !s->answer_prefix) return err_set(ERR_NOMEM, "out of memory");
    return 0;
}

static int gen_vt_icl(gen_t *g) {
    // VT's one-shot example: 3-letter names, value 12345, bare template, 500 tokens
    g->icl_build = 1;
    int n, used, tokens, rc;
    strbuf_t text = {0};
    ev_strs_t outs = {0};
    rc = fit_length(g, build_vt, 5, 5, 0, 500, 0, &n);
    if (rc == 0) rc = fit_sample(g, build_vt, n, 5, 0, 500, &text, &outs, &used, &tokens);
    g->icl_build = 0;
    if (rc == 0) {
        strbuf_t icl = {0};
        strbuf_puts(&icl, text.s);
        for (int i = 0; i < outs.n; i++) {
            strbuf_puts(&icl, " ");
            strbuf_puts(&icl, outs.s[i]);
        }
        strbuf_puts(&icl, "\n");
        g->vt_icl = icl.s;
        if (icl.oom || !icl.s) rc = err_set(ERR_NOMEM, "out of memory");
        if (rc == 0) rc = count_tokens(g, g->vt_icl, &g->vt_icl_tokens);
    }
    free(text.s);
    ev_strs_free(&outs);
    return rc;
}

// randomize_icl: the example's answer names (its last hops + 1 words) replaced
// by fresh names of the same length everywhere, then 12345 by a new value.
static int vt_insert_icl(gen_t *g, strbuf_t *text) {
    char *icl = strdup(g->vt_icl);
    if (!icl) return err_set(ERR_NOMEM, "out of memory");
    char words[5][64];
    int nw = 0;
    const char *e = icl + strlen(icl);
    while (nw < 5 && e > icl) { // last 5 whitespace-separated words
        while (e > icl && (e[-1] == ' ' || e[-1] == '\n'))
            e--;
        const char *b = e;
        while (b > icl && b[-1] != ' ' && b[-1] != '\n')
            b--;
        snprintf(words[4 - nw], sizeof words[0], "%.*s", (int)(e - b < 63 ? e - b : 63), b);
        nw++;
        e = b;
    }
    int rc = 0;
    for (int i = 0; i < 5 && rc == 0; i++) {
        char nn[64];
        random_name(g, (int)strlen(words[i]), nn);
        rc = ev_replace_all(&icl, words[i], nn);
    }
    char v[16];
    snprintf(v, sizeof v, "%lld", (long long)ev_np_randint(&g->np, 10000, 99999));
    if (rc == 0) rc = ev_replace_all(&icl, "12345", v);
    const char *at = text->s ? strstr(text->s, "Memorize and track t") : NULL;
    if (rc == 0 && !at) rc = err_set(ERR_INPUT, "vt: template start not found");
    if (rc == 0) {
        strbuf_t out = {0};
        strbuf_putn(&out, text->s, (size_t)(at - text->s));
        strbuf_puts(&out, icl);
        strbuf_puts(&out, "\n");
        strbuf_puts(&out, at);
        if (out.oom) rc = err_set(ERR_NOMEM, "out of memory");
        free(text->s);
        *text = out;
    }
    free(icl);
    return rc;
}

// FWE's own size search (eval.md §1.5.4): sample 0 comes from the search.
static int generate_fwe(gen_t *g, ev_ruler_sample_t *out) {
    const ev_ruler_cfg_t *cfg = g->cfg;
    int L = cfg->max_len - g->t->max_new, vocab_size = L / 50, inc = L / 32, n = L / 6, tokens = 0, rc = 0;
    if (vocab_size < 4 || inc < 1) return err_set(ERR_INPUT, "fwe: length %d is too short", cfg->max_len);
    strbuf_t text = {0};
    for (int s = 0; s < cfg->n_samples && rc == 0; s++) {
        fwe_vocab_t v = {0};
        rc = fwe_vocab(g, vocab_size, &v);
        int ns = n;
        if (rc == 0) rc = fwe_text(g, &v, ns, &text);
        if (rc == 0) rc = count_tokens(g, text.s, &tokens);
        if (s == 0) {
            while (rc == 0 && tokens < L) {
                ns += inc;
                if ((rc = fwe_text(g, &v, ns, &text)) == 0) rc = count_tokens(g, text.s, &tokens);
            }
            ns -= inc;
            n = ns;
            if (rc == 0 && (rc = fwe_text(g, &v, ns, &text)) == 0) rc = count_tokens(g, text.s, &tokens);
        } else {
            while (rc == 0 && tokens > L) {
                ns -= inc;
                if (ns <= 0)
                    rc = err_set(ERR_INPUT, "fwe: no text fits %d tokens", L);
                else if ((rc = fwe_text(g, &v, ns, &text)) == 0)
                    rc = count_tokens(g, text.s, &tokens);
            }
        }
        ev_strs_t outs = {0};
        for (int i = 1; rc == 0 && i < 4; i++)
            rc = ev_strs_add(&outs, v.w[i], strlen(v.w[i]));
        if (rc == 0) rc = finish_sample(text.s, fwe_prefix, &outs, tokens, g->t->max_new, ns, &out[s]);
        ev_strs_free(&outs);
        free(v.w);
    }
    free(text.s);
    return rc;
}

int ev_ruler_generate(const ev_ruler_data_t *d, const ev_ruler_task_t *t, const ev_ruler_cfg_t *cfg,
                      ev_ruler_sample_t *out) {
    memset(out, 0, (size_t)cfg->n_samples * sizeof *out);
    gen_t g = {.d = d, .t = t, .cfg = cfg};
    ev_py_seed(&g.py, cfg->seed);
    ev_np_seed(&g.np, (uint32_t)cfg->seed);
    if ((t->gen == EV_GEN_NIAH && (t->k == EV_KEY_WORDS || t->v == EV_KEY_WORDS)) || t->gen == EV_GEN_CWE)
        if (!d->have_words) return err_set(ERR_INPUT, "%s: the word lists are not loaded", t->name);
    if (t->gen == EV_GEN_NIAH && t->hay == EV_HAY_ESSAY && !d->have_hay)
        return err_set(ERR_INPUT, "%s: the essay haystack is not loaded", t->name);
    if (t->gen == EV_GEN_QA && !(t->qa == 1 ? d->have_squad : d->have_hotpot))
        return err_set(ERR_INPUT, "%s: no %s file given", t->name, t->qa == 1 ? "SQuAD" : "HotpotQA");
    if (t->gen == EV_GEN_FWE) return generate_fwe(&g, out);

    build_fn f = NULL;
    const char *prefix = NULL;
    int inc = 10, probe, extra = t->max_new, rc = 0, small = cfg->max_len < 4096;
    switch (t->gen) {
    case EV_GEN_NIAH:
        f = build_niah, prefix = niah_prefix;
        inc = t->hay == EV_HAY_ESSAY ? 500 : small ? 5 : 25;
        break;
    case EV_GEN_VT:
        f = build_vt, prefix = vt_prefix, inc = small ? 5 : 10;
        rc = gen_vt_icl(&g);
        extra += g.vt_icl_tokens;
        break;
    case EV_GEN_CWE:
        f = build_cwe, prefix = cwe_prefix;
        g.cwe_pool = malloc((size_t)d->n_cwe * sizeof *g.cwe_pool);
        if (!g.cwe_pool) return err_set(ERR_NOMEM, "out of memory");
        memcpy(g.cwe_pool, d->cwe_pool, (size_t)d->n_cwe * sizeof *g.cwe_pool);
        {
            ev_mt_t fresh;
            ev_py_seed(&fresh, cfg->seed);
            ev_py_shuffle(&fresh, g.cwe_pool, (size_t)d->n_cwe, sizeof *g.cwe_pool);
        }
        break;
    case EV_GEN_QA: {
        f = build_qa, prefix = qa_prefix;
        const ev_qa_t *qa = t->qa == 1 ? &d->squad : &d->hotpot;
        if (cfg->n_samples > qa->n_qas)
            return err_set(ERR_INPUT, "%s: %d samples asked, the file has %d questions", t->name, cfg->n_samples,
                           qa->n_qas);
        break;
    }
    default: return err_set(ERR_INPUT, "%s: unknown generator", t->name);
    }
    probe = t->gen == EV_GEN_CWE ? 4096 : inc;
    if (t->gen == EV_GEN_CWE && probe > d->n_cwe) probe = d->n_cwe;
    int N = 0;
    if (rc == 0) rc = fit_length(&g, f, inc, probe, extra, cfg->max_len, t->gen == EV_GEN_CWE, &N);
    strbuf_t text = {0};
    ev_strs_t outs = {0};
    for (int s = 0; s < cfg->n_samples && rc == 0; s++) {
        int used = 0, tokens = 0;
        g.qa_index = s;
        rc = fit_sample(&g, f, N, inc, extra, cfg->max_len, &text, &outs, &used, &tokens);
        if (rc == 0 && t->gen == EV_GEN_VT) {
            rc = vt_insert_icl(&g, &text);
            if (rc == 0) rc = count_tokens(&g, text.s, &tokens);
        }
        if (rc == 0) rc = finish_sample(text.s, prefix, &outs, tokens, t->max_new, used, &out[s]);
    }
    free(text.s);
    ev_strs_free(&outs);
    free(g.cwe_pool);
    free(g.vt_icl);
    return rc;
}

void ev_ruler_sample_free(ev_ruler_sample_t *s) {
    free(s->input), free(s->answer_prefix);
    ev_strs_free(&s->outputs);
    memset(s, 0, sizeof *s);
}

// ---- scoring (RULER scripts/eval) ----------------------------------------------------

void ev_ruler_postprocess(char *pred) {
    size_t n = strlen(pred), b, e;
    ev_strip_span(pred, n, &b, &e);
    memmove(pred, pred + b, e - b);
    pred[e - b] = 0;
    for (char *p = pred; *p; p++)
        if ((unsigned char)*p < 0x20) *p = '\n';
    n = strlen(pred);
    ev_strip_span(pred, n, &b, &e);
    memmove(pred, pred + b, e - b);
    pred[e - b] = 0;
}

static int contains_ci(const char *hay_lower, const char *ref) {
    char *r = ev_lower_dup(ref);
    int in = r && strstr(hay_lower, r) != NULL;
    free(r);
    return in;
}

double ev_ruler_match_all(const char *pred, char *const *refs, int n) {
    char *p = ev_lower_dup(pred);
    double hit = 0;
    for (int i = 0; p && i < n; i++)
        hit += contains_ci(p, refs[i]);
    free(p);
    return n ? hit / n : 0;
}

double ev_ruler_match_part(const char *pred, char *const *refs, int n) {
    char *p = ev_lower_dup(pred);
    int any = 0;
    for (int i = 0; p && i < n && !any; i++)
        any = contains_ci(p, refs[i]);
    free(p);
    return any;
}
