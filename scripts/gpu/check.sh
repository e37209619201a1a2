#!/usr/bin/env bash
# scripts/gpu/check.sh -- the CUDA backend's checks on a machine with a GPU
# (docs/CUDA.md, "Testing on a GPU"): the C tests (the CUDA group and the
# cross-backend harness), the PyTorch tests, a ViT on MNIST trained on the
# GPU, the benchmarks and a profile of the forward; logs and figures into
# $OUT (default ./gpu-out).
#
# The build is made where the toolchain and the CPU libraries are (make
# CUDA=1) and brought along as a pack (scripts/gpu/pack.sh): stripped
# binaries and the shared libraries they need, since the GPU machine may
# have neither OpenBLAS nor a package registry. Without a pack it uses
# build/ as it is.
#   STEPS="ctest pytest vit bench timeline mem prof"  (default: all)
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
STEPS=${STEPS:-"ctest pytest vit bench timeline mem prof"}
if [ -f .devpack/pack.tar.xz ]; then
    mkdir -p build .devlibs
    tar -C .devpack -xJf .devpack/pack.tar.xz
    cp .devpack/build/* build/ && cp .devpack/libs/* .devlibs/
fi
export LD_LIBRARY_PATH=$PWD/.devlibs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1 BK_REQUIRE_CUDA=1
[ -d .devdata/mnist ] && export BK_DATA=$PWD/.devdata
PY=${PY:-python3}
rc=0
step() { case " $STEPS " in *" $1 "*) return 0;; esac; return 1; }
log() { echo "=== $* ($(date +%T))"; }

{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; nproc; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

if step ctest; then
    log "C tests: the cuda group and the harness"
    timeout 300 build/test_birkhoff cuda > "$OUT/ctest.log" 2>&1
    r=$?; [ $r -ne 0 ] && rc=1
    grep -E "^FAIL|SKIP|passed" "$OUT/ctest.log" | head -60
    if [ $r -ne 0 ] && command -v compute-sanitizer > /dev/null; then
        log "memcheck of the quick cuda group"
        timeout 150 compute-sanitizer --tool memcheck --print-limit 10 build/test_birkhoff cuda --quick \
            > "$OUT/memcheck.log" 2>&1
        grep -E "Invalid|ERROR SUMMARY|at .*kernel|by thread" "$OUT/memcheck.log" | head -30
    fi
fi
if step pytest; then
    log "PyTorch tests on CUDA"
    timeout 240 $PY tests/python/test_cuda.py > "$OUT/pytest.log" 2>&1 || rc=1
    grep -E "FAIL|SKIP|passed|Error" "$OUT/pytest.log" | head -40
fi
if step vit; then
    log "ViT on MNIST on the GPU"
    timeout 180 $PY tests/python/test_vit_mnist.py --device cuda ${VIT_ARGS:-} > "$OUT/vit.log" 2>&1 || rc=1
    tail -15 "$OUT/vit.log"
fi
if step bench; then
    log "benchmarks"
    timeout ${BENCH_TIMEOUT:-200} $PY bench/cuda_bench.py --out "$OUT/bench.json" ${BENCH_ARGS:-} > "$OUT/bench.log" 2>&1
    cat "$OUT/bench.md" 2>/dev/null || tail -30 "$OUT/bench.log"
fi
if step timeline; then
    log "timeline of forward + backward (torch.profiler, full clocks)"
    timeout 90 $PY bench/cuda_timeline.py --out "$OUT/timeline.json" > "$OUT/timeline.txt" 2>&1
    cat "$OUT/timeline.txt" | head -80
fi
if step mem; then
    log "memory"
    timeout 90 $PY bench/cuda_mem.py --out "$OUT/mem.json" > "$OUT/mem.log" 2>&1
    cat "$OUT/mem.md" 2>/dev/null || tail -20 "$OUT/mem.log"
fi
if step prof && command -v ncu > /dev/null; then
    log "profile of the forward and the backward (N=4096, bf16, S=5)"
    timeout 150 ncu --section SpeedOfLight --section ComputeWorkloadAnalysis --section Occupancy \
        --section WarpStateStats --section SchedulerStats --section InstructionStats \
        --kernel-name regex:"pass_kernel|tc_kernel|tc_dv_kernel|tc_grad4_kernel" --launch-skip 5 --launch-count 20 \
        $PY bench/cuda_profile.py > "$OUT/profile.txt" 2>&1
    grep -E "pass_kernel|tc_kernel|tc_dv_kernel|tc_grad4_kernel|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers" \
        "$OUT/profile.txt" | head -130
fi
log "done rc=$rc"
exit $rc
