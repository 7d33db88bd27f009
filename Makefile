# rdmx: build, install and package the libfabric provider.
#
#   make                  release build: build-out/lib/librdmx-fi.so (scripts/build.sh)
#   make install          librdmx-fi.so into libfabric's provider directory,
#                         fi_rdmx.7 into $(PREFIX)/share/man/man7
#   make uninstall        removes exactly those two files (and the directories
#                         install created, when they are empty again)
#   make deb              build-out/rdmx_<version>_<arch>.deb (scripts/package.sh)
#   make check-package    builds the .deb and checks it and make install in a
#                         private mount namespace (scripts/check-package.sh)
#
# Variables:
#   PREFIX   default /usr/local; the man page goes to $(PREFIX)/share/man/man7.
#   PROVDIR  where librdmx-fi.so goes. Default: libfabric's own provider
#            directory, $(pkg-config --variable=libdir libfabric)/libfabric
#            (on Debian 12 /usr/lib/x86_64-linux-gnu/libfabric, the directory
#            libfabric scans when FI_PROVIDER_PATH is unset), so that
#            `fi_info -p rdmx` works with no environment variable. When PREFIX
#            is given on the command line, $(PREFIX)/lib/libfabric instead
#            (then point FI_PROVIDER_PATH at it).
#   DESTDIR  staging root prepended to both (packagers).

PREFIX ?= /usr/local
ifeq ($(origin PREFIX),command line)
PROVDIR ?= $(PREFIX)/lib/libfabric
else ifeq ($(origin PREFIX),environment)
PROVDIR ?= $(PREFIX)/lib/libfabric
else
PROVDIR ?= $(shell pkg-config --variable=libdir libfabric)/libfabric
endif
MANDIR ?= $(PREFIX)/share/man
DESTDIR ?=

LIB := build-out/lib/librdmx-fi.so
MAN := docs/fi_rdmx.7

.PHONY: all build install uninstall deb check-package clean

all: build

build:
	./scripts/build.sh

# Builds first when cargo is at hand; under `sudo make install` (root's PATH
# and HOME usually have no cargo) installs what `make` built.
install:
	@if command -v cargo >/dev/null 2>&1 || [ -x "$$HOME/.cargo/bin/cargo" ]; then ./scripts/build.sh; \
	elif [ -f $(LIB) ]; then echo "make install: no cargo here; installing the $(LIB) that make built"; \
	else echo "make install: no cargo and no $(LIB): run make first" >&2; exit 1; fi
	@if [ "$(PROVDIR)" = "/libfabric" ]; then \
	  echo "make install: pkg-config knows no libfabric (install libfabric-dev) and PROVDIR is not set" >&2; exit 1; fi
	@for d in "$(DESTDIR)$(PROVDIR)" "$(DESTDIR)$(MANDIR)/man7"; do \
	  if [ ! -d "$$d" ]; then install -d -m 0755 "$$d" && echo "install: created $$d"; fi; done
	install -m 0644 $(LIB) "$(DESTDIR)$(PROVDIR)/librdmx-fi.so"
	install -m 0644 $(MAN) "$(DESTDIR)$(MANDIR)/man7/fi_rdmx.7"
	@echo "installed $(DESTDIR)$(PROVDIR)/librdmx-fi.so and $(DESTDIR)$(MANDIR)/man7/fi_rdmx.7"

# Removes the two files install put there, then the provider directory and
# man7 if that left them empty (neither exists on a stock Debian 12; no
# package owns them). Parents are never removed.
uninstall:
	rm -f "$(DESTDIR)$(PROVDIR)/librdmx-fi.so" "$(DESTDIR)$(MANDIR)/man7/fi_rdmx.7"
	-@rmdir "$(DESTDIR)$(PROVDIR)" 2>/dev/null && echo "uninstall: removed empty $(DESTDIR)$(PROVDIR)" || true
	-@rmdir "$(DESTDIR)$(MANDIR)/man7" 2>/dev/null && echo "uninstall: removed empty $(DESTDIR)$(MANDIR)/man7" || true

deb:
	./scripts/package.sh

check-package:
	./scripts/check-package.sh

clean:
	rm -rf build-out/lib build-out/deb build-out/*.deb
