/* host.c — a program outside the tree that uses the installed library (tests/cli/install.sh builds it
 * with pkg-config and with CMake). It prints the library version and the default endpoint, then gets
 * a package from that endpoint (the installed registry) and prints its name and version. */
#include <stdio.h>
#include <tkhub/tk.h>

int main(int argc, char **argv)
{
    const char *ref = argc > 1 ? argv[1] : "kernels-community/activation";
    tk_ctx *ctx = NULL;
    tk_pkg *pkg = NULL;
    if (tk_version_number() != TK_VERSION_NUMBER) {
        fprintf(stderr, "header %s, library %s\n", TK_VERSION_STRING, tk_version_string());
        return 1;
    }
    if (tk_ctx_new(&ctx, NULL) != TK_OK) {
        fprintf(stderr, "tk_ctx_new: %s\n", tk_last_error());
        return 1;
    }
    printf("version %s\nendpoint %s\n", tk_version_string(), tk_ctx_endpoint(ctx));
    int rc = tk_pkg_get(&pkg, ctx, ref, NULL);
    if (rc != TK_OK) {
        fprintf(stderr, "tk_pkg_get %s: %s: %s\n", ref, tk_status_str(rc), tk_last_error());
        tk_ctx_free(ctx);
        return 1;
    }
    printf("got %s %s\n", tk_pkg_name(pkg), tk_pkg_version(pkg));
    tk_pkg_free(pkg);
    tk_ctx_free(ctx);
    return 0;
}
