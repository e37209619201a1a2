#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz (one per parser of untrusted
# input) with clang + ASan + UBSan and runs them in one of two modes:
#
#   scripts/fuzz.sh [TARGET...]                   (default: all of idx digits mail config ckpt npy npz parallel)
#   FUZZ_MODE=replay scripts/fuzz.sh [TARGET...]
#
# FUZZ_MODE=explore (the default; `make fuzz`): libFuzzer explores for
#   FUZZ_SECONDS per target, starting from the checked-in inputs. What it
#   reaches depends on the machine's speed, so a run is not reproducible.
# FUZZ_MODE=replay (`make check`): every checked-in input of a target is
#   executed exactly once (the files are given to libFuzzer as arguments,
#   which runs each and exits; nothing is mutated) and the number executed
#   must equal the number of files. Deterministic: the same inputs on every
#   machine, seconds in all.
# The checked-in inputs of a target: tests/fuzz/corpus/<target>/ (seeds,
# made by tests/fuzz/make_corpus.sh) and tests/fuzz/regress/<target>/
# (every input that once failed, or was minimised from a finding; added by
# tests/fuzz/add_regress.sh). Both are only read, never written.
#
# Environment:
#   FUZZ_MODE=explore  explore | replay
#   FUZZ_SECONDS=10    explore: fuzzing time per target (-max_total_time)
#   FUZZ_SEED=         explore: libFuzzer's -seed (unset: a fresh random seed every run)
#   FUZZ_JOBS=nproc    targets run at once (each single-threaded)
#   FUZZ_REQUIRED=0    1: a missing clang/libFuzzer is a failure, not a SKIP
#   FUZZ_INSTALL=0     1: install what is missing with apt-get (as root or via sudo)
#   FUZZ_BUILD=build-fuzz   objects (reused while sources, headers and flags are unchanged) and binaries
#   FUZZ_OUT=$FUZZ_BUILD/out  per-target logs and crash reproducers (crash-*, leak-*, oom-*, timeout-*)
#   FUZZ_ARGS=         extra libFuzzer arguments for every target (e.g. -use_value_profile=1)
#   CLANG=clang
#
# Failures, in both modes: sanitizer reports (ASan, UBSan, leaks), violated
# invariants of the targets (abort), inputs running over 10 s, and
# allocations over 2 GB; in replay also an input count that does not match
# the files. Exit status: 0 when every target ran clean (or everything was
# skipped), 1 when a target failed or the build failed.
# Reproduce a failure: $FUZZ_BUILD/fuzz_<target> FILE (explore: the
# reproducer under $FUZZ_OUT/<target>/; replay: the checked-in file its log
# names on the last "Running:" line).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

ALL_TARGETS=(idx digits mail config ckpt npy npz parallel labelled)
MODE=${FUZZ_MODE:-explore}
case $MODE in explore|replay) ;; *) echo "fuzz: FUZZ_MODE=$MODE: expected explore or replay" >&2; exit 2 ;; esac
SECONDS_PER=${FUZZ_SECONDS:-10}
B=${FUZZ_BUILD:-build-fuzz}
case $B in /*) BABS=$B ;; *) BABS=$ROOT/$B ;; esac
OUT=${FUZZ_OUT:-$B/out}
case $OUT in /*) ;; *) OUT=$ROOT/$OUT ;; esac
CLANG=${CLANG:-clang}
CLANGXX=${CLANGXX:-${CLANG/clang/clang++}}
NPROC=$(nproc 2>/dev/null || echo 2)
JOBS=${FUZZ_JOBS:-$NPROC}
TARGETS=("$@")
[ ${#TARGETS[@]} -eq 0 ] && TARGETS=("${ALL_TARGETS[@]}")
for t in "${TARGETS[@]}"; do
  [ -f "tests/fuzz/fuzz_$t.c" ] || { echo "fuzz: unknown target '$t' (${ALL_TARGETS[*]})" >&2; exit 2; }
done

max_len_of() { case $1 in idx) echo 262144 ;; *) echo 65536 ;; esac; }

# ---- toolchain ----
mkdir -p "$B"
probe() { # $1: extra flags; compiles and links a trivial fuzz target
  rm -f "$B/probe.log"
  command -v "$CLANG" >/dev/null 2>&1 || { echo "$CLANG: command not found" >"$B/probe.log"; return 1; }
  printf '#include <stdint.h>\n#include <stddef.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n' \
    >"$B/probe.c"
  "$CLANG" $1 -fsanitize=fuzzer,address,undefined "$B/probe.c" -o "$B/probe" >"$B/probe.log" 2>&1
}
apt_install() {
  local sudo=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null || return 1
    sudo="sudo -n"
  fi
  echo "fuzz: installing $* with apt-get"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y --no-install-recommends "$@"
}
if ! probe ""; then
  if [ "${FUZZ_INSTALL:-0}" = 1 ]; then
    apt_install clang libclang-rt-14-dev || echo "fuzz: apt-get install failed (not root, and no passwordless sudo?)"
  fi
  if ! probe ""; then
    echo "fuzz: clang with libFuzzer (-fsanitize=fuzzer) is not usable here:"
    [ -f "$B/probe.log" ] && sed 's/^/  /' "$B/probe.log" | head -5
    echo "fuzz: install Debian's 'clang' and 'libclang-rt-14-dev' (or run with FUZZ_INSTALL=1 as root)"
    if [ "${FUZZ_REQUIRED:-0}" = 1 ]; then
      echo "fuzz: FAIL (FUZZ_REQUIRED=1)"
      exit 1
    fi
    echo "fuzz: SKIP"
    exit 0
  fi
fi
# OpenMP as the Makefile builds it (needs libomp-14-dev for clang); without
# it the library runs single-threaded, which is fine for fuzzing.
OMP="-fopenmp"
if ! probe "-fopenmp"; then
  [ "${FUZZ_INSTALL:-0}" = 1 ] && apt_install libomp-14-dev >/dev/null
  if ! probe "-fopenmp"; then
    echo "fuzz: clang -fopenmp does not link (Debian libomp-14-dev); building without OpenMP"
    OMP=""
  fi
fi

# ---- sources and flags (the lists come from the Makefile) ----
printf 'fuzz-print-%%:\n\t@echo $($*)\n' >"$B/print.mk"
mkvar() { make --no-print-directory -s -f Makefile -f "$B/print.mk" "fuzz-print-$1" 2>/dev/null; }
LIB_SRC="$(mkvar CORE_SRC) $(mkvar BACKEND_SRC) $(mkvar OPS_SRC) $(mkvar NN_SRC) $(mkvar DATA_SRC) $(mkvar TRAIN_SRC)"
AVX512_FLAGS=$(mkvar AVX512_FLAGS)
if [ -z "${LIB_SRC// /}" ]; then # no make, or the Makefile changed shape: every source
  LIB_SRC=$(ls src/core/*.c src/backend/*.c src/ops/*.c src/nn/*.c src/data/*.c src/train/*.c | grep -v -e lse_engine.c -e gemm_kern.c | tr '\n' ' ')
fi
[ -n "$AVX512_FLAGS" ] || AVX512_FLAGS="-mavx512f -mavx512vl -mavx512bw -mavx512dq -mprefer-vector-width=512"
BLAS_INC=${BLAS_INC:-/usr/include/x86_64-linux-gnu/openblas-pthread}
SAN="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
CFLAGS="-std=c11 -D_POSIX_C_SOURCE=200809L -g -O1 -march=x86-64-v3 -fno-trapping-math -fno-math-errno $OMP \
-Wall -Wextra -Wshadow -Wstrict-prototypes -Wno-pass-failed -Iinclude -I$BLAS_INC $SAN"
# the library's C++ shim (src/data/spm.cc, DATA_CXX) with clang++ and the same sanitizers; SentencePiece linked
CXXFLAGS="-std=c++17 -g -O1 -march=x86-64-v3 -Wall -Wextra -Wshadow -Wno-pass-failed -Iinclude -fsanitize=address,undefined \
-fno-sanitize=vptr -fno-sanitize-recover=all -fno-omit-frame-pointer"
LIBS="-lopenblas -llapacke -lm -lz -lsentencepiece -lsentencepiece_train -lstdc++ $OMP"

# objects are rebuilt when the flags changed, or their source or any header is newer
OBJ=$B/obj
FLAGS_NOW="$CLANG $("$CLANG" --version | head -1) | $CFLAGS | $AVX512_FLAGS"
if [ ! -f "$B/flags" ] || [ "$(cat "$B/flags")" != "$FLAGS_NOW" ]; then
  rm -rf "$OBJ"
  printf '%s' "$FLAGS_NOW" >"$B/flags"
fi
mkdir -p "$OBJ" "$OUT"
NEWEST_HDR=$(ls -t include/*.h include/birkhoff/*.h src/*/*.h tests/fuzz/*.h 2>/dev/null | head -1)
stale() { [ ! -f "$2" ] || [ "$1" -nt "$2" ] || [ "$NEWEST_HDR" -nt "$2" ]; }

T0=$(date +%s)
BUILD_LOG=$B/build.log
: >"$BUILD_LOG"
jobs_list=()  # "src|obj|extra flags"
for s in $LIB_SRC; do
  jobs_list+=("$s|$OBJ/$(echo "${s%.c}" | tr / _).o|-fsanitize=fuzzer-no-link")
done
for s in $(mkvar DATA_CXX); do
  jobs_list+=("$s|$OBJ/$(echo "${s%.cc}" | tr / _).o|-fsanitize=fuzzer-no-link")
done
jobs_list+=("src/core/lse_engine.c|$OBJ/src_core_lse_engine_avx2.o|-fsanitize=fuzzer-no-link -DBK_ISA=avx2")
jobs_list+=("src/core/lse_engine.c|$OBJ/src_core_lse_engine_avx512.o|-fsanitize=fuzzer-no-link $AVX512_FLAGS -DBK_ISA=avx512")
jobs_list+=("src/core/gemm_kern.c|$OBJ/src_core_gemm_kern_avx2.o|-fsanitize=fuzzer-no-link -DBK_ISA=avx2")
jobs_list+=("src/core/gemm_kern.c|$OBJ/src_core_gemm_kern_avx512.o|-fsanitize=fuzzer-no-link $AVX512_FLAGS -DBK_ISA=avx512")
for t in "${TARGETS[@]}"; do
  jobs_list+=("tests/fuzz/fuzz_$t.c|$OBJ/fuzz_$t.o|-fsanitize=fuzzer")
done
compile() { # src obj flags
  case $1 in *.cc) if "$CLANGXX" $CXXFLAGS $3 -c "$1" -o "$2.tmp" >"$2.log" 2>&1; then mv "$2.tmp" "$2"; else rm -f "$2.tmp"; return 1; fi; return ;; esac
  if "$CLANG" $CFLAGS $3 -c "$1" -o "$2.tmp" >"$2.log" 2>&1; then mv "$2.tmp" "$2"; else rm -f "$2.tmp"; return 1; fi
}
built=0
running=0
for j in "${jobs_list[@]}"; do
  IFS='|' read -r src obj fl <<<"$j"
  stale "$src" "$obj" || continue
  built=$((built + 1))
  compile "$src" "$obj" "$fl" &
  running=$((running + 1))
  if [ "$running" -ge "$NPROC" ]; then wait -n; running=$((running - 1)); fi
done
wait
fail=0
for j in "${jobs_list[@]}"; do
  IFS='|' read -r src obj fl <<<"$j"
  if [ -s "$obj.log" ]; then cat "$obj.log" >>"$BUILD_LOG"; fi
  if [ ! -f "$obj" ]; then echo "fuzz: cannot compile $src:"; sed 's/^/  /' "$obj.log" | head -20; fail=1; fi
done
[ "$fail" = 0 ] || { echo "fuzz: FAIL (build)"; exit 1; }
LIBA=$B/libbirkhoff-fuzz.a
lib_objs=()
for j in "${jobs_list[@]}"; do
  IFS='|' read -r src obj fl <<<"$j"
  case $obj in */fuzz_*.o) ;; *) lib_objs+=("$obj") ;; esac
done
if [ ! -f "$LIBA" ] || [ "$built" -gt 0 ]; then
  rm -f "$LIBA"
  ar rcs "$LIBA" "${lib_objs[@]}" || { echo "fuzz: FAIL (ar)"; exit 1; }
fi
for t in "${TARGETS[@]}"; do
  bin=$B/fuzz_$t
  if [ ! -x "$bin" ] || [ "$OBJ/fuzz_$t.o" -nt "$bin" ] || [ "$LIBA" -nt "$bin" ]; then
    if ! "$CLANG" $CFLAGS -fsanitize=fuzzer "$OBJ/fuzz_$t.o" "$LIBA" $LIBS -o "$bin" >"$B/link_$t.log" 2>&1; then
      echo "fuzz: cannot link $bin:"
      sed 's/^/  /' "$B/link_$t.log" | head -20
      echo "fuzz: FAIL (build)"
      exit 1
    fi
  fi
done
nwarn=$(grep -c 'warning:' "$BUILD_LOG" || true)
echo "fuzz: built ${#TARGETS[@]} targets in $(($(date +%s) - T0)) s ($built objects compiled, $nwarn warnings, $([ -n "$OMP" ] && echo OpenMP || echo no OpenMP); $B/)"
[ "$nwarn" = 0 ] || grep 'warning:' "$BUILD_LOG" | head -10 | sed 's/^/  /'

# ---- fuzzing or replay ----
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
# (a caller's ASAN_OPTIONS/UBSAN_OPTIONS come last and win). A failed
# allocation returns NULL, which the library must handle; one over 2 GB
# (libFuzzer's malloc limit = -rss_limit_mb) is reported as oom-*: a small
# input must not make a parser allocate gigabytes.
export ASAN_OPTIONS="abort_on_error=1:detect_leaks=1:allocator_may_return_null=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
# the targets that take a path write every input to a file: on a disk file
# system (ext4's replace-by-rename/truncate flushes) that costs milliseconds
# per input, so their temporary files live in memory when /dev/shm is usable
TMPBASE=${FUZZ_TMPDIR:-}
if [ -z "$TMPBASE" ]; then
  TMPBASE=${TMPDIR:-/tmp}
  [ -d /dev/shm ] && [ -w /dev/shm ] && TMPBASE=/dev/shm
fi
WORK=$(mktemp -d "$TMPBASE/bk-fuzz.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
inputs_of() { # target: the checked-in inputs, one absolute path a line, sorted
  find "$ROOT/tests/fuzz/corpus/$1" "$ROOT/tests/fuzz/regress/$1" -type f 2>/dev/null | LC_ALL=C sort
}
run_one() { # target
  local t=$1 w="$WORK/$1" o="$OUT/$1" dict=()
  rm -rf "$o"
  mkdir -p "$w/corpus" "$o"
  if [ "$MODE" = replay ]; then
    inputs_of "$t" >"$o/inputs"
    if [ ! -s "$o/inputs" ]; then
      echo "fuzz: no checked-in inputs for $t" >"$o/log"
      echo 98 >"$o/rc"
      return
    fi
    local files
    mapfile -t files <"$o/inputs"
    # file arguments: libFuzzer runs each once (whole: no -max_len) and exits
    # shellcheck disable=SC2086
    (cd "$w" && TMPDIR="$w" exec "$BABS/fuzz_$t" -rss_limit_mb=2048 -timeout=10 -artifact_prefix="$o/" \
      ${FUZZ_ARGS:-} "${files[@]}") >"$o/log" 2>&1
    echo $? >"$o/rc"
    return
  fi
  cp -R "tests/fuzz/corpus/$t/." "$w/corpus/" 2>/dev/null
  # the regressions are read as a second corpus directory (new units go to the first)
  mkdir -p "$w/regress"
  cp -R "tests/fuzz/regress/$t/." "$w/regress/" 2>/dev/null
  [ -f "tests/fuzz/$t.dict" ] && dict=(-dict="$ROOT/tests/fuzz/$t.dict")
  # shellcheck disable=SC2086
  (cd "$w" && TMPDIR="$w" exec "$BABS/fuzz_$t" corpus regress "${dict[@]}" -max_total_time="$SECONDS_PER" \
    -rss_limit_mb=2048 -max_len="$(max_len_of "$t")" -timeout=10 -print_final_stats=1 -artifact_prefix="$o/" \
    ${FUZZ_SEED:+-seed=$FUZZ_SEED} ${FUZZ_ARGS:-}) >"$o/log" 2>&1
  echo $? >"$o/rc"
}
TF=$(date +%s)
running=0
for t in "${TARGETS[@]}"; do
  run_one "$t" &
  running=$((running + 1))
  if [ "$running" -ge "$JOBS" ]; then wait -n; running=$((running - 1)); fi
done
wait

status=0
for t in "${TARGETS[@]}"; do
  o="$OUT/$t"
  rc=$(cat "$o/rc" 2>/dev/null || echo 99)
  if [ "$MODE" = replay ]; then
    nfiles=$(wc -l <"$o/inputs" 2>/dev/null || echo 0)
    nseed=$(grep -c "/tests/fuzz/corpus/$t/" "$o/inputs" 2>/dev/null)
    nseed=${nseed:-0}
    # libFuzzer announces "Running N inputs K time(s) each." and prints one
    # "Executed FILE" per input once its K runs are done
    ran=$(grep -c '^Executed ' "$o/log" 2>/dev/null)
    ran=${ran:-0}
    plan=$(sed -n 's/.*: Running \([0-9]*\) inputs \([0-9]*\) time(s) each\.$/\1 \2/p' "$o/log" | head -1)
    plan=${plan:-? ?}
    last=$(sed -n 's/^Running: //p' "$o/log" | tail -1)
    if [ "$rc" = 0 ] && [ "$ran" = "$nfiles" ] && [ "$plan" = "$nfiles 1" ]; then
      res=ok
    elif [ "$rc" = 0 ]; then
      res="FAIL ($nfiles files, libFuzzer ran ${plan% *} inputs ${plan#* } time(s) each and executed $ran)"
      status=1
    else
      res="FAIL (rc $rc${last:+, input ${last#"$ROOT"/}})"
      status=1
    fi
    printf 'fuzz: %-7s %4s/%-4s inputs run (%s seeds + %s regressions)  %s\n' "$t" "$ran" "$nfiles" "$nseed" \
      "$((nfiles - nseed))" "$res"
    continue
  fi
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$o/log" | tail -1)
  eps=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$o/log" | tail -1)
  rss=$(sed -n 's/^stat::peak_rss_mb: *//p' "$o/log" | tail -1)
  cov=$(grep -o 'cov: [0-9]* ft: [0-9]*' "$o/log" | tail -1)
  corp=$(grep -o 'corp: [0-9]*/[0-9]*[a-zA-Z]*' "$o/log" | tail -1)
  art=$(ls "$o" | grep -E '^(crash|leak|oom|timeout|slow-unit)-' | head -1)
  if [ "$rc" = 0 ]; then
    res=ok
  else
    res="FAIL (rc $rc${art:+, reproducer $o/$art})"
    status=1
  fi
  printf 'fuzz: %-7s %8s execs %7s/s  %-18s %-16s rss %4s MB  %s\n' "$t" "${execs:-?}" "${eps:-?}" "${cov:-cov: ?}" \
    "${corp:-}" "${rss:-?}" "$res"
done
if [ "$status" != 0 ]; then
  for t in "${TARGETS[@]}"; do
    [ "$(cat "$OUT/$t/rc" 2>/dev/null)" = 0 ] && continue
    echo "---- $t: $OUT/$t/log (last lines) ----"
    grep -v -E '^#[0-9]+|^INFO:|^stat::|^MS:|^base unit:|^Running: |^Executed |^\*\*\*' "$OUT/$t/log" | tail -40
  done
fi
if [ "$MODE" = replay ]; then
  what="every checked-in input once"
else
  what="${SECONDS_PER} s each${FUZZ_SEED:+, seed $FUZZ_SEED}"
fi
echo "fuzz: $([ "$status" = 0 ] && echo PASS || echo FAIL) ($MODE): ${#TARGETS[@]} targets, $what," \
  "$(($(date +%s) - TF)) s running, $(($(date +%s) - T0)) s in all"
exit "$status"
