// Building a cJSON tree for a writer without checking every call. Each jb_*
// adds one node; when an allocation fails (or the parent is missing because its
// own allocation failed) the node is dropped and jb->oom is set, and the writer
// checks oom once before printing, so a tree with a node missing is never
// written. Used by the config and tokenizer writers.
#pragma once
#include <cjson/cJSON.h>

typedef struct {
    int oom;
} jb_t;

// A new empty object to build under (NULL, oom set, when it cannot be allocated).
cJSON *jb_root(jb_t *jb);
// Adds v to o: under key when o is an object, at the end when it is an array
// (key unused). Returns v, or NULL when v or o is NULL or the key cannot be
// copied (v freed, oom set).
cJSON *jb_add(jb_t *jb, cJSON *o, const char *key, cJSON *v);
cJSON *jb_obj(jb_t *jb, cJSON *o, const char *key);
cJSON *jb_arr(jb_t *jb, cJSON *o, const char *key);
cJSON *jb_int(jb_t *jb, cJSON *o, const char *key, long long v);
cJSON *jb_str(jb_t *jb, cJSON *o, const char *key, const char *v); // v NULL counts as a failed allocation
cJSON *jb_bool(jb_t *jb, cJSON *o, const char *key, int v);
cJSON *jb_null(jb_t *jb, cJSON *o, const char *key);
