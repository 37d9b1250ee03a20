/*
 * fuzz_chat_template.c — libFuzzer target: the chat-template interpreter (models/chat_template.c).
 *
 * Input: template text, optionally followed by a NUL byte and message contents separated by NUL
 * bytes (roles alternate user/assistant after a system turn). Every input either renders or fails
 * with a status and a message; a failure leaves *out NULL, a success a NUL-terminated string no
 * longer than the output limit. Seeds: tests/fuzz/corpus/chat_template/, regressions:
 * tests/fuzz/regress/chat_template/.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "models/chat_template.h"
#include "tk.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    size_t tn = nul ? (size_t)(nul - data) : size;
    tk_chat_message msgs[8];
    char *copy = NULL;
    size_t n = 0;
    static const char *const roles[] = {"system",    "user", "assistant", "user",
                                        "assistant", "user", "assistant", "tool"};
    if (nul) {
        size_t rest = size - tn - 1;
        copy = malloc(rest + 1);
        if (!copy)
            return 0;
        memcpy(copy, nul + 1, rest);
        copy[rest] = 0;
        for (char *p = copy; n < 8 && p <= copy + rest; p += strlen(p) + 1) {
            msgs[n].role = roles[n];
            msgs[n].content = p;
            n++;
        }
    } else {
        msgs[0] = (tk_chat_message){"system", "Be brief."};
        msgs[1] = (tk_chat_message){"user", "Hello, caf\xC3\xA9 \xF0\x9F\xA4\x97"};
        msgs[2] = (tk_chat_message){"assistant", " Hi! "};
        n = 3;
    }
    static const tk_chat_var vars[] = {{"bos_token", "<s>"}, {"eos_token", "</s>"}};
    for (int agp = 0; agp < 2; agp++) {
        char *out = (char *)1;
        int rc = tk_models__chat_render_text(&out, (const char *)data, tn, msgs, n, agp, vars, 2);
        if (rc != TK_OK) {
            if (out || !tk_last_error() || !*tk_last_error())
                abort(); /* a failure leaves *out NULL and says why */
        } else if (!out || strlen(out) > TK_CHAT_MAX_OUTPUT) {
            abort();
        }
        tk_free(out);
    }
    free(copy);
    return 0;
}
