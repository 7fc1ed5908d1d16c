#!/bin/sh
# `cmake --install` into a temporary prefix installs exactly libferry's
# public headers; each compiles on its own as C11 and as C++17 with
# warnings as errors; a C and a C++ program built against the installed
# prefix through pkg-config link (the C++ one calls a function of every
# header: extern "C" guards) and print ferry_version(), which must equal
# the version CMake states.
# Usage: abi_install.sh BUILD_DIR VERSION CC CXX HEADER_NAME...
# FERRY_ABI_FLAGS: extra compile and link flags (a sanitizer build's).
set -eu
build=$1 version=$2 cc=$3 cxx=$4
xflags=${FERRY_ABI_FLAGS:-}
shift 4
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
fail() { echo "FAIL: $*"; exit 1; }

cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log"; fail "cmake --install $build failed"; }

# Exactly the public headers.
[ -d "$prefix/include/ferry" ] || fail "no $prefix/include/ferry"
(cd "$prefix/include" && find . -type f | sed 's|^\./||' | sort) \
  >"$tmp/installed"
for h in "$@"; do echo "ferry/$h"; done | sort >"$tmp/expected"
if ! cmp -s "$tmp/installed" "$tmp/expected"; then
  echo "installed headers differ from the public list (< installed, > expected):"
  diff "$tmp/installed" "$tmp/expected" || true
  fail "installed headers"
fi
if grep -l 'ferry__' "$prefix/include/ferry/"*.h; then
  fail "an installed header names internal ferry__ functions"
fi

# Each header alone, in C and in C++.
for h in "$@"; do
  printf '#include <ferry/%s>\n#include <ferry/%s>\n' "$h" "$h" >"$tmp/one.c"
  cp "$tmp/one.c" "$tmp/one.cc"
  "$cc" -std=c11 -Wall -Wextra -Werror -I"$prefix/include" \
    -c "$tmp/one.c" -o "$tmp/one.o" || fail "ferry/$h does not compile as C11"
  "$cxx" -std=c++17 -Wall -Wextra -Werror -I"$prefix/include" \
    -c "$tmp/one.cc" -o "$tmp/one.o" || fail "ferry/$h does not compile as C++17"
done

# pkg-config from the prefix.
pc=$(find "$prefix" -name ferry.pc | head -n 1)
[ -n "$pc" ] || fail "no ferry.pc installed"
PKG_CONFIG_PATH=$(dirname "$pc")
export PKG_CONFIG_PATH
pcv=$(pkg-config --modversion ferry) || fail "pkg-config cannot read $pc"
[ "$pcv" = "$version" ] || fail "ferry.pc says version $pcv, CMake $version"
cflags=$(pkg-config --cflags ferry)
libs=$(pkg-config --libs ferry)
libdir=$(pkg-config --variable=libdir ferry)
[ -e "$libdir/libferry.so" ] || fail "pkg-config's libdir $libdir has no libferry.so"

cat >"$tmp/v.c" <<'C'
#include <stdio.h>
#include <string.h>

#include <ferry/client.h>

int main(void) {
  ferry_client_options_t o;
  ferry_client_options_init(&o);
  if (o.struct_size != sizeof(o) || o.prefetch != 3)
    return 2;
  if (strcmp(ferry_version(), FERRY_VERSION_STRING) != 0)
    return 3;
  printf("%s\n", ferry_version());
  return 0;
}
C
cat >"$tmp/v.cc" <<'CC'
#include <cstdio>
#include <cstring>

#include <ferry/augment.h>
#include <ferry/client.h>
#include <ferry/common.h>
#include <ferry/dlpack.h>
#include <ferry/error.h>
#include <ferry/export.h>
#include <ferry/log.h>
#include <ferry/version.h>

int main() {
  ferry_client_options_t o;
  ferry_client_options_init(&o);
  ferry_client_t *c = nullptr;
  ferry_error_t err;
  ferry_error_clear(&err);
  // No dispatcher: refused before any connection.
  if (ferry_client_new(&o, &c, &err) != FERRY_EINVAL || c != nullptr)
    return 2;
  ferry_augment_spec_t spec;
  if (ferry_augment_spec_parse("flip(horizontal)", &spec, &err) != 0)
    return 3;
  ferry_augment_spec_close(&spec);
  if (std::strcmp(ferry_err_name(FERRY_ESPEC), "ESPEC") != 0 ||
      ferry_strerror(FERRY_EINVAL) == nullptr)
    return 4;
  if (ferry_log_level_parse("debug") != FERRY_LOG_DEBUG)
    return 5;
  int64_t bytes = -1, blocks = -1;
  ferry_memory_stats(&bytes, &blocks);
  if (bytes < 0 || blocks < 0)
    return 6;
  ferry_free(nullptr);
  DLManagedTensor *t = nullptr;
  (void)t;
  std::printf("%s\n", ferry_version());
  return 0;
}
CC
# shellcheck disable=SC2086  # pkg-config's flags are word lists
"$cc" -std=c11 -Wall -Werror $xflags $cflags "$tmp/v.c" -o "$tmp/v_c" $libs \
  -Wl,-rpath,"$libdir" || fail "the C program does not build with pkg-config"
# shellcheck disable=SC2086
"$cxx" -std=c++17 -Wall -Werror $xflags $cflags "$tmp/v.cc" -o "$tmp/v_cxx" \
  $libs \
  -Wl,-rpath,"$libdir" || fail "the C++ program does not build with pkg-config"
for p in v_c v_cxx; do
  out=$("$tmp/$p") || fail "$p exited with $?"
  [ "$out" = "$version" ] ||
    fail "$p printed ferry_version() '$out', CMake's version is $version"
done
n=$(wc -l <"$tmp/installed")
echo "ok: $n public headers installed, each compiles alone (C11, C++17);" \
  "C and C++ programs via pkg-config print $version"
