#!/bin/sh
# install_and_embed.sh CMAKE BUILD_DIR EMBED_C CC: installs libkvrouter from BUILD_DIR into a
# temporary prefix, compiles the embedding example against that prefix with pkg-config only
# (no source tree on the include path), runs it, and removes the prefix. Exit status: the
# first failure's.
set -eu
cmake=$1 build=$2 src=$3 cc=$4
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
"$cmake" --install "$build" --prefix "$prefix" >/dev/null
test -f "$prefix/include/kvrouter.h"
test -f "$prefix/include/kvrouter/router.h"
test -f "$prefix/lib/libkvrouter.a"
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
flags=$(pkg-config --cflags --libs --static kvrouter)
# shellcheck disable=SC2086
"$cc" -std=c11 -Wall -Wextra -Werror "$src" $flags -o "$prefix/embed"
"$prefix/embed"
