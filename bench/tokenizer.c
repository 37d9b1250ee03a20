/*
 * tokenizer.c — tk_tokenizer speed: load time, then encode throughput over a text file, one line at
 * a time (as a model server sees requests) and the whole file as one text.
 *
 *     build/bench/tokenizer DIR|tokenizer.json FILE [repeats]
 *
 * Prints one line per measurement (process CPU time, single-threaded) and a checksum of the ids, so
 * two runs (or tk and tokenizers, see bench/tokenizer.sh) can be compared.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tk.h"

/* CPU time of this process: on a shared machine, wall time measures the neighbours too. */
static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s DIR|tokenizer.json FILE [repeats]\n", argv[0]);
        return 2;
    }
    int reps = argc > 3 ? atoi(argv[3]) : 3;
    if (reps < 1)
        reps = 1;
    FILE *f = fopen(argv[2], "rb");
    if (!f) {
        perror(argv[2]);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)size + 1);
    if (!text || fread(text, 1, (size_t)size, f) != (size_t)size) {
        fprintf(stderr, "cannot read %s\n", argv[2]);
        return 1;
    }
    fclose(f);
    text[size] = 0;
    double t0 = now_ms();
    tk_tokenizer *tok = NULL;
    if (tk_tokenizer_load(&tok, argv[1]) != TK_OK) {
        fprintf(stderr, "%s\n", tk_last_error());
        return 1;
    }
    printf("load: %.1f ms (%zu ids)\n", now_ms() - t0, tk_tokenizer_vocab_size(tok));
    double best_lines = 1e30, best_whole = 1e30;
    uint64_t sum = 0;
    size_t nlines_ids = 0, nwhole = 0;
    for (int r = 0; r < reps; r++) {
        t0 = now_ms();
        sum = 1469598103934665603ull;
        nlines_ids = 0;
        for (char *p = text; p < text + size;) {
            char *e = memchr(p, '\n', (size_t)(text + size - p));
            size_t n = e ? (size_t)(e - p) : (size_t)(text + size - p);
            int32_t *ids = NULL;
            size_t k = 0;
            if (tk_tokenizer_encode(&ids, &k, tok, p, n, 0) != TK_OK) {
                fprintf(stderr, "%s\n", tk_last_error());
                return 1;
            }
            for (size_t i = 0; i < k; i++)
                sum = (sum ^ (uint32_t)ids[i]) * 1099511628211ull;
            nlines_ids += k;
            tk_free(ids);
            p += n + 1;
        }
        double ms = now_ms() - t0;
        if (ms < best_lines)
            best_lines = ms;
        t0 = now_ms();
        int32_t *ids = NULL;
        if (tk_tokenizer_encode(&ids, &nwhole, tok, text, (size_t)size, 0) != TK_OK) {
            fprintf(stderr, "%s\n", tk_last_error());
            return 1;
        }
        ms = now_ms() - t0;
        tk_free(ids);
        if (ms < best_whole)
            best_whole = ms;
    }
    printf("per line: %zu ids in %.1f ms: %.2f MB/s, %.0f ids/s (best of %d); checksum %016llx\n", nlines_ids,
           best_lines, size / best_lines / 1e3, nlines_ids / best_lines * 1e3, reps, (unsigned long long)sum);
    printf("whole file: %zu ids in %.1f ms: %.2f MB/s\n", nwhole, best_whole, size / best_whole / 1e3);
    tk_tokenizer_free(tok);
    free(text);
    return 0;
}
