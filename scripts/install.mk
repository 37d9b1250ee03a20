# install.mk — `make install` (included by the Makefile; README "Installing").
#
#   make install [PREFIX=/usr/local] [DESTDIR=]      make uninstall [PREFIX=...] [DESTDIR=...]
#
# Installed names never collide with Tcl/Tk (libtk.so, <tk.h>, pkg-config tk):
#   $(PREFIX)/bin/tk                          the command (the only thing with the server's libmicrohttpd,
#                                             apart from libtkhub-serve)
#   $(PREFIX)/lib/libtkhub.so.0, libtkhub.a   the client library (tk_* API, no server)
#   $(PREFIX)/lib/libtkhub-serve.so.0, .a     libtkhub plus the registry server (tk_server_*,
#                                             tk_serve_*); link it instead of libtkhub, not both
#   $(PREFIX)/include/tkhub/tk.h              #include <tkhub/tk.h>
#   $(PREFIX)/lib/pkgconfig/tkhub.pc, tkhub-serve.pc   (Libs.private lists the dependencies, so
#                                             `pkg-config --static --libs tkhub` links libtkhub.a)
#   $(PREFIX)/lib/cmake/tkhub/                find_package(tkhub): tkhub::tkhub, tkhub::tkhub_static,
#                                             tkhub::serve, tkhub::serve_static
#   $(PREFIX)/share/tkhub/registry/           the default registry this build published
#   $(PREFIX)/share/doc/tkhub/                README.md and docs/
#   $(PREFIX)/share/man/man1/tk.1             the manual page (docs/tk.1; `man tk`)
#
# The installed objects are the build's, except api/ctx.c, compiled again with the default endpoint
# file://$(PREFIX)/share/tkhub/registry. Where that does not exist (a DESTDIR staging tree, a moved
# prefix) the library and the command look for ../share/tkhub/registry beside themselves (api/ctx.c),
# so the build directory's path is never used by an installed tk.

PREFIX  ?= /usr/local
DESTDIR ?=
BINDIR   = $(PREFIX)/bin
LIBDIR   = $(PREFIX)/lib
INCDIR   = $(PREFIX)/include
DATADIR  = $(PREFIX)/share/tkhub
DOCDIR   = $(PREFIX)/share/doc/tkhub
MANDIR   = $(PREFIX)/share/man
PCDIR    = $(LIBDIR)/pkgconfig
CMAKEDIR = $(LIBDIR)/cmake/tkhub
IB      := $(B)/install
INST_ENDPOINT = file://$(DATADIR)/registry
TK_VERSION := $(shell sed -n 's/^\#define TK_VERSION_STRING "\(.*\)"/\1/p' include/tk.h)

INST_LIB_OBJ := $(filter-out $(B)/obj/api/ctx.o,$(LIB_OBJ)) $(IB)/obj/api/ctx.o

.PHONY: install uninstall

# Rebuild what names PREFIX when it changes: $(IB)/prefix holds the one it was built for.
ifneq ($(filter install $(IB)/%,$(MAKECMDGOALS)),)
$(shell mkdir -p $(IB) && { echo '$(PREFIX)' | cmp -s - $(IB)/prefix || echo '$(PREFIX)' >$(IB)/prefix; })
endif

$(IB)/obj/api/ctx.o: api/ctx.c $(IB)/prefix | $(B)/gen/tk_default.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MF $(@:.o=.dep) '-DTK_DEFAULT_ENDPOINT="$(INST_ENDPOINT)"' -c $< -o $@

$(IB)/libtkhub.a: $(INST_LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^
$(IB)/libtkhub-serve.a: $(INST_LIB_OBJ) $(SERVE_OBJ)
	@rm -f $@
	ar rcs $@ $^
$(IB)/libtkhub.so.$(SOMAJOR): $(INST_LIB_OBJ)
	$(CC) $(LDFLAGS) -shared -Wl,-soname,libtkhub.so.$(SOMAJOR) -o $@ $^ $(LDLIBS)
$(IB)/libtkhub-serve.so.$(SOMAJOR): $(INST_LIB_OBJ) $(SERVE_OBJ)
	$(CC) $(LDFLAGS) -shared -Wl,-soname,libtkhub-serve.so.$(SOMAJOR) -o $@ $^ $(LDLIBS) $(SERVE_LDLIBS)
$(IB)/tk: $(CLI_OBJ) $(SERVE_OBJ) $(IB)/libtkhub.a
	$(CC) $(LDFLAGS) -o $@ $(CLI_OBJ) $(SERVE_OBJ) $(IB)/libtkhub.a $(LDLIBS) $(SERVE_LDLIBS)

# pkg-config files: the dependencies by their own pkg-config names, so static links get their flags.
$(IB)/%.pc: scripts/tkhub.pc.in $(IB)/prefix Makefile scripts/install.mk
	@mkdir -p $(dir $@)
	sed -e 's#@PREFIX@#$(PREFIX)#g' -e 's#@VERSION@#$(TK_VERSION)#g' -e 's#@NAME@#$*#g' \
	    -e 's#@REQUIRES@#$(PKGS)$(if $(filter tkhub-serve,$*), $(SERVE_PKGS))#g' \
	    -e 's#@LIBS_PRIVATE@#$(strip $(LDLIBS) $(if $(filter tkhub-serve,$*),$(SERVE_LDLIBS)))#g' \
	    -e 's#@DESC@#$(if $(filter tkhub-serve,$*),libtkhub plus the tk registry server (tk_server_new),the tk kernel hub and JIT kernel package manager (client library))#g' \
	    $< >$@

$(IB)/tkhubConfig.cmake: scripts/tkhubConfig.cmake.in Makefile scripts/install.mk
	@mkdir -p $(dir $@)
	sed -e 's#@VERSION@#$(TK_VERSION)#g' -e 's#@SOMAJOR@#$(SOMAJOR)#g' \
	    -e 's#@LIBS@#$(strip $(LDLIBS))#g' -e 's#@SERVE_LIBS@#$(strip $(SERVE_LDLIBS))#g' $< >$@
$(IB)/tkhubConfigVersion.cmake: scripts/tkhubConfigVersion.cmake.in Makefile
	@mkdir -p $(dir $@)
	sed -e 's#@VERSION@#$(TK_VERSION)#g' $< >$@

INST_FILES := $(IB)/tk $(IB)/libtkhub.a $(IB)/libtkhub-serve.a $(IB)/libtkhub.so.$(SOMAJOR) \
              $(IB)/libtkhub-serve.so.$(SOMAJOR) $(IB)/tkhub.pc $(IB)/tkhub-serve.pc \
              $(IB)/tkhubConfig.cmake $(IB)/tkhubConfigVersion.cmake

install: $(INST_FILES) registry
	@D='$(DESTDIR)'; set -e; \
	install -d "$$D$(BINDIR)" "$$D$(LIBDIR)" "$$D$(INCDIR)/tkhub" "$$D$(PCDIR)" "$$D$(CMAKEDIR)" \
	           "$$D$(DATADIR)" "$$D$(DOCDIR)/docs" "$$D$(MANDIR)/man1"; \
	install -m 755 $(IB)/tk "$$D$(BINDIR)/tk"; \
	for l in libtkhub libtkhub-serve; do \
	  install -m 644 $(IB)/$$l.a "$$D$(LIBDIR)/$$l.a"; \
	  install -m 755 $(IB)/$$l.so.$(SOMAJOR) "$$D$(LIBDIR)/$$l.so.$(SOMAJOR)"; \
	  ln -sf $$l.so.$(SOMAJOR) "$$D$(LIBDIR)/$$l.so"; \
	  install -m 644 $(IB)/$${l#lib}.pc "$$D$(PCDIR)/$${l#lib}.pc"; \
	done; \
	install -m 644 include/tk.h "$$D$(INCDIR)/tkhub/tk.h"; \
	install -m 644 $(IB)/tkhubConfig.cmake $(IB)/tkhubConfigVersion.cmake "$$D$(CMAKEDIR)/"; \
	rm -rf "$$D$(DATADIR)/registry"; cp -R $(B)/registry "$$D$(DATADIR)/registry"; \
	rm -f "$$D$(DATADIR)/registry/.stamp"; chmod -R u+rwX,go+rX "$$D$(DATADIR)/registry"; \
	install -m 644 README.md "$$D$(DOCDIR)/README.md"; \
	install -m 644 docs/*.md "$$D$(DOCDIR)/docs/"; \
	install -m 644 docs/tk.1 "$$D$(MANDIR)/man1/tk.1"; \
	echo "installed tk $(TK_VERSION) into $$D$(PREFIX)"

uninstall:
	rm -f '$(DESTDIR)$(BINDIR)/tk' '$(DESTDIR)$(INCDIR)/tkhub/tk.h' \
	      '$(DESTDIR)$(PCDIR)/tkhub.pc' '$(DESTDIR)$(PCDIR)/tkhub-serve.pc' '$(DESTDIR)$(MANDIR)/man1/tk.1'
	rm -f '$(DESTDIR)$(LIBDIR)'/libtkhub.* '$(DESTDIR)$(LIBDIR)'/libtkhub-serve.*
	rm -rf '$(DESTDIR)$(CMAKEDIR)' '$(DESTDIR)$(DATADIR)' '$(DESTDIR)$(DOCDIR)'
	-rmdir '$(DESTDIR)$(INCDIR)/tkhub' 2>/dev/null
