#include "base/jsonb.h"

cJSON *jb_root(jb_t *jb) {
    cJSON *o = cJSON_CreateObject();
    if (!o) jb->oom = 1;
    return o;
}

cJSON *jb_add(jb_t *jb, cJSON *o, const char *key, cJSON *v) {
    if (!v || !o || !(cJSON_IsArray(o) ? cJSON_AddItemToArray(o, v) : cJSON_AddItemToObject(o, key, v))) {
        jb->oom = 1;
        cJSON_Delete(v);
        return NULL;
    }
    return v;
}

cJSON *jb_obj(jb_t *jb, cJSON *o, const char *key) { return jb_add(jb, o, key, cJSON_CreateObject()); }
cJSON *jb_arr(jb_t *jb, cJSON *o, const char *key) { return jb_add(jb, o, key, cJSON_CreateArray()); }
cJSON *jb_int(jb_t *jb, cJSON *o, const char *key, long long v) {
    return jb_add(jb, o, key, cJSON_CreateNumber((double)v));
}
cJSON *jb_str(jb_t *jb, cJSON *o, const char *key, const char *v) {
    return jb_add(jb, o, key, v ? cJSON_CreateString(v) : NULL);
}
cJSON *jb_bool(jb_t *jb, cJSON *o, const char *key, int v) { return jb_add(jb, o, key, cJSON_CreateBool(v)); }
cJSON *jb_null(jb_t *jb, cJSON *o, const char *key) { return jb_add(jb, o, key, cJSON_CreateNull()); }
