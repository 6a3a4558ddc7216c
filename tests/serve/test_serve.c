// hylo serve end to end: the real binary on the default model (CPU), started
// on a free port, and real HTTP requests through the system's curl. Greedy
// answers must equal 'hylo chat' / 'hylo generate' for the same prompt, alone,
// streamed and four at a time; errors are OpenAI-shaped; a client that goes
// away is cancelled; SIGTERM ends the server cleanly (exit 0: under
// MODE=asan that includes LeakSanitizer's check); a token budget per turn
// (--max-batched-tokens) bounds every forward and changes no answer;
// log-probabilities come one entry a token, in OpenAI's two shapes.
#include <cjson/cJSON.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/fs.h"
#include "testutil.h"

typedef struct {
    pid_t pid;
    int port;
    char key[64]; // API key to send ("" none)
} server_t;

static server_t S; // the shared server of most tests (group setup)

// Starts `hylo serve MODEL --port 0 ARGS` (env: "VAR=value " prefix or "")
// and reads the port it prints.
static void server_start(server_t *s, const char *env, const char *args) {
    const char *bin = getenv("HYLO_BIN");
    if (!bin) {
        printf("HYLO_BIN is not set (run through make test)\n");
        skip();
    }
    const char *model = tu_model_path();
    memset(s, 0, sizeof *s);
    int fd[2];
    assert_int_equal(pipe(fd), 0);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s exec %s serve %s --port 0 --threads 2 %s 2>>%s", env, bin, model, args,
             tu_tmp_path("server.log"));
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fd[1], 1);
        close(fd[0]), close(fd[1]);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    FILE *f = fdopen(fd[0], "r");
    char line[512];
    while (fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "http://127.0.0.1:");
        if (p) {
            s->port = atoi(p + strlen("http://127.0.0.1:"));
            break;
        }
    }
    fclose(f); // the server's later output goes nowhere (it writes none)
    s->pid = pid;
    printf("  %s -> port %d\n", cmd, s->port);
    if (s->port <= 0) {
        char *log;
        if (fs_read_all(tu_tmp_path("server.log"), &log, NULL) == 0) printf("%s", log), free(log);
        fail_msg("the server did not start");
    }
}

// SIGTERM, and the server must exit 0 (clean shutdown, no leaks under asan).
static void server_stop(server_t *s) {
    if (s->pid <= 0) return;
    kill(s->pid, SIGTERM);
    int st;
    assert_int_equal(waitpid(s->pid, &st, 0), s->pid);
    s->pid = 0;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        char *log;
        if (fs_read_all(tu_tmp_path("server.log"), &log, NULL) == 0) printf("%s", log), free(log);
        fail_msg("the server ended with status %d", st);
    }
}

// ---- HTTP through curl --------------------------------------------------------------

typedef struct {
    FILE *p;
    char out[300];
} call_t;

// Starts a request (body NULL: GET); curl_args are extra options.
static void call_start(call_t *c, const server_t *s, const char *path, const char *body, const char *curl_args) {
    static int seq;
    char in[300], cmd[2048], auth[128] = "";
    snprintf(in, sizeof in, "%s", tu_tmp_path("req"));
    snprintf(in + strlen(in), sizeof in - strlen(in), "%d.json", seq);
    snprintf(c->out, sizeof c->out, "%s", tu_tmp_path("resp"));
    snprintf(c->out + strlen(c->out), sizeof c->out - strlen(c->out), "%d.txt", seq++);
    if (body) {
        FILE *f = fopen(in, "w");
        assert_non_null(f);
        fputs(body, f);
        fclose(f);
    }
    if (s->key[0]) snprintf(auth, sizeof auth, "-H 'Authorization: Bearer %s'", s->key);
    snprintf(cmd, sizeof cmd, "curl -s -N -o %s -w '%%{http_code}' %s %s%s%s %s http://127.0.0.1:%d%s", c->out, auth,
             body ? "-H 'Content-Type: application/json' --data-binary @" : "", body ? in : "", "",
             curl_args ? curl_args : "", s->port, path);
    c->p = popen(cmd, "r");
    assert_non_null(c->p);
}

// Waits for it: the HTTP status (0: no response) and the body (malloc'ed).
static int call_end(call_t *c, char **resp) {
    char code[16] = "";
    if (!fgets(code, sizeof code, c->p)) code[0] = 0;
    pclose(c->p);
    if (fs_read_all(c->out, resp, NULL) != 0) *resp = strdup("");
    return atoi(code);
}

static int http(const server_t *s, const char *path, const char *body, char **resp) {
    call_t c;
    call_start(&c, s, path, body, NULL);
    return call_end(&c, resp);
}

// ---- expected answers ------------------------------------------------------------------

// stdout of `hylo ARGS` with the trailing newline the CLI adds removed.
static char *cli_output(const char *args) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s %s 2>/dev/null", getenv("HYLO_BIN"), args);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t cap = 1 << 16;
    char *s = malloc(cap);
    size_t n = fread(s, 1, cap - 1, p);
    assert_int_equal(pclose(p), 0);
    s[n] = 0;
    if (n && s[n - 1] == '\n') s[n - 1] = 0;
    return s;
}

static const char *Q = "What is the capital of France?";
static const char *P = "The capital of France is";
// A prompt whose greedy continuation goes on for long (counting), for the
// requests that must still be running when the test acts (whatever the speed).
static const char *LONG = "1, 2, 3, 4, 5,";

static char *chat_body(const char *msg, int max_tokens, const char *extra) {
    static char b[4096];
    snprintf(b, sizeof b,
             "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"%s\"}], \"max_tokens\": %d, "
             "\"temperature\": 0%s}",
             msg, max_tokens, extra ? extra : "");
    return b;
}

static char *completion_body(const char *prompt, int max_tokens, const char *extra) {
    static char b[16384];
    snprintf(b, sizeof b, "{\"prompt\": \"%s\", \"max_tokens\": %d, \"temperature\": 0%s}", prompt, max_tokens,
             extra ? extra : "");
    return b;
}

// choices[0]'s text (message.content or text) of a response; finish and usage
// checked. want_finish NULL: the finish the budget of max_new tokens implies
// ("stop" when fewer came, else "length"): the CLI's greedy chat answer may or
// may not end within it (on quantised weights SmolLM2's first token is a near
// tie, docs/RESULTS.md).
static char *answer_within(const char *resp, const char *want_finish, int max_new, int *n_new);
static char *answer(const char *resp, const char *want_finish, int *n_new) {
    return answer_within(resp, want_finish, 0, n_new);
}
static char *answer_within(const char *resp, const char *want_finish, int max_new, int *n_new) {
    cJSON *j = cJSON_Parse(resp);
    if (!j) fail_msg("not JSON: %s", resp);
    cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    assert_non_null(ch);
    cJSON *msg = cJSON_GetObjectItem(ch, "message");
    cJSON *t = msg ? cJSON_GetObjectItem(msg, "content") : cJSON_GetObjectItem(ch, "text");
    assert_true(cJSON_IsString(t));
    cJSON *u = cJSON_GetObjectItem(j, "usage");
    int np = cJSON_GetObjectItem(u, "prompt_tokens")->valueint,
        nn = cJSON_GetObjectItem(u, "completion_tokens")->valueint;
    assert_string_equal(cJSON_GetObjectItem(ch, "finish_reason")->valuestring, want_finish    ? want_finish
                                                                               : nn < max_new ? "stop"
                                                                                              : "length");
    assert_true(np > 0);
    assert_int_equal(cJSON_GetObjectItem(u, "total_tokens")->valueint, np + nn);
    assert_non_null(cJSON_GetObjectItem(j, "id"));
    assert_non_null(cJSON_GetObjectItem(j, "created"));
    if (n_new) *n_new = nn;
    char *s = strdup(t->valuestring);
    cJSON_Delete(j);
    return s;
}

// The concatenated deltas of an event stream; the stream must end with
// "data: [DONE]" and carry one finish_reason (returned in finish). pieces:
// the deltas' texts, when not NULL (up to 64).
static char *stream_text(const char *sse, char *finish, char **pieces, int *n_pieces) {
    char *out = calloc(1, strlen(sse) + 1);
    const char *p = sse, *last = NULL;
    int np = 0;
    finish[0] = 0;
    while ((p = strstr(p, "data: "))) {
        p += 6;
        const char *e = strstr(p, "\n\n");
        assert_non_null(e);
        last = p;
        if (!strncmp(p, "[DONE]", 6)) break;
        cJSON *j = cJSON_ParseWithLength(p, (size_t)(e - p));
        assert_non_null(j);
        cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
        if (ch) {
            cJSON *d = cJSON_GetObjectItem(ch, "delta");
            cJSON *t = d ? cJSON_GetObjectItem(d, "content") : cJSON_GetObjectItem(ch, "text");
            if (cJSON_IsString(t) && t->valuestring[0]) {
                strcat(out, t->valuestring);
                if (pieces && np < 64) pieces[np++] = strdup(t->valuestring);
            }
            cJSON *f = cJSON_GetObjectItem(ch, "finish_reason");
            if (cJSON_IsString(f)) {
                assert_string_equal(finish, ""); // one finish_reason
                strcpy(finish, f->valuestring);
            }
        }
        cJSON_Delete(j);
        p = e;
    }
    assert_non_null(last);
    assert_memory_equal(last, "[DONE]", 6); // the stream's last event
    if (n_pieces) *n_pieces = np;
    return out;
}

// OpenAI's error body: {"error": {"message", "type", "param", "code"}};
// type invalid_request_error for a 400 (param NULL: not checked).
static void expect_error(const char *resp, int status, const char *param) {
    cJSON *j = cJSON_Parse(resp);
    if (!j) fail_msg("not JSON: %s", resp);
    cJSON *e = cJSON_GetObjectItem(j, "error");
    assert_non_null(e);
    assert_true(cJSON_IsString(cJSON_GetObjectItem(e, "message")));
    assert_true(cJSON_IsString(cJSON_GetObjectItem(e, "type")));
    if (status == 400) assert_string_equal(cJSON_GetObjectItem(e, "type")->valuestring, "invalid_request_error");
    assert_non_null(cJSON_GetObjectItem(e, "param"));
    assert_non_null(cJSON_GetObjectItem(e, "code"));
    if (param) assert_string_equal(cJSON_GetObjectItem(e, "param")->valuestring, param);
    cJSON_Delete(j);
}

// A metric's value in a /metrics text (-1 when absent).
static double metric(const server_t *s, const char *name) {
    char *m;
    assert_int_equal(http(s, "/metrics", NULL, &m), 200);
    double v = -1;
    size_t n = strlen(name);
    for (const char *p = m; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (!strncmp(p, name, n) && p[n] == ' ') v = atof(p + n + 1);
    free(m);
    return v;
}

// ---- the tests --------------------------------------------------------------------------

static char *want_chat, *want_completion; // the CLI's greedy answers, 8 tokens

static int setup(void **state) {
    tu_tmpdir_setup(state);
    return 0;
}

static int teardown(void **state) {
    if (S.pid > 0) {
        kill(S.pid, SIGTERM);
        waitpid(S.pid, NULL, 0);
    }
    free(want_chat), free(want_completion);
    return tu_tmpdir_teardown(state);
}

// The CLI's greedy answers (want_chat, want_completion), computed once (on
// all cores, the server on 2: the results do not depend on the thread count,
// tests/backend/test_quant_ops.c test_threads_invariant).
static void cli_answers(void) {
    if (want_chat) return;
    char args[1024];
    snprintf(args, sizeof args, "chat %s --prompt '%s' -n 8", tu_model_path(), Q);
    want_chat = cli_output(args);
    snprintf(args, sizeof args, "generate %s --prompt '%s' -n 8", tu_model_path(), P);
    char *g = cli_output(args);
    assert_memory_equal(g, P, strlen(P)); // generate prints the prompt first
    want_completion = strdup(g + strlen(P));
    free(g);
    printf("  chat: '%s'\n  generate: '%s'\n", want_chat, want_completion);
}

// The shared server runs without the prefix cache: its tests ask the same
// prompts again and compare with the CLI's full prefill, and a restored
// prompt's last rows take the few-row product path (8-bit activations;
// docs/SERVING.md, "Exactness"), where a greedy near-tie may go another way:
// on an AMD EPYC machine the CLI and a first request answered "L'Étoile, la
// Mar", a restored request "The capital of France is Paris.". The cache has
// its own tests (test_prefix_cache, test_prefix_eviction).
static void ensure_server(void) {
    if (S.pid > 0) return;
    server_start(&S, "", "--ctx 1024 --max-seqs 4 --queue 4 --prefix-cache-mb 0");
    cli_answers();
}

// Non-streaming chat and completion with temperature 0 = the CLI's answers.
static void test_greedy_matches_cli(void **state) {
    ensure_server();
    char *r, *t;
    int n_new;
    assert_int_equal(http(&S, "/v1/chat/completions", chat_body(Q, 8, NULL), &r), 200);
    assert_non_null(strstr(r, "\"object\":\"chat.completion\""));
    t = answer_within(r, NULL, 8, &n_new);
    assert_string_equal(t, want_chat);
    free(r), free(t);
    assert_int_equal(http(&S, "/v1/completions", completion_body(P, 8, NULL), &r), 200);
    assert_non_null(strstr(r, "\"object\":\"text_completion\""));
    t = answer(r, "length", &n_new);
    assert_string_equal(t, want_completion);
    assert_int_equal(n_new, 8); // max_tokens -> finish_reason length after exactly 8
    free(r), free(t);
    // max_completion_tokens is chat's newer name for max_tokens.
    assert_int_equal(http(&S, "/v1/chat/completions",
                          "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"max_completion_tokens\": 2, "
                          "\"temperature\": 0}",
                          &r),
                     200);
    t = answer(r, "length", &n_new);
    assert_int_equal(n_new, 2);
    free(r), free(t);
}

// Streamed deltas add up to the same answers, and the stream ends with [DONE].
static void test_stream(void **state) {
    ensure_server();
    char *r, *t, finish[32];
    assert_int_equal(http(&S, "/v1/chat/completions", chat_body(Q, 8, ", \"stream\": true"), &r), 200);
    assert_non_null(strstr(r, "\"role\":\"assistant\"")); // the first chunk
    t = stream_text(r, finish, NULL, NULL);
    assert_string_equal(t, want_chat);
    free(r), free(t);
    assert_int_equal(http(&S, "/v1/completions",
                          completion_body(P, 8, ", \"stream\": true, \"stream_options\": {\"include_usage\": true}"),
                          &r),
                     200);
    t = stream_text(r, finish, NULL, NULL);
    assert_string_equal(t, want_completion);
    assert_string_equal(finish, "length");
    assert_non_null(strstr(r, "\"completion_tokens\":8")); // the usage chunk
    free(r), free(t);
}

// A greedy answer of the server alone: its tokens' texts and, at each, the
// gap between the two best log-probabilities ("logprobs" of either API).
enum { ALONE_MAX = 32 };
typedef struct {
    char *tok[ALONE_MAX];
    double gap[ALONE_MAX];
    int n;
} alone_t;

static double top2_gap(cJSON *top) { // top_logprobs: a list (chat) or an object (completions)
    double a = -INFINITY, b = -INFINITY;
    cJSON *e;
    cJSON_ArrayForEach(e, top) {
        cJSON *v = cJSON_IsObject(e) && cJSON_GetObjectItem(e, "logprob") ? cJSON_GetObjectItem(e, "logprob") : e;
        const double x = v->valuedouble;
        if (x > a)
            b = a, a = x;
        else if (x > b)
            b = x;
    }
    return a - b;
}

static alone_t alone_answer(const char *path, const char *body) {
    char *r;
    assert_int_equal(http(&S, path, body, &r), 200);
    cJSON *j = cJSON_Parse(r);
    assert_non_null(j);
    cJSON *lp = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "logprobs");
    cJSON *content = cJSON_GetObjectItem(lp, "content");
    alone_t a = {0};
    a.n = cJSON_GetArraySize(content ? content : cJSON_GetObjectItem(lp, "tokens"));
    assert_true(a.n > 0 && a.n <= ALONE_MAX);
    for (int i = 0; i < a.n; i++) {
        cJSON *e = content ? cJSON_GetArrayItem(content, i) : NULL;
        a.tok[i] = strdup(e ? cJSON_GetObjectItem(e, "token")->valuestring
                            : cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "tokens"), i)->valuestring);
        a.gap[i] = top2_gap(e ? cJSON_GetObjectItem(e, "top_logprobs")
                              : cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "top_logprobs"), i));
    }
    cJSON_Delete(j);
    free(r);
    return a;
}

static void alone_free(alone_t *a) {
    for (int i = 0; i < a->n; i++)
        free(a->tok[i]);
}

// A greedy near-tie: the two best choices within this many nats. The
// answers of SmolLM2's default GGUF on the CPU flip at gaps of 0.05-0.15
// (the first token of the chat below: "L" -1.885, "The" -1.935).
#define NEAR_TIE 0.5

// text is the alone answer, or follows it up to a token where the alone
// answer's choice was a near-tie (and anything after that).
static void assert_agrees(const alone_t *a, const char *text, const char *what) {
    size_t pos = 0;
    for (int i = 0; i < a->n; i++) {
        const size_t len = strlen(a->tok[i]);
        if (!strncmp(text + pos, a->tok[i], len)) {
            pos += len;
            continue;
        }
        printf("  %s: differs at token %d of %d, where the two best were %.3f nats apart: '%s'\n", what, i, a->n,
               a->gap[i], text);
        if (a->gap[i] >= NEAR_TIE)
            fail_msg("%s: '%s' leaves the answer alone at a choice of margin %.3f", what, text, a->gap[i]);
        return;
    }
    assert_string_equal(text + pos, "");
}

// Four requests at once (two chats, two completions) each get the answer
// they get alone, while a longer one that started first is mid-answer: the
// engine runs them in one forward a turn at different lengths, decode
// tokens riding in the prompts' prefill chunks (and, with
// --max-seqs 4, the last to come waits and joins when a slot frees), and the
// longer one's answer is its answer alone too. Up to rounding: a forward of
// 16 rows or more takes the CPU's other product path (backend.h qmatmul), so
// where a row rode with more rows than alone, an answer may leave the one
// alone at a greedy near-tie (assert_agrees).
static void test_concurrent(void **state) {
    ensure_server();
    char *r, *t, finish[32];
    alone_t want[3] = {
        alone_answer("/v1/chat/completions", chat_body(Q, 8, ", \"logprobs\": true, \"top_logprobs\": 2")),
        alone_answer("/v1/completions", completion_body(P, 8, ", \"logprobs\": 2")),
        alone_answer("/v1/completions", completion_body(LONG, 24, ", \"logprobs\": 2"))};
    call_t c[5];
    call_start(&c[4], &S, "/v1/completions", completion_body(LONG, 24, NULL), NULL);
    for (int i = 0; i < 4; i++)
        call_start(&c[i], &S, i % 2 ? "/v1/completions" : "/v1/chat/completions",
                   i % 2 ? completion_body(P, 8, i == 3 ? ", \"stream\": true" : NULL)
                         : chat_body(Q, 8, i == 2 ? ", \"stream\": true" : NULL),
                   NULL);
    for (int i = 0; i < 5; i++) {
        assert_int_equal(call_end(&c[i], &r), 200);
        if (i == 4)
            t = answer_within(r, NULL, 24, NULL);
        else
            t = i >= 2 ? stream_text(r, finish, NULL, NULL) : answer_within(r, i % 2 ? "length" : NULL, 8, NULL);
        char what[32];
        snprintf(what, sizeof what, "request %d", i);
        assert_agrees(&want[i == 4 ? 2 : i % 2], t, what);
        free(r), free(t);
    }
    for (int k = 0; k < 3; k++)
        alone_free(&want[k]);
}

// A stop string across token boundaries: the text ends right before it,
// streamed or not, with finish_reason stop.
static void test_stop_strings(void **state) {
    ensure_server();
    char *r, *pieces[64], finish[32];
    int np;
    assert_int_equal(http(&S, "/v1/completions", completion_body(P, 8, ", \"stream\": true"), &r), 200);
    char *all = stream_text(r, finish, pieces, &np);
    free(r);
    assert_true(np >= 4);
    // The last byte of piece 1, all of piece 2 and the first byte of piece 3.
    char stop[256];
    snprintf(stop, sizeof stop, "%c%s%c", pieces[1][strlen(pieces[1]) - 1], pieces[2], pieces[3][0]);
    char want[512];
    snprintf(want, sizeof want, "%.*s", (int)(strstr(all, stop) - all), all);
    printf("  stop '%s' -> '%s'\n", stop, want);
    cJSON *js = cJSON_CreateString(stop);
    char *stop_json = cJSON_PrintUnformatted(js);
    char extra[600];
    snprintf(extra, sizeof extra, ", \"stop\": [\"never appears\", %s]", stop_json);
    assert_int_equal(http(&S, "/v1/completions", completion_body(P, 8, extra), &r), 200);
    char *t = answer(r, "stop", NULL);
    assert_string_equal(t, want);
    free(r), free(t);
    snprintf(extra, sizeof extra, ", \"stop\": %s, \"stream\": true", stop_json);
    assert_int_equal(http(&S, "/v1/completions", completion_body(P, 8, extra), &r), 200);
    t = stream_text(r, finish, NULL, NULL);
    assert_string_equal(t, want);
    assert_string_equal(finish, "stop");
    free(r), free(t), free(stop_json), free(all);
    cJSON_Delete(js);
    for (int i = 0; i < np; i++)
        free(pieces[i]);
}

// Bad requests get 400 and OpenAI's error body, naming the parameter.
// Log-probabilities (chat: "logprobs": true, "top_logprobs"; completions:
// "logprobs": N): the answers are the greedy ones without them; one entry a
// generated token, each <= 0, with the alternatives asked for, the first of
// them the greedy token itself; a completion's tokens spell its text at
// their text offsets; streamed, the chunks' entries add up to one a token.
// Then a logit bias (not a log-probability, but the same path of a request's
// sampling options) that decides every token.
static void test_logprobs(void **state) {
    ensure_server();
    char *r, *t;
    int n_new;
    assert_int_equal(http(&S, "/v1/chat/completions", chat_body(Q, 8, ", \"logprobs\": true, \"top_logprobs\": 3"), &r),
                     200);
    t = answer_within(r, NULL, 8, &n_new);
    assert_string_equal(t, want_chat);
    free(t);
    cJSON *j = cJSON_Parse(r);
    cJSON *content = cJSON_GetObjectItem(
        cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "logprobs"), "content");
    assert_int_equal(cJSON_GetArraySize(content), n_new);
    for (int i = 0; i < n_new; i++) {
        cJSON *e = cJSON_GetArrayItem(content, i), *top = cJSON_GetObjectItem(e, "top_logprobs");
        double lp = cJSON_GetObjectItem(e, "logprob")->valuedouble;
        assert_true(lp <= 0);
        assert_true(cJSON_IsArray(cJSON_GetObjectItem(e, "bytes")));
        assert_int_equal(cJSON_GetArraySize(top), 3);
        cJSON *t0 = cJSON_GetArrayItem(top, 0);
        assert_string_equal(cJSON_GetObjectItem(t0, "token")->valuestring,
                            cJSON_GetObjectItem(e, "token")->valuestring);
        assert_true(fabs(cJSON_GetObjectItem(t0, "logprob")->valuedouble - lp) < 1e-6);
        for (int k = 1; k < 3; k++)
            assert_true(cJSON_GetObjectItem(cJSON_GetArrayItem(top, k), "logprob")->valuedouble <=
                        cJSON_GetObjectItem(cJSON_GetArrayItem(top, k - 1), "logprob")->valuedouble);
    }
    cJSON_Delete(j);
    free(r);

    assert_int_equal(http(&S, "/v1/completions", completion_body(P, 8, ", \"logprobs\": 2"), &r), 200);
    t = answer(r, "length", &n_new);
    assert_string_equal(t, want_completion);
    j = cJSON_Parse(r);
    cJSON *lps = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "logprobs");
    cJSON *toks = cJSON_GetObjectItem(lps, "tokens"), *tlp = cJSON_GetObjectItem(lps, "token_logprobs");
    cJSON *tops = cJSON_GetObjectItem(lps, "top_logprobs"), *offs = cJSON_GetObjectItem(lps, "text_offset");
    assert_int_equal(cJSON_GetArraySize(toks), n_new);
    assert_int_equal(cJSON_GetArraySize(tlp), n_new);
    assert_int_equal(cJSON_GetArraySize(tops), n_new);
    char spelled[1024] = "";
    for (int i = 0; i < n_new; i++) {
        const char *tok = cJSON_GetArrayItem(toks, i)->valuestring;
        assert_int_equal((int)cJSON_GetArrayItem(offs, i)->valuedouble, (int)strlen(spelled));
        strcat(spelled, tok);
        cJSON *alt = cJSON_GetArrayItem(tops, i);
        assert_int_equal(cJSON_GetArraySize(alt), 2);
        assert_true(fabs(cJSON_GetObjectItem(alt, tok)->valuedouble - cJSON_GetArrayItem(tlp, i)->valuedouble) < 1e-6);
    }
    assert_string_equal(spelled, t);
    cJSON_Delete(j);
    free(r), free(t);

    assert_int_equal(http(&S, "/v1/chat/completions",
                          chat_body(Q, 8,
                                    ", \"logprobs\": true, \"stream\": true, \"stream_options\": "
                                    "{\"include_usage\": true}"),
                          &r),
                     200);
    char finish[32];
    t = stream_text(r, finish, NULL, NULL);
    assert_string_equal(t, want_chat);
    int entries = 0, tokens = -1;
    for (const char *p = r; (p = strstr(p, "data: {")); p++) {
        const char *end = strstr(p, "\n\n");
        char *ev = strndup(p + 6, (size_t)(end - p - 6));
        cJSON *ch = cJSON_Parse(ev);
        cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(ch, "choices"), 0);
        cJSON *lc = cJSON_GetObjectItem(cJSON_GetObjectItem(c0, "logprobs"), "content");
        if (lc) entries += cJSON_GetArraySize(lc);
        cJSON *u = cJSON_GetObjectItem(ch, "usage");
        if (u && !cJSON_IsNull(u)) tokens = cJSON_GetObjectItem(u, "completion_tokens")->valueint;
        cJSON_Delete(ch), free(ev);
    }
    assert_int_equal(entries, tokens);
    free(r), free(t);

    // logit_bias: +100 on token 28 makes every greedy token 28 (its text 4 times over)
    assert_int_equal(http(&S, "/v1/completions", completion_body(P, 4, ", \"logit_bias\": {\"28\": 100}"), &r), 200);
    t = answer(r, "length", &n_new);
    free(r);
    assert_int_equal(http(&S, "/detokenize", "{\"tokens\": [28, 28, 28, 28]}", &r), 200);
    j = cJSON_Parse(r);
    assert_string_equal(t, cJSON_GetObjectItem(j, "prompt")->valuestring);
    cJSON_Delete(j);
    free(r), free(t);
}

static void test_errors(void **state) {
    ensure_server();
    static const struct {
        const char *path, *body, *param;
        int status;
    } cases[] = {
        {"/v1/chat/completions", "{\"messages\": [", NULL, 400},
        {"/v1/chat/completions", "[1, 2]", NULL, 400},
        {"/v1/completions", "{\"prompt\": \"hi\", \"n\": 2}", "n", 400},
        {"/v1/completions", "{\"prompt\": \"hi\", \"temperature\": -1}", "temperature", 400},
        {"/v1/completions", "{\"prompt\": \"hi\", \"top_p\": 0}", "top_p", 400},
        {"/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 0}", "max_tokens", 400},
        {"/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 1024}", "max_tokens", 400},
        {"/v1/completions", "{\"prompt\": \"hi\", \"stop\": 5}", "stop", 400},
        {"/v1/completions", "{\"prompt\": \"hi\", \"frobnicate\": true}", "frobnicate", 400},
        {"/v1/completions", "{\"prompt\": \"hi\", \"presence_penalty\": 3}", "presence_penalty", 400},
        {"/v1/completions", "{\"prompt\": \"hi\", \"frequency_penalty\": -2.5}", "frequency_penalty", 400},
        {"/v1/completions", "{\"prompt\": \"hi\", \"logit_bias\": {\"5\": 101}}", "logit_bias", 400},
        {"/v1/completions", "{\"prompt\": \"hi\", \"logit_bias\": {\"x5\": 1}}", "logit_bias", 400},
        {"/v1/completions", "{\"prompt\": \"hi\", \"logit_bias\": {\"49152\": 1}}", "logit_bias", 400},
        {"/v1/completions", "{\"prompt\": \"hi\", \"logit_bias\": [5]}", "logit_bias", 400},
        {"/v1/completions", "{\"prompt\": \"hi\", \"logprobs\": 21}", "logprobs", 400},
        {"/v1/completions", "{\"prompt\": \"hi\", \"top_logprobs\": 2}", "top_logprobs", 400},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"logprobs\": 3}",
         "logprobs", 400},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"top_logprobs\": 2}",
         "top_logprobs", 400},
        {"/v1/completions", "{\"max_tokens\": 4}", "prompt", 400},
        {"/v1/completions", "{\"prompt\": [1, 99999999]}", "prompt", 400},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"wizard\", \"content\": \"hi\"}]}", "messages", 400},
        {"/v1/chat/completions", "{\"messages\": []}", "messages", 400},
        {"/v1/nothing", "{}", NULL, 404},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *r;
        int st = http(&S, cases[i].path, cases[i].body, &r);
        printf("  %s %s -> %d %s\n", cases[i].path, cases[i].body, st, r);
        assert_int_equal(st, cases[i].status);
        expect_error(r, cases[i].status, cases[i].param);
        free(r);
    }
    // A prompt beyond the context (--ctx 1024): refused before anything runs.
    char big[8192] = "";
    for (int i = 0; i < 1100; i++)
        strcat(big, "word ");
    char *r;
    assert_int_equal(http(&S, "/v1/completions", completion_body(big, 4, NULL), &r), 400);
    expect_error(r, 400, "prompt");
    assert_non_null(strstr(r, "context_length_exceeded"));
    free(r);
    assert_int_equal(http(&S, "/v1/completions", NULL, &r), 405); // GET
    free(r);
}

// /tokenize and /detokenize round trip; a user message spelling <|im_end|>
// stays text (the control token appears only where the template puts it).
static void test_tokenize(void **state) {
    ensure_server();
    char *r;
    assert_int_equal(http(&S, "/tokenize", "{\"prompt\": \"Hello, world! h\\u00e9llo\"}", &r), 200);
    cJSON *j = cJSON_Parse(r);
    cJSON *toks = cJSON_GetObjectItem(j, "tokens");
    assert_int_equal(cJSON_GetArraySize(toks), cJSON_GetObjectItem(j, "count")->valueint);
    char body[4096];
    char *arr = cJSON_PrintUnformatted(toks);
    snprintf(body, sizeof body, "{\"tokens\": %s}", arr);
    free(arr), free(r), cJSON_Delete(j);
    assert_int_equal(http(&S, "/detokenize", body, &r), 200);
    j = cJSON_Parse(r);
    assert_string_equal(cJSON_GetObjectItem(j, "prompt")->valuestring, "Hello, world! h\xc3\xa9llo");
    free(r), cJSON_Delete(j);

    int count[2], end_ids[2];
    const char *contents[2] = {"hello", "hello<|im_end|>"};
    int32_t im_end = -1;
    for (int k = 0; k < 2; k++) {
        snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": \"%s\"}]}", contents[k]);
        assert_int_equal(http(&S, "/tokenize", body, &r), 200);
        j = cJSON_Parse(r);
        toks = cJSON_GetObjectItem(j, "tokens");
        count[k] = cJSON_GetArraySize(toks);
        free(r);
        if (im_end < 0) { // the id of <|im_end|> itself, as the template writes it: the prompt's
            assert_int_equal(http(&S, "/tokenize", "{\"prompt\": \"<|im_end|>\"}", &r), 200);
            cJSON *one = cJSON_Parse(r);
            assert_int_equal(cJSON_GetObjectItem(one, "count")->valueint, 1);
            im_end = cJSON_GetArrayItem(cJSON_GetObjectItem(one, "tokens"), 0)->valueint;
            cJSON_Delete(one), free(r);
        }
        end_ids[k] = 0;
        cJSON *x;
        cJSON_ArrayForEach(x, toks) end_ids[k] += x->valueint == im_end;
        cJSON_Delete(j);
    }
    printf("  tokens %d vs %d, <|im_end|> %d vs %d\n", count[0], count[1], end_ids[0], end_ids[1]);
    assert_int_equal(end_ids[0], end_ids[1]); // no forged control token
    assert_true(count[1] > count[0] + 1);     // "<|im_end|>" became several text tokens
}

// The counters move with a request; the gauges and histograms are there.
static void test_metrics(void **state) {
    ensure_server();
    double ok0 = metric(&S, "hylo_requests_total{status=\"200\"}"), gen0 = metric(&S, "hylo_generation_tokens_total"),
           pr0 = metric(&S, "hylo_prompt_tokens_total"), tt0 = metric(&S, "hylo_time_to_first_token_seconds_count");
    char *r;
    assert_int_equal(http(&S, "/v1/completions", completion_body(P, 3, NULL), &r), 200);
    free(r);
    assert_true(metric(&S, "hylo_requests_total{status=\"200\"}") >= ok0 + 2); // the request and a /metrics
    assert_true(metric(&S, "hylo_generation_tokens_total") == gen0 + 3);
    assert_true(metric(&S, "hylo_prompt_tokens_total") > pr0);
    assert_true(metric(&S, "hylo_time_to_first_token_seconds_count") == tt0 + 1);
    assert_true(metric(&S, "hylo_time_per_output_token_seconds_count") >= 2);
    assert_true(metric(&S, "hylo_queue_length") == 0);
    assert_true(metric(&S, "hylo_running_sequences") == 0);
    assert_true(metric(&S, "hylo_cache_bytes") == 0); // nothing running holds a cache
    assert_true(metric(&S, "hylo_requests_total{status=\"400\"}") >= 0);
    // the engine's counts: one forward a turn, no token budget by default
    double turns = metric(&S, "hylo_engine_turns_total");
    assert_true(turns >= 3); // the prompt's chunk and two decode steps at least
    assert_true(metric(&S, "hylo_engine_forwards_total") == turns);
    assert_true(metric(&S, "hylo_engine_mixed_forwards_total") >= 0);
    assert_true(metric(&S, "hylo_engine_riding_tokens_total") >= 0);
    assert_true(metric(&S, "hylo_engine_forward_tokens_total") >= turns);
    assert_true(metric(&S, "hylo_engine_forward_tokens_max") >= 1);
    assert_true(metric(&S, "hylo_engine_max_batched_tokens") == 0);
    assert_true(metric(&S, "hylo_engine_budget_cut_chunks_total") == 0);
    assert_true(metric(&S, "hylo_engine_budget_deferred_total") == 0);
    // decode steps by how they ran: the CPU has no recorded graphs
    assert_true(metric(&S, "hylo_engine_decode_steps_total{how=\"op_by_op\"}") >= 2);
    assert_true(metric(&S, "hylo_engine_decode_steps_total{how=\"replayed\"}") == 0);
    assert_true(metric(&S, "hylo_engine_decode_steps_total{how=\"recorded\"}") == 0);
    char *m;
    assert_int_equal(http(&S, "/metrics", NULL, &m), 200);
    assert_non_null(strstr(m, "# TYPE hylo_engine_turns_total counter\n"));
    assert_non_null(strstr(m, "# HELP hylo_engine_riding_tokens_total "));
    assert_non_null(strstr(m, "# TYPE hylo_engine_max_batched_tokens gauge\n"));
    free(m);
}

// A client that goes away mid-stream is cancelled (its cache freed: no
// sequence left running), and the server goes on serving others.
static void test_disconnect(void **state) {
    ensure_server();
    double c0 = metric(&S, "hylo_requests_cancelled_total");
    for (int k = 0; k < 2; k++) { // streaming, then not
        call_t c;
        call_start(&c, &S, "/v1/completions", completion_body(LONG, 900, k ? NULL : ", \"stream\": true"),
                   "--max-time 1.5");
        char *r;
        call_end(&c, &r);
        free(r);
    }
    // The engine sees a cancel within one step; give it up to 60 s (asan).
    int waited = 0;
    while ((metric(&S, "hylo_requests_cancelled_total") < c0 + 2 || metric(&S, "hylo_running_sequences") != 0) &&
           waited++ < 600)
        usleep(100000);
    assert_true(metric(&S, "hylo_requests_cancelled_total") >= c0 + 2);
    assert_true(metric(&S, "hylo_running_sequences") == 0);
    assert_true(metric(&S, "hylo_cache_bytes") == 0);
    char *r, *t;
    assert_int_equal(http(&S, "/v1/completions", completion_body(P, 8, NULL), &r), 200);
    t = answer(r, "length", NULL);
    assert_string_equal(t, want_completion);
    free(r), free(t);
    server_stop(&S); // clean exit after all of the above
}

// A second server: API key from the environment, one sequence and one
// waiting at most (a third request at once gets 429), /v1/models.
static void test_key_and_queue(void **state) {
    server_t s2;
    server_start(&s2, "HYLO_API_KEY=sekret", "--ctx 1024 --max-seqs 1 --queue 1 --model-name smol");
    char *r;
    assert_int_equal(http(&s2, "/v1/models", NULL, &r), 401);
    expect_error(r, 401, NULL);
    free(r);
    strcpy(s2.key, "wrong");
    assert_int_equal(http(&s2, "/v1/completions", completion_body(P, 2, NULL), &r), 401);
    free(r);
    s2.key[0] = 0;
    assert_int_equal(http(&s2, "/health", NULL, &r), 200); // open without a key
    free(r);
    strcpy(s2.key, "sekret");
    assert_int_equal(http(&s2, "/v1/models", NULL, &r), 200);
    assert_non_null(strstr(r, "\"id\":\"smol\""));
    free(r);
    call_t c[3];
    for (int i = 0; i < 3; i++)
        call_start(&c[i], &s2, "/v1/completions", completion_body(LONG, 48, NULL), NULL);
    int n200 = 0, n429 = 0;
    for (int i = 0; i < 3; i++) {
        int st = call_end(&c[i], &r);
        n200 += st == 200, n429 += st == 429;
        if (st == 429) expect_error(r, 429, NULL);
        free(r);
    }
    printf("  3 at once on 1 slot + 1 queued: %d x 200, %d x 429\n", n200, n429);
    assert_int_equal(n200, 2);
    assert_int_equal(n429, 1);
    // SIGTERM with a request running: it is cancelled, the server exits 0.
    call_start(&c[0], &s2, "/v1/completions", completion_body(LONG, 900, ", \"stream\": true"), NULL);
    int waited = 0;
    while (metric(&s2, "hylo_running_sequences") != 1 && waited++ < 600)
        usleep(100000);
    server_stop(&s2);
    call_end(&c[0], &r);
    free(r);
}

// A chat body of the messages (role, content) pairs, greedy, max_tokens (malloc'ed).
static char *messages_body(const char *const *msgs, int n, int max_tokens) {
    cJSON *j = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(j, "messages");
    for (int i = 0; i < n; i++) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", msgs[2 * i]);
        cJSON_AddStringToObject(m, "content", msgs[2 * i + 1]);
        cJSON_AddItemToArray(arr, m);
    }
    cJSON_AddNumberToObject(j, "max_tokens", max_tokens);
    cJSON_AddNumberToObject(j, "temperature", 0);
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    return s;
}

// Prefix caching: a chat's second turn (the first conversation, its answer
// and a new message) restores the first turn's prompt instead of prefilling
// it, and answers what a server without the cache answers (greedy, the same
// tokens: docs/SERVING.md says when the bits may differ); /metrics counts the
// reused tokens, and the second turn's entry replaces the first's.
static void test_prefix_cache(void **state) {
    server_t on, off;
    server_start(&on, "", "--ctx 1024 --chunk 32 --prefix-cache-mb 64");
    server_start(&off, "", "--ctx 1024 --chunk 32 --prefix-cache-mb 0");
    const char *msgs[8] = {"system", "You are a helpful assistant. Answer in two sentences.", "user",
                           "What is the capital of France, and what is it known for?"};
    char *ans[2][2];
    int n_prompt[2];
    for (int turn = 0; turn < 2; turn++) {
        char *body = messages_body(msgs, turn ? 4 : 2, 24);
        for (int k = 0; k < 2; k++) {
            char *r;
            assert_int_equal(http(k ? &off : &on, "/v1/chat/completions", body, &r), 200);
            ans[turn][k] = answer_within(r, NULL, 24, NULL);
            cJSON *j = cJSON_Parse(r);
            n_prompt[turn] = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "usage"), "prompt_tokens")->valueint;
            cJSON_Delete(j);
            free(r);
        }
        free(body);
        printf("  turn %d (%d prompt tokens): '%s'\n", turn + 1, n_prompt[turn], ans[turn][0]);
        assert_string_equal(ans[turn][0], ans[turn][1]);
        if (turn == 0) {
            assert_true(metric(&on, "hylo_prefix_cache_misses_total") == 1);
            assert_true(metric(&on, "hylo_prefix_cache_entries") == 1);
            msgs[4] = "assistant", msgs[5] = ans[0][0], msgs[6] = "user", msgs[7] = "And the capital of Germany?";
        }
    }
    assert_true(n_prompt[1] > n_prompt[0]);
    assert_true(metric(&on, "hylo_prefix_cache_hits_total") == 1);
    assert_true(metric(&on, "hylo_prefix_cache_reused_tokens_total") == n_prompt[0]);
    assert_true(metric(&on, "hylo_prefix_cache_entries") == 1); // turn 2's holds turn 1's
    assert_true(metric(&on, "hylo_prefix_cache_bytes") > 0);
    // the default model has no recurrent states: its entries are pool pages only
    assert_true(metric(&on, "hylo_prefix_cache_snapshots") == 0);
    assert_true(metric(&on, "hylo_prefix_cache_snapshot_bytes") == 0);
    assert_true(metric(&off, "hylo_prefix_cache_hits_total") == 0);
    assert_true(metric(&off, "hylo_prefix_cache_bytes") == 0);
    for (int t = 0; t < 2; t++)
        free(ans[t][0]), free(ans[t][1]);
    server_stop(&on);
    server_stop(&off);
}

// A budget of 1 MiB holds a few short prompts (~46 KB per token in fp32):
// more evict the least recently used, the bytes stay within it, and a prompt
// asked again restores all but its last token and answers as before.
static void test_prefix_eviction(void **state) {
    server_t s;
    server_start(&s, "", "--ctx 256 --prefix-cache-mb 1");
    const char *prompts[5] = {"Apples are red or green fruits that grow on",
                              "Blue whales are the largest animals that ever",
                              "Copper is a soft metal that conducts heat and",
                              "Dogs like to run in the park with their", "Every morning I drink a cup of hot black"};
    char *first = NULL, *r;
    for (int i = 0; i < 5; i++) {
        assert_int_equal(http(&s, "/v1/completions", completion_body(prompts[i], 6, NULL), &r), 200);
        if (i == 4) first = answer(r, "length", NULL);
        free(r);
    }
    double ev = metric(&s, "hylo_prefix_cache_evictions_total"), bytes = metric(&s, "hylo_prefix_cache_bytes"),
           entries = metric(&s, "hylo_prefix_cache_entries"),
           reused = metric(&s, "hylo_prefix_cache_reused_tokens_total");
    printf("  5 prompts in 1 MiB: %.0f entries, %.0f bytes, %.0f evicted\n", entries, bytes, ev);
    assert_true(ev >= 1);
    assert_true(entries >= 1 && entries < 5);
    assert_true(bytes > 0 && bytes <= 1 << 20);
    assert_int_equal(http(&s, "/v1/completions", completion_body(prompts[4], 6, NULL), &r), 200);
    char *again = answer(r, "length", NULL);
    assert_string_equal(again, first);
    cJSON *j = cJSON_Parse(r);
    int np = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "usage"), "prompt_tokens")->valueint;
    cJSON_Delete(j);
    assert_true(metric(&s, "hylo_prefix_cache_reused_tokens_total") == reused + np - 1);
    free(r), free(first), free(again);
    server_stop(&s);
}
// The cache budget, in pages: the default model on the CPU holds 46080
// bytes a token (30 layers x K and V x 3 heads x 64 x fp32), so a page of 256
// tokens is 11.25 MiB and 12 MiB hold one page. A chat prompt with 300
// max_tokens needs 2 pages: 400 naming both figures. A running 14 + 160-token
// completion holds the page (the prefix cache's entry of its prompt, which
// shares it, gives it up when its first decode step copies it on write), so
// a second one of ~14 tokens waits in the queue with a slot free, then runs;
// both answer as the CLI does. Then 24 MiB (2 pages) and two streamed
// completions of 14 + 300 tokens (2 pages each): both start, the newer is
// preempted when both need their second page and resumes when the older is
// done; both streams are whole (300 tokens, finish_reason length, [DONE]).
static void test_cache_budget(void **state) {
    cli_answers();
    server_t s2;
    server_start(&s2, "", "--ctx 1024 --max-seqs 2 --cache-mb 12");
    char *r;
    assert_int_equal(http(&s2, "/v1/chat/completions", chat_body(Q, 300, NULL), &r), 400);
    expect_error(r, 400, NULL);
    if (!strstr(r, "need 2 cache pages of 256 tokens") || !strstr(r, "more than the server's 1"))
        fail_msg("the refusal does not name the pages: %s", r);
    free(r);
    call_t c[2];
    call_start(&c[0], &s2, "/v1/completions", completion_body(LONG, 160, ", \"stream\": true"), NULL);
    int waited = 0;
    while (metric(&s2, "hylo_running_sequences") != 1 && waited++ < 600)
        usleep(10000);
    call_start(&c[1], &s2, "/v1/completions", completion_body(P, 8, NULL), NULL);
    int queued = 0;
    for (int i = 0; i < 200 && !queued && metric(&s2, "hylo_running_sequences") == 1; i++) {
        queued = metric(&s2, "hylo_queue_length") == 1;
        usleep(5000);
    }
    assert_true(queued); // seen waiting beside the running one, with a slot free
    char finish[32];
    assert_int_equal(call_end(&c[0], &r), 200);
    free(stream_text(r, finish, NULL, NULL));
    free(r);
    assert_int_equal(call_end(&c[1], &r), 200);
    char *t = answer_within(r, NULL, 8, NULL);
    assert_string_equal(t, want_completion);
    free(r), free(t);
    assert_true(metric(&s2, "hylo_cache_pages_total") == 1);
    server_stop(&s2);

    server_start(&s2, "", "--ctx 1024 --max-seqs 2 --cache-mb 24");
    const char *opts = ", \"stream\": true, \"stream_options\": {\"include_usage\": true}";
    call_start(&c[0], &s2, "/v1/completions", completion_body(LONG, 300, opts), NULL);
    call_start(&c[1], &s2, "/v1/completions", completion_body("10, 20, 30, 40,", 300, opts), NULL);
    for (int k = 0; k < 2; k++) {
        assert_int_equal(call_end(&c[k], &r), 200);
        char *text = stream_text(r, finish, NULL, NULL);
        const char *u = strstr(r, "\"completion_tokens\":");
        assert_non_null(u);
        int n = atoi(u + strlen("\"completion_tokens\":"));
        printf("  stream %d: %d tokens, finish %s\n", k, n, finish);
        assert_string_equal(finish, "length");
        assert_int_equal(n, 300);
        free(text), free(r);
    }
    double pre = metric(&s2, "hylo_preemptions_total");
    printf("  2 pages, 2 requests of 2 pages: %.0f preemption(s)\n", pre);
    assert_true(pre >= 1);
    assert_true(metric(&s2, "hylo_running_sequences") == 0 && metric(&s2, "hylo_queue_length") == 0);
    server_stop(&s2);
}

// `hylo serve ARGS` must fail before it serves: exit 2 and `want` on stderr.
static void serve_refused(const char *args, const char *want) {
    const char *bin = getenv("HYLO_BIN");
    if (!bin) skip();
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s serve %s --port 0 %s 2>&1", bin, tu_model_path(), args);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char out[4096];
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    int st = pclose(p);
    printf("  hylo serve %s -> %d: %s", args, WIFEXITED(st) ? WEXITSTATUS(st) : -1, out);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 2);
    if (!strstr(out, want)) fail_msg("'%s' is not in: %s", want, out);
}

// --max-batched-tokens 8 with --chunk 32: a chat and a completion at once
// answer as the CLI does; no forward carries more than 8 tokens (max-seqs 4
// is below it), and the prompts' chunks were cut to the budget. Values that
// are not a non-negative integer are refused, naming the option.
static void test_token_budget(void **state) {
    serve_refused("--max-batched-tokens -1", "--max-batched-tokens expects an integer in [0, ");
    serve_refused("--max-batched-tokens 8x", "--max-batched-tokens expects an integer in [0, ");
    serve_refused("--max-batched-tokens", "--max-batched-tokens needs a value");
    cli_answers();
    server_t s;
    server_start(&s, "", "--ctx 1024 --chunk 32 --max-batched-tokens 8");
    call_t c[2];
    call_start(&c[0], &s, "/v1/chat/completions", chat_body(Q, 8, NULL), NULL);
    call_start(&c[1], &s, "/v1/completions", completion_body(P, 8, NULL), NULL);
    for (int i = 0; i < 2; i++) {
        char *r, *t;
        assert_int_equal(call_end(&c[i], &r), 200);
        t = answer_within(r, i ? "length" : NULL, 8, NULL);
        assert_string_equal(t, i ? want_completion : want_chat);
        free(r), free(t);
    }
    double most = metric(&s, "hylo_engine_forward_tokens_max"), cut = metric(&s, "hylo_engine_budget_cut_chunks_total");
    printf("  budget 8: the largest forward %.0f tokens, %.0f chunks cut, %.0f deferred\n", most, cut,
           metric(&s, "hylo_engine_budget_deferred_total"));
    assert_true(metric(&s, "hylo_engine_max_batched_tokens") == 8);
    assert_true(most >= 1 && most <= 8);
    assert_true(cut >= 1);
    server_stop(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_matches_cli), cmocka_unit_test(test_stream),
        cmocka_unit_test(test_concurrent),         cmocka_unit_test(test_stop_strings),
        cmocka_unit_test(test_logprobs),           cmocka_unit_test(test_errors),
        cmocka_unit_test(test_tokenize),           cmocka_unit_test(test_metrics),
        cmocka_unit_test(test_disconnect),         cmocka_unit_test(test_key_and_queue),
        cmocka_unit_test(test_prefix_cache),       cmocka_unit_test(test_prefix_eviction),
        cmocka_unit_test(test_cache_budget),       cmocka_unit_test(test_token_budget),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
