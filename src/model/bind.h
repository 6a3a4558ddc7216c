// Binding a layer's weight-view struct to the flat buffer by parameter name.
#pragma once
#include <stddef.h>

#include "model/params.h"

// *dst = flat + off(name) * elt, where name = "model.layers.<layer>.<suffix>".
// Missing parameters: NULL when optional, else ERR_INPUT naming it.
// elt == 0: flat is an array of one address per parameter of pt (in table
// order), for weights that do not share one flat buffer (quantised inference).
int bind_param(void **dst, const ptable_t *pt, void *flat, size_t elt, int layer, const char *suffix, int optional);
