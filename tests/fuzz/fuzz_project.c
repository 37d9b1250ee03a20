/*
 * fuzz_project.c — project files (api/project.c): tk_project_open parses tk.json (jansson), walks
 * the text again to place errors at a line and column, checks every key (did you mean), name,
 * version spec and registry URL. Nothing is fetched: only the parser runs.
 *
 * Input: the project file's bytes. Seeds: project files as docs/project.md writes them, and broken ones.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "tk.h"

static char path[600];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!path[0]) {
        const char *dir = fz_scratch("project");
        if (!dir)
            abort();
        snprintf(path, sizeof path, "%s/tk.json", dir);
        atexit(fz_scratch_cleanup);
    }
    if (fz_write_file(path, data, size) != 0)
        abort();
    tk_project *p = NULL;
    if (tk_project_open(&p, path) == TK_OK) {
        for (size_t i = 0; i < tk_project_package_count(p); i++)
            if (!tk_project_package_name(p, i) || !tk_project_package_version(p, i))
                abort();
    } else if (p != NULL) {
        abort();
    }
    tk_project_free(p);
    return 0;
}
