// host.cpp — the C++ host program (tests/cli/install.sh): the installed header compiles as C++ and
// the library links from C++; RAII around the context and the package.
#include <cstdio>
#include <memory>
#include <string>
#include <tkhub/tk.h>

struct ctx_free { void operator()(tk_ctx *c) const { tk_ctx_free(c); } };
struct pkg_free { void operator()(tk_pkg *p) const { tk_pkg_free(p); } };

int main(int argc, char **argv)
{
    std::string ref = argc > 1 ? argv[1] : "kernels-community/activation";
    tk_ctx *raw = nullptr;
    if (tk_ctx_new(&raw, nullptr) != TK_OK) {
        std::fprintf(stderr, "tk_ctx_new: %s\n", tk_last_error());
        return 1;
    }
    std::unique_ptr<tk_ctx, ctx_free> ctx(raw);
    std::printf("version %s\nendpoint %s\n", tk_version_string(), tk_ctx_endpoint(ctx.get()));
    tk_pkg *p = nullptr;
    int rc = tk_pkg_get(&p, ctx.get(), ref.c_str(), nullptr);
    if (rc != TK_OK) {
        std::fprintf(stderr, "tk_pkg_get %s: %s: %s\n", ref.c_str(), tk_status_str(rc), tk_last_error());
        return 1;
    }
    std::unique_ptr<tk_pkg, pkg_free> pkg(p);
    std::printf("got %s %s (c++)\n", tk_pkg_name(pkg.get()), tk_pkg_version(pkg.get()));
    return 0;
}
