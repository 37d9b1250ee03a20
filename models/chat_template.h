/*
 * chat_template.h — internal entry points of models/chat_template.c (the Jinja2 subset that renders
 * tokenizer_config.json's chat_template) beyond the public tk_chat_render.
 */
#ifndef TK_MODELS_CHAT_TEMPLATE_H
#define TK_MODELS_CHAT_TEMPLATE_H

#include <stddef.h>

#include "tk.h"

/* Hard limits of one rendering. */
#define TK_CHAT_MAX_TEMPLATE ((size_t)1 << 20) /* template bytes */
#define TK_CHAT_MAX_OUTPUT ((size_t)16 << 20)  /* rendered bytes */
#define TK_CHAT_MAX_STEPS 200000               /* loop iterations, range() items and statements */
#define TK_CHAT_MAX_DEPTH 128                  /* nesting of expressions and blocks */
#define TK_CHAT_MAX_ARENA ((size_t)256 << 20)  /* interpreter memory */

/* A special token passed to the template as a variable (bos_token, eos_token, ...). */
typedef struct {
    const char *name, *value;
} tk_chat_var;

/* Renders template text `tmpl` (len bytes) for the messages with transformers' Jinja settings
 * (trim_blocks, lstrip_blocks): variables messages, add_generation_prompt and vars[0..nvars).
 * *out is the caller's (tk_free). Errors: TK_ERR_UNSUPPORTED (a construct outside the subset, named
 * with its line), TK_ERR_INVALID (a syntax error, raise_exception, a type error or a limit passed). */
int tk_models__chat_render_text(char **out, const char *tmpl, size_t len, const tk_chat_message *msgs, size_t n,
                                int add_generation_prompt, const tk_chat_var *vars, size_t nvars);

#endif
