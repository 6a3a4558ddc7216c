#include "eval/ev_text.h"

#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <wctype.h>

#include "base/err.h"
#include "base/fs.h"
#include "base/utf8.h"

int ev_is_space(uint32_t cp) {
    if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x1f);
    return cp == 0x85 || cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

// The code point at s[i..n) and its length; an invalid byte counts as one
// non-space code point of its own value + 0xdc00 (Python's surrogateescape).
static int next_cp(const char *s, size_t n, size_t i, uint32_t *cp) {
    int l = utf8_next((const uint8_t *)s + i, n - i, cp);
    if (l > 0) return l;
    *cp = 0xdc00 + (uint8_t)s[i];
    return 1;
}

void ev_strip_span(const char *s, size_t n, size_t *b, size_t *e) {
    size_t i = 0, end = 0;
    int started = 0;
    *b = n;
    while (i < n) {
        uint32_t cp;
        int l = next_cp(s, n, i, &cp);
        if (!ev_is_space(cp)) {
            if (!started) *b = i, started = 1;
            end = i + (size_t)l;
        }
        i += (size_t)l;
    }
    if (!started)
        *b = *e = 0;
    else
        *e = end;
}

char *ev_strip_dup(const char *s, size_t n) {
    size_t b, e;
    ev_strip_span(s, n, &b, &e);
    return strndup(s + b, e - b);
}

static locale_t utf8_loc;
static pthread_once_t utf8_once = PTHREAD_ONCE_INIT;
static void utf8_loc_init(void) { utf8_loc = newlocale(LC_CTYPE_MASK, "C.UTF-8", (locale_t)0); }

char *ev_lower_dup(const char *s) {
    pthread_once(&utf8_once, utf8_loc_init);
    size_t n = strlen(s);
    char *out = malloc(n * 2 + 1); // lowering can lengthen a 2-byte code point to 3 bytes (U+023A)
    if (!out) return NULL;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int l = utf8_next((const uint8_t *)s + i, n - i, &cp);
        if (l <= 0) { // not UTF-8: copy the byte
            out[o++] = s[i++];
            continue;
        }
        uint32_t lc = cp;
        if (cp < 0x80)
            lc = cp >= 'A' && cp <= 'Z' ? cp + 32 : cp;
        else if (utf8_loc)
            lc = (uint32_t)towlower_l((wint_t)cp, utf8_loc);
        o += (size_t)utf8_put(lc, out + o);
        i += (size_t)l;
    }
    out[o] = 0;
    return out;
}

int64_t ev_codepoints(const char *s, size_t n) {
    int64_t c = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += (size_t)next_cp(s, n, i, &cp);
        c++;
    }
    return c;
}

int64_t ev_count_words(const char *s, size_t n) {
    int64_t runs = 0;
    int in = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += (size_t)next_cp(s, n, i, &cp);
        int sp = ev_is_space(cp);
        if (sp && !in) runs++;
        in = sp;
    }
    return runs + 1;
}

int ev_replace_all(char **s, const char *from, const char *to) {
    size_t fl = strlen(from);
    if (!fl || !strstr(*s, from)) return 0;
    strbuf_t b = {0};
    const char *p = *s, *q;
    while ((q = strstr(p, from))) {
        strbuf_putn(&b, p, (size_t)(q - p));
        strbuf_puts(&b, to);
        p = q + fl;
    }
    strbuf_puts(&b, p);
    if (b.oom) {
        free(b.s);
        return err_set(ERR_NOMEM, "out of memory");
    }
    free(*s);
    *s = b.s;
    return 0;
}

int ev_strs_add(ev_strs_t *l, const char *s, size_t n) {
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 64;
        char **p = realloc(l->s, (size_t)cap * sizeof *p);
        if (!p) return err_set(ERR_NOMEM, "out of memory");
        l->s = p, l->cap = cap;
    }
    if (!(l->s[l->n] = strndup(s, n))) return err_set(ERR_NOMEM, "out of memory");
    l->n++;
    return 0;
}

void ev_strs_free(ev_strs_t *l) {
    for (int i = 0; i < l->n; i++)
        free(l->s[i]);
    free(l->s);
    memset(l, 0, sizeof *l);
}

int ev_read_lines(const char *path, ev_strs_t *out) {
    char *buf;
    size_t len;
    TRY(fs_read_all(path, &buf, &len));
    int rc = 0;
    for (size_t i = 0; i < len && rc == 0;) {
        size_t j = i;
        while (j < len && buf[j] != '\n')
            j++;
        size_t b, e;
        ev_strip_span(buf + i, j - i, &b, &e); // rstrip: keep leading text as is
        size_t end = e ? i + e : i;
        if (end > i) rc = ev_strs_add(out, buf + i, end - i);
        i = j + 1;
    }
    free(buf);
    return rc;
}

int ev_read_jsonl(const char *path, cJSON ***items, int *n) {
    char *buf;
    size_t len;
    *items = NULL, *n = 0;
    TRY(fs_read_all(path, &buf, &len));
    int cap = 0, line = 0, rc = 0;
    for (size_t i = 0; i < len && rc == 0;) {
        size_t j = i;
        while (j < len && buf[j] != '\n')
            j++;
        line++;
        size_t b, e;
        ev_strip_span(buf + i, j - i, &b, &e);
        if (e > b) {
            cJSON *o = cJSON_ParseWithLength(buf + i + b, e - b);
            if (!o || !cJSON_IsObject(o)) {
                cJSON_Delete(o);
                rc = err_set(ERR_INPUT, "%s: line %d: not a JSON object", path, line);
                break;
            }
            if (*n == cap) {
                cap = cap ? cap * 2 : 256;
                cJSON **p = realloc(*items, (size_t)cap * sizeof *p);
                if (!p) {
                    cJSON_Delete(o);
                    rc = err_set(ERR_NOMEM, "out of memory");
                    break;
                }
                *items = p;
            }
            (*items)[(*n)++] = o;
        }
        i = j + 1;
    }
    free(buf);
    if (rc < 0) {
        ev_free_jsonl(*items, *n);
        *items = NULL, *n = 0;
    }
    return rc;
}

void ev_free_jsonl(cJSON **items, int n) {
    for (int i = 0; i < n; i++)
        cJSON_Delete(items[i]);
    free(items);
}

// Abbreviations after which a period does not end a sentence (lower case,
// without the final period).
static const char *abbrev[] = {"mr",  "mrs", "ms",  "dr",   "prof", "st",  "vs",  "etc", "e.g",  "i.e", "inc",
                               "jr",  "sr",  "co",  "corp", "ltd",  "no",  "vol", "fig", "u.s",  "cf",  "approx",
                               "jan", "feb", "mar", "apr",  "jun",  "jul", "aug", "sep", "sept", "oct", "nov",
                               "dec", "mt",  "ft",  "gen",  "gov",  "sen", "rep", "rev", "u.k",  "a.m", "p.m"};

static int is_abbrev(const char *w, size_t n) {
    if (n == 1 && ((w[0] >= 'A' && w[0] <= 'Z') || (w[0] >= 'a' && w[0] <= 'z'))) return 1; // an initial
    for (size_t k = 0; k < sizeof abbrev / sizeof *abbrev; k++) {
        size_t l = strlen(abbrev[k]);
        if (l != n) continue;
        size_t i = 0;
        while (i < n && (w[i] | 0x20) == abbrev[k][i])
            i++;
        if (i == n) return 1;
    }
    return 0;
}

static int is_closing(char c) { return c == '"' || c == '\'' || c == ')' || c == ']'; }

int ev_split_sentences(const char *text, size_t n, size_t **starts, size_t **ends, int *count) {
    int cap = 256, k = 0;
    size_t *s = malloc((size_t)cap * sizeof *s), *e = malloc((size_t)cap * sizeof *e);
    if (!s || !e) {
        free(s), free(e);
        return err_set(ERR_NOMEM, "out of memory");
    }
    size_t begin = 0;
    int oom = 0;
    for (size_t i = 0; i <= n && !oom; i++) {
        size_t cut = 0; // end of a sentence found at i (exclusive), 0 = none
        if (i == n)
            cut = n;
        else if (text[i] == '.' || text[i] == '?' || text[i] == '!') {
            size_t j = i + 1;
            while (j < n && (text[j] == '.' || text[j] == '?' || text[j] == '!'))
                j++;
            while (j < n && is_closing(text[j]))
                j++;
            uint32_t cp = 0;
            if (j < n) next_cp(text, n, j, &cp);
            if (j == n || ev_is_space(cp)) {
                int abbr = 0;
                if (text[i] == '.' && j == i + 1) { // the word before a lone period
                    size_t w = i;
                    while (w > begin && text[w - 1] != ' ' && text[w - 1] != '\n' && text[w - 1] != '\t' &&
                           text[w - 1] != '(' && text[w - 1] != '"')
                        w--;
                    abbr = is_abbrev(text + w, i - w);
                }
                if (!abbr) cut = j;
            }
            if (!cut) i = j - 1;
        }
        if (!cut) continue;
        size_t b, en;
        ev_strip_span(text + begin, cut - begin, &b, &en);
        if (en > b) {
            if (k == cap) {
                size_t *s2 = realloc(s, (size_t)cap * 2 * sizeof *s);
                if (s2) s = s2;
                size_t *e2 = s2 ? realloc(e, (size_t)cap * 2 * sizeof *e) : NULL;
                if (e2)
                    e = e2, cap *= 2;
                else
                    oom = 1;
            }
            if (!oom) s[k] = begin + b, e[k] = begin + en, k++;
        }
        begin = cut;
        i = cut > i ? cut - 1 : i;
    }
    if (oom) {
        free(s), free(e);
        return err_set(ERR_NOMEM, "out of memory");
    }
    *starts = s, *ends = e, *count = k;
    return 0;
}

double ev_round2(double x) {
    char buf[64];
    snprintf(buf, sizeof buf, "%.2f", x);
    return strtod(buf, NULL);
}
