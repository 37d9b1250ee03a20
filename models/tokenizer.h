/*
 * tokenizer.h — internal entry points of models/tokenizer.c beyond the public tk_tokenizer_* calls.
 *
 * The public loader reads a file; tests and the fuzz target hand the JSON text over directly.
 */
#ifndef TK_MODELS_TOKENIZER_H
#define TK_MODELS_TOKENIZER_H

#include <stddef.h>

#include "tk.h"

/* Parses tokenizer.json text (len bytes). `what` names the source in error messages. Errors as
 * tk_tokenizer_load's, without TK_ERR_NOT_FOUND. */
int tk_models__tokenizer_parse(tk_tokenizer **out, const char *json, size_t len, const char *what);

#endif
