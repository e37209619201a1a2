#!/usr/bin/env bash
# tests/packaging/test_install.sh PREFIX WORKDIR VERSION -- checks a `make install` tree
# (`make check-install` runs it on its staged DESTDIR copy): the shared library's
# symlink chain and soname, birkhoff.pc's version, the CMake package's version file,
# and examples/quickstart.c built with CMake through find_package(birkhoff) against the
# shared and the static library (WORKDIR: the CMake build directories).
set -euo pipefail
prefix=$1 work=$2 version=$3
major=${version%%.*}
src=$(cd "$(dirname "$0")/../.." && pwd)
fail() { echo "FAIL $*" >&2; exit 1; }

# libbirkhoff.so -> libbirkhoff.so.MAJOR -> libbirkhoff.so.VERSION (a file); the soname
lib=$prefix/lib
[ "$(readlink "$lib/libbirkhoff.so")" = "libbirkhoff.so.$major" ] || fail "libbirkhoff.so does not point to libbirkhoff.so.$major"
[ "$(readlink "$lib/libbirkhoff.so.$major")" = "libbirkhoff.so.$version" ] || fail "libbirkhoff.so.$major does not point to libbirkhoff.so.$version"
[ -f "$lib/libbirkhoff.so.$version" ] && [ ! -L "$lib/libbirkhoff.so.$version" ] || fail "libbirkhoff.so.$version is not a file"
soname=$(readelf -d "$lib/libbirkhoff.so.$version" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = "libbirkhoff.so.$major" ] || fail "soname is '$soname', want libbirkhoff.so.$major"
echo "shared library: libbirkhoff.so -> libbirkhoff.so.$major -> libbirkhoff.so.$version, soname $soname"

# the version everywhere is core.h's
pcv=$(PKG_CONFIG_PATH=$lib/pkgconfig pkg-config --modversion birkhoff)
[ "$pcv" = "$version" ] || fail "birkhoff.pc says $pcv, want $version"
echo "birkhoff.pc: version $pcv"

command -v cmake >/dev/null || fail "cmake is not installed (scripts/deps.sh installs it)"
cmake -DVERSION_FILE="$lib/cmake/birkhoff/birkhoffConfigVersion.cmake" -DVERSION="$version" \
      -P "$src/tests/packaging/version_check.cmake"

# the example through find_package(birkhoff VERSION CONFIG) from the staged prefix
rm -rf "$work"
cmake -S "$src/examples/cmake" -B "$work/ok" -DCMAKE_PREFIX_PATH="$prefix" -DBIRKHOFF_VERSION="$version" \
      -DCMAKE_C_FLAGS="-Wall -Werror" > "$work.log" 2>&1 || { cat "$work.log"; fail "cmake configure"; }
found=$(sed -n 's/^birkhoff_DIR:PATH=//p' "$work/ok/CMakeCache.txt")
[ "$found" = "$lib/cmake/birkhoff" ] || fail "find_package found birkhoff in '$found', want $lib/cmake/birkhoff"
cmake --build "$work/ok" -j2 >> "$work.log" 2>&1 || { cat "$work.log"; fail "cmake build"; }
readelf -d "$work/ok/quickstart" | grep -q "NEEDED.*\[libbirkhoff.so.$major\]" || fail "quickstart does not need libbirkhoff.so.$major"
if readelf -d "$work/ok/quickstart_static" | grep -q "NEEDED.*libbirkhoff"; then fail "quickstart_static needs libbirkhoff.so"; fi
LD_LIBRARY_PATH=$lib "$work/ok/quickstart" > "$work/ok/shared.out"
"$work/ok/quickstart_static" > "$work/ok/static.out"
cmp -s "$work/ok/shared.out" "$work/ok/static.out" || fail "the shared and static quickstart print different results"
echo "cmake: find_package(birkhoff $version) from $lib/cmake/birkhoff; quickstart (shared, static) built and run:"
sed 's/^/  /' "$work/ok/shared.out"

# a version this installation does not meet stops the configuration
if cmake -S "$src/examples/cmake" -B "$work/newer" -DCMAKE_PREFIX_PATH="$prefix" \
         -DBIRKHOFF_VERSION="$((major + 1)).0" > "$work.log" 2>&1; then
  fail "find_package(birkhoff $((major + 1)).0) succeeded against $version"
fi
grep -q "birkhoffConfig.cmake, version: $version" "$work.log" || { cat "$work.log"; fail "the refusal does not name the version file"; }
echo "cmake: find_package(birkhoff $((major + 1)).0) is refused"
rm -f "$work.log"
