# birkhoff -- top-level build (GNU make).
#   make            library (static + shared) and the birkhoff CLI
#   make check      everything the README's test command runs (deps, -Werror
#                   build, unit/property/gradient tests, ASan+UBSan build of
#                   the tests, the PyTorch oracle test)
#   make run        the main job (scripts/main.sh): train a Transformer and a
#                   Sinkformer on MNIST, evaluate, compile ASAP, plot
#   make install    PREFIX=/usr/local DESTDIR=
# Variables: BUILD (output dir), SAN=1 (ASan+UBSan), WERROR=1, CC.
CC      ?= gcc
PREFIX  ?= /usr/local
BUILD   ?= build
PY      ?= /usr/bin/python3
BLAS_INC ?= /usr/include/x86_64-linux-gnu/openblas-pthread

OPT     ?= -O3
CFLAGS_ALL = -std=c11 -D_POSIX_C_SOURCE=200809L $(OPT) -g -march=x86-64-v3 -fno-trapping-math \
             -fno-math-errno -fopenmp -fPIC -fvisibility=hidden -Wall -Wextra -Wshadow \
             -Wstrict-prototypes -Iinclude -I$(BLAS_INC) $(CFLAGS)
ifeq ($(WERROR),1)
CFLAGS_ALL += -Werror
CXXFLAGS_ALL += -Werror
endif
ifeq ($(SAN),1)
CFLAGS_ALL += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined -DBK_TAPE_CHECKSUM
LDSAN = -fsanitize=address,undefined
CXXFLAGS_ALL += -fsanitize=address,undefined -fno-sanitize=vptr -fno-omit-frame-pointer -fno-sanitize-recover=undefined
endif
# zlib: the library reads gzipped datasets (src/data); SentencePiece (Debian
# libsentencepiece-dev): the C++ library behind src/data/spm.cc (bk_spm_*), hence the C++ runtime
LDLIBS_ALL = -lopenblas -llapacke -lm -lz -lsentencepiece -lsentencepiece_train -lstdc++ -fopenmp -pthread $(LDSAN) $(LDLIBS)
# the library's C++ files (src/data/spm.cc): C++17, the C flags' optimisation, visibility and warnings
CXX     ?= g++
CXXFLAGS_ALL = -std=c++17 $(OPT) -g -march=x86-64-v3 -fPIC -fvisibility=hidden -Wall -Wextra -Wshadow -Iinclude $(CXXFLAGS)

# The CUDA backend (docs/CUDA.md): built when nvcc is found (PATH, else
# /usr/local/cuda/bin), or forced with CUDA=1 / left out with CUDA=0. Kernels
# for sm_90 plus PTX; the CUDA runtime is linked statically (the driver,
# libcuda, is loaded at run time: a machine without a GPU runs everything
# else, and the CUDA tests skip).
NVCC ?= $(firstword $(shell command -v nvcc 2>/dev/null) $(wildcard /usr/local/cuda/bin/nvcc))
ifeq ($(NVCC),)
CUDA ?= 0
else
CUDA ?= 1
endif
ifeq ($(CUDA),1)
ifeq ($(NVCC),)
$(error CUDA=1 but nvcc was not found (install CUDA or set NVCC=/path/to/nvcc))
endif
# the toolkit's root as nvcc itself reports it (nvcc on PATH may be a wrapper
# script elsewhere), else the directory above nvcc's bin/
ifeq ($(origin CUDA_HOME),undefined)
CUDA_HOME := $(firstword $(patsubst %/bin/..,%,$(shell $(NVCC) --dryrun -c -x cu /dev/null -o /dev/null 2>&1 | sed -n 's/^\#\$$ TOP=//p')) $(patsubst %/bin/nvcc,%,$(NVCC)))
endif
CUDA_ARCH ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
NVCCFLAGS = -std=c++17 -O3 -lineinfo $(CUDA_ARCH) -Iinclude -Xcompiler -fPIC,-fvisibility=hidden,-Wall,-Wextra $(NVCC_EXTRA)
ifeq ($(WERROR),1)
NVCCFLAGS += -Werror all-warnings -Xcompiler -Werror
endif
CFLAGS_ALL += -DBK_HAVE_CUDA -I$(CUDA_HOME)/include
LDLIBS_ALL += -L$(CUDA_HOME)/lib64 -lcudart_static -lstdc++ -ldl -lrt -lpthread
CUDA_OBJ = $(BUILD)/obj/src/backend/cuda/backend.o $(BUILD)/obj/src/backend/cuda/kernels.o
endif

# Data-parallel training under MPI (docs/TRAINING.md, "Several processes"):
# the CLI (tools/train/mpi.c) links Open MPI when its pkg-config file is
# found (Debian: libopenmpi-dev), MPI=1 forces it, MPI=0 leaves it out. The
# library never depends on MPI (its seam is bk_train_comm).
MPI_PC ?= ompi-c
MPI ?= $(shell pkg-config --exists $(MPI_PC) 2>/dev/null && echo 1 || echo 0)
ifeq ($(MPI),1)
MPI_CFLAGS := $(shell pkg-config --cflags $(MPI_PC)) -DBK_HAVE_MPI
MPI_LIBS := $(shell pkg-config --libs $(MPI_PC))
endif

# the CLI's plots (cairo)
CAIRO_CFLAGS := $(shell pkg-config --cflags cairo 2>/dev/null)
CLI_LIBS := $(shell pkg-config --libs cairo 2>/dev/null || echo -lcairo)
TOOL_HDRS = tools/cli.h tools/plot/chart.h tools/train/train_mpi.h

AVX512_FLAGS = -mavx512f -mavx512vl -mavx512bw -mavx512dq -mprefer-vector-width=512

CORE_SRC = src/core/status.c src/core/abi.c src/core/threads.c src/core/pool.c src/core/gemm.c src/core/config.c src/core/text.c src/core/tensor.c src/core/implicit.c src/core/npy.c src/core/npz.c src/core/outfile.c src/core/sort1d.c
# every operator is its own file in src/ops (registered in registry.c): no list to keep here
OPS_SRC  = $(sort $(wildcard src/ops/*.c))
BACKEND_SRC = src/backend/context.c src/backend/cpu.c
NN_SRC   = src/nn/layers.c src/nn/vit.c src/nn/config.c src/nn/attn_layer.c src/nn/blocks.c src/nn/set.c src/nn/encoder.c src/nn/seq2seq.c src/nn/classifier.c src/nn/model.c src/nn/optim.c src/nn/ckpt.c src/nn/seq2seq_step.c
DATA_SRC = src/data/data.c src/data/order.c src/data/batch.c src/data/gen.c src/data/parallel.c src/data/split.c src/data/arrays.c src/data/text.c
DATA_CXX = src/data/spm.cc
TRAIN_SRC = src/train/run.c src/train/eval.c src/train/train.c src/train/asap_compile.c src/train/swap.c src/train/bleu.c src/train/decode.c src/train/translate.c src/train/dp.c
LIB_OBJ  = $(patsubst %.c,$(BUILD)/obj/%.o,$(CORE_SRC) $(BACKEND_SRC) $(OPS_SRC) $(NN_SRC) $(DATA_SRC) $(TRAIN_SRC)) \
           $(BUILD)/obj/src/core/lse_engine_avx2.o $(BUILD)/obj/src/core/lse_engine_avx512.o \
           $(BUILD)/obj/src/core/gemm_kern_avx2.o $(BUILD)/obj/src/core/gemm_kern_avx512.o $(CUDA_OBJ) \
           $(patsubst %.cc,$(BUILD)/obj/%.o,$(DATA_CXX))
PUB_HDRS = include/birkhoff.h $(wildcard include/birkhoff/*.h)
HDRS     = $(PUB_HDRS) tests/backend/devbuf.h src/core/internal.h $(wildcard src/data/*.h) src/nn/nn.h src/nn/layers.h src/nn/model_impl.h src/train/decode.h src/train/dp.h src/core/vexp.h src/ops/ops.h src/ops/op.h src/backend/backend.h src/backend/call.h tests/harness.h tests/tutil.h $(wildcard tests/ops/*.h)

TOOL_SRC = tools/main.c tools/cli.c tools/attn/attn.c tools/otk/otk.c tools/asap/asap.c tools/asap/compile.c \
           tools/model/model.c tools/train/train.c tools/train/eval.c tools/train/data.c tools/train/mpi.c tools/bleu/bleu.c tools/translate/translate.c tools/plot/plot.c \
           tools/plot/chart.c tools/bench/bench.c tools/bench/bench_otk.c tools/bench/bench_asap.c \
           tools/bench/bench_train.c tools/bench/load.c tools/demo/demo.c
# tests/ mirrors src/: core, ops (each operator against its double reference), backend (the
# context and the cross-backend operator harness), nn; data and train are their own programs
# each operator's double reference (tests/ops/ref_NAME.c) and tests (tests/ops/test_NAME.c), found by name
REF_SRC  = $(filter-out %_selftest.c,$(sort $(wildcard tests/ops/ref_*.c)))
TEST_SRC = tests/test_main.c tests/harness.c tests/tutil.c tests/core/test_npy.c tests/core/test_outfile.c tests/core/test_text.c tests/core/test_escape.c tests/core/test_compat.c tests/core/test_gemm.c tests/core/test_vmath.c tests/core/test_engine.c tests/core/test_pool.c $(sort $(wildcard tests/ops/test_*.c)) \
           tests/nn/test_model.c \
           tests/backend/test_backend.c tests/backend/test_ops.c tests/backend/test_cuda.c tests/backend/devbuf.c $(REF_SRC)

LIB_A  = $(BUILD)/libbirkhoff.a
LIB_SO = $(BUILD)/libbirkhoff.so
# the one version (BK_VERSION_* in include/birkhoff/core.h): the shared library's file name and
# soname, birkhoff.pc, the CMake package's version file and the Python package (tools/pybuild)
bk_version_part = $(shell sed -n 's/^[[:space:]]*.[[:space:]]*define[[:space:]]*BK_VERSION_$(1)[[:space:]]*\([0-9]*\).*/\1/p' include/birkhoff/core.h)
VERSION_MAJOR := $(call bk_version_part,MAJOR)
VERSION_MINOR := $(call bk_version_part,MINOR)
VERSION_PATCH := $(call bk_version_part,PATCH)
VERSION := $(VERSION_MAJOR).$(VERSION_MINOR).$(VERSION_PATCH)
SOVERSION := $(VERSION_MAJOR)
CLI    = $(BUILD)/birkhoff
TESTS  = $(BUILD)/test_birkhoff
REFST  = $(BUILD)/ref_selftest
REFESP = $(BUILD)/ref_esp_selftest
REFLOT = $(BUILD)/ref_lot_selftest
REFOTK = $(BUILD)/ref_otk_selftest
REFASAP = $(BUILD)/ref_asap_selftest
REFUNB  = $(BUILD)/ref_unbalanced_selftest
REFDIFF = $(BUILD)/ref_diff_selftest
REFLIN  = $(BUILD)/ref_linear_selftest
EXAMPLE = $(BUILD)/quickstart
TGEN    = $(BUILD)/test_gen
TCHART  = $(BUILD)/test_chart
TDATA   = $(BUILD)/test_data
TARRAYS = $(BUILD)/test_arrays
TPARALLEL = $(BUILD)/test_parallel
TTEXT   = $(BUILD)/test_text
TBIBLE  = $(BUILD)/test_bible
TTRAIN  = $(BUILD)/test_train
TBLEU   = $(BUILD)/test_bleu
TDECODE = $(BUILD)/test_decode

PHONY_EXTRA = fuzz
PHONY_EXTRA += repro-quick
.PHONY: $(PHONY_EXTRA) all lib test test-python check check-asan check-valgrind check-install oracle run demo bench bench-gemm install uninstall clean deps

all: $(LIB_A) $(LIB_SO) $(CLI)
lib: $(LIB_A) $(LIB_SO)

$(BUILD)/obj/%.o: %.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -c $< -o $@

$(BUILD)/obj/%.o: %.cc $(PUB_HDRS)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS_ALL) -c $< -o $@

$(BUILD)/obj/tools/%.o: tools/%.c $(HDRS) $(TOOL_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(CAIRO_CFLAGS) -c $< -o $@

$(BUILD)/obj/src/backend/cuda/kernels.o: src/backend/cuda/kernels.cu src/backend/cuda/kernels.h
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

$(BUILD)/obj/src/backend/cuda/backend.o: src/backend/cuda/kernels.h

# the files compiled once per instruction set (lse_engine.c, gemm_kern.c): f_avx2.o, f_avx512.o
$(BUILD)/obj/src/core/%_avx2.o: src/core/%.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DBK_ISA=avx2 -c $< -o $@

$(BUILD)/obj/src/core/%_avx512.o: src/core/%.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(AVX512_FLAGS) -DBK_ISA=avx512 -c $< -o $@

$(LIB_A): $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(LIB_SO): $(LIB_OBJ)
	$(CC) -shared -Wl,-soname,libbirkhoff.so.$(SOVERSION) -o $@ $^ $(LDLIBS_ALL)

$(BUILD)/obj/tools/train/mpi.o: CFLAGS_ALL += $(MPI_CFLAGS)

$(CLI): $(patsubst %.c,$(BUILD)/obj/%.o,$(TOOL_SRC)) $(LIB_A)
	$(CC) -o $@ $^ $(CLI_LIBS) $(MPI_LIBS) $(LDLIBS_ALL)

$(TESTS): $(patsubst %.c,$(BUILD)/obj/%.o,$(TEST_SRC)) $(LIB_A)
	$(CC) -o $@ $^ $(LDLIBS_ALL)

$(REFST): $(BUILD)/obj/tests/ops/ref_attn.o $(BUILD)/obj/tests/ops/ref_attn_selftest.o $(BUILD)/obj/tests/harness.o $(LIB_A)
	$(CC) -o $@ $^ $(LDLIBS_ALL)

$(REFESP): $(BUILD)/obj/tests/ops/ref_esp.o $(BUILD)/obj/tests/ops/ref_esp_selftest.o $(BUILD)/obj/tests/harness.o $(LIB_A)
	$(CC) -o $@ $^ $(LDLIBS_ALL)

$(REFOTK): $(BUILD)/obj/tests/ops/ref_otk.o $(BUILD)/obj/tests/ops/ref_otk_selftest.o $(BUILD)/obj/tests/harness.o $(LIB_A)
	$(CC) -o $@ $^ $(LDLIBS_ALL)

$(REFLOT): $(BUILD)/obj/tests/ops/ref_lot.o $(BUILD)/obj/tests/ops/ref_lot_selftest.o $(BUILD)/obj/tests/harness.o $(LIB_A)
	$(CC) -o $@ $^ $(LDLIBS_ALL)

$(REFASAP): $(BUILD)/obj/tests/ops/ref_asap.o $(BUILD)/obj/tests/ops/ref_asap_selftest.o $(BUILD)/obj/tests/harness.o $(LIB_A)
	$(CC) -o $@ $^ $(LDLIBS_ALL)

$(REFUNB): $(BUILD)/obj/tests/ops/ref_unbalanced.o $(BUILD)/obj/tests/ops/ref_unbalanced_selftest.o $(BUILD)/obj/tests/ops/ref_attn.o $(BUILD)/obj/tests/harness.o $(LIB_A)
	$(CC) -o $@ $^ $(LDLIBS_ALL)

$(REFDIFF): $(BUILD)/obj/tests/ops/ref_diff.o $(BUILD)/obj/tests/ops/ref_diff_selftest.o $(BUILD)/obj/tests/ops/ref_attn.o $(BUILD)/obj/tests/harness.o $(LIB_A)
	$(CC) -o $@ $^ $(LDLIBS_ALL)

$(REFLIN): $(BUILD)/obj/tests/ops/ref_linear.o $(BUILD)/obj/tests/ops/ref_linear_selftest.o $(BUILD)/obj/tests/ops/ref_attn.o $(BUILD)/obj/tests/harness.o $(LIB_A)
	$(CC) -o $@ $^ $(LDLIBS_ALL)

# tests of the library's datasets and training runs (tests/data, tests/train),
# each on the one harness (tests/harness.c)

$(TGEN): $(BUILD)/obj/tests/data/test_gen.o $(BUILD)/obj/tests/harness.o $(LIB_A)
	$(CC) -o $@ $^ $(LDLIBS_ALL)

$(TDATA): $(BUILD)/obj/tests/data/test_data.o $(BUILD)/obj/tests/harness.o $(LIB_A)
	$(CC) -o $@ $^ $(LDLIBS_ALL)

$(TARRAYS): $(BUILD)/obj/tests/data/test_arrays.o $(BUILD)/obj/tests/harness.o $(LIB_A)
	$(CC) -o $@ $^ $(LDLIBS_ALL)

$(TPARALLEL): $(BUILD)/obj/tests/data/test_parallel.o $(BUILD)/obj/tests/harness.o $(LIB_A)
	$(CC) -o $@ $^ $(LDLIBS_ALL)

$(TTEXT): $(BUILD)/obj/tests/data/test_text.o $(BUILD)/obj/tests/harness.o $(LIB_A)
	$(CC) -o $@ $^ $(LDLIBS_ALL)

$(TBIBLE): $(BUILD)/obj/tests/data/test_bible.o $(BUILD)/obj/tests/harness.o $(LIB_A)
	$(CC) -o $@ $^ $(LDLIBS_ALL)

$(TTRAIN): $(BUILD)/obj/tests/train/test_train.o $(BUILD)/obj/tests/harness.o $(LIB_A)
	$(CC) -o $@ $^ $(LDLIBS_ALL)

$(TBLEU): $(BUILD)/obj/tests/train/test_bleu.o $(BUILD)/obj/tests/harness.o $(LIB_A)
	$(CC) -o $@ $^ $(LDLIBS_ALL)

# the beam search (src/train/decode.c, an internal module: the test includes its header)
$(BUILD)/obj/tests/train/test_decode.o: src/train/decode.h
$(BUILD)/obj/src/train/decode.o: src/train/decode.h

$(TDECODE): $(BUILD)/obj/tests/train/test_decode.o $(BUILD)/obj/tests/harness.o $(LIB_A)
	$(CC) -o $@ $^ $(LDLIBS_ALL)

# the CLI's charts (tools/plot/chart.c)
$(BUILD)/obj/tests/tools/test_chart.o: tests/tools/test_chart.c tools/plot/chart.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(CAIRO_CFLAGS) -Itools/plot -c $< -o $@

$(TCHART): $(BUILD)/obj/tests/tools/test_chart.o $(BUILD)/obj/tools/plot/chart.o $(BUILD)/obj/tests/harness.o $(LIB_A)
	$(CC) -o $@ $^ $(CLI_LIBS) $(LDLIBS_ALL)

$(EXAMPLE): examples/quickstart.c $(LIB_A) $(PUB_HDRS)
	$(CC) $(CFLAGS_ALL) -Iinclude examples/quickstart.c -o $@ $(LIB_A) $(LDLIBS_ALL)

deps:
	./scripts/deps.sh

# What an AVX2-only machine runs (Intel or AMD without AVX-512): the AVX2
# kernels and OpenBLAS's Haswell kernels. `make test` runs the whole suite on
# the native path and again on this one (docs/ARCHITECTURE.md, "Determinism").
PORTABLE = BK_ISA=avx2 OPENBLAS_CORETYPE=Haswell

# unit, property, gradient and determinism tests (and the reference's self-test)
test: $(TESTS) $(REFST) $(REFESP) $(REFLOT) $(REFOTK) $(REFASAP) $(REFUNB) $(REFDIFF) $(REFLIN) $(CLI) $(EXAMPLE) $(TGEN) $(TCHART) $(TDATA) $(TARRAYS) $(TPARALLEL) $(TTEXT) $(TBIBLE) $(TTRAIN) $(TBLEU) $(TDECODE)
	$(EXAMPLE)
	$(TGEN)
	$(TCHART)
	$(TDATA)
	$(TARRAYS)
	$(TPARALLEL)
	$(TTEXT)
	$(TBIBLE)
	$(TTRAIN)
	$(TBLEU)
	$(TDECODE)
	$(REFST)
	$(REFESP)
	$(REFLOT)
	$(REFOTK)
	$(REFASAP)
	$(REFUNB)
	$(REFDIFF)
	$(REFLIN)
	$(TESTS)
	$(PORTABLE) $(TESTS)

# ASan + UBSan build of the whole test suite, in its own build directory
check-asan:
	$(MAKE) BUILD=build-asan SAN=1 OPT=-O1 WERROR=1 test

# memcheck of the quick suite (not part of `check`: ~5 min; LeakSanitizer in
# check-asan covers leaks there). Valgrind hides AVX-512, so the AVX2 kernels run.
check-valgrind: $(TESTS)
	valgrind --leak-check=full --errors-for-leak-kinds=definite,possible --error-exitcode=9 \
	  --suppressions=tests/valgrind.supp $(TESTS) --quick

# the PyTorch oracle (Debian python3-torch); BK_REQUIRE_ORACLE=1 makes a
# missing torch a failure instead of a loud skip
oracle: $(CLI) $(LIB_SO) venv-torch2
	$(PY) tests/oracle/test_oracle.py --birkhoff $(CLI)
	$(PY) tests/oracle/test_nystrom.py --lib $(LIB_SO)
	$(PY) tests/oracle/test_model.py --birkhoff $(CLI)
	$(PY) tests/oracle/test_bleu.py --birkhoff $(CLI)
	$(PY) tests/oracle/test_linear.py --lib $(LIB_SO)
	$(PY) tests/oracle/test_arrays.py --lib $(LIB_SO)
	$(PY) tests/oracle/test_spm.py --lib $(LIB_SO)
	$(TORCH2_PY) tests/oracle/test_sacrebleu.py --birkhoff $(CLI)

# the Python package (python/birkhoff) is installed next to the library, into
# the site directory Debian's python3 searches for this prefix
PY_PKG = $(wildcard python/birkhoff/*.py)
PY_VER := $(shell $(PY) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || echo 3)
PYTHON_SITE ?= $(PREFIX)/lib/python$(PY_VER)/dist-packages

# install into a staging directory and build the example against the
# installed shared library through pkg-config; import the installed Python
# package from outside the source tree; build the example through the CMake
# package (shared and static) and check the library's symlink chain, the
# versions and the CMake version file (tests/packaging/test_install.sh); then
# `make uninstall` must leave no file behind
STAGE = $(abspath $(BUILD))/stage
check-install: all
	rm -rf $(STAGE)
	$(MAKE) install DESTDIR=$(STAGE) PREFIX=/usr/local
	PKG_CONFIG_PATH=$(STAGE)/usr/local/lib/pkgconfig PKG_CONFIG_SYSROOT_DIR=$(STAGE) \
	  sh -c '$(CC) -std=c11 -Wall -Werror examples/quickstart.c $$(pkg-config --cflags --libs birkhoff) -o $(BUILD)/quickstart-installed'
	LD_LIBRARY_PATH=$(STAGE)/usr/local/lib $(BUILD)/quickstart-installed
	cd / && PYTHONPATH=$(STAGE)$(PYTHON_SITE) BIRKHOFF_LIB=$(STAGE)/usr/local/lib/libbirkhoff.so.0 \
	  $(PY) -c 'import birkhoff, numpy as np; x = np.ones((1, 1, 2, 2), np.float32); \
	  assert birkhoff.LIBRARY_PATH.startswith("$(STAGE)") and birkhoff.__file__.startswith("$(STAGE)"); \
	  assert np.allclose(birkhoff.sinkhorn(x, x, x).out, 1); print("python package: installed copy imports and runs")'
	tests/packaging/test_install.sh $(STAGE)/usr/local $(abspath $(BUILD))/cmake-example $(VERSION)
	$(MAKE) uninstall DESTDIR=$(STAGE) PREFIX=/usr/local
	@left=$$(find $(STAGE) ! -type d); if [ -n "$$left" ]; then \
	  echo "FAIL make uninstall left files behind:"; echo "$$left"; exit 1; fi; \
	  echo "make uninstall: no file of the installation is left in $(STAGE)"

check: deps
	$(MAKE) WERROR=1 all test check-install
	$(MAKE) check-pip
	$(MAKE) check-asan
	$(MAKE) WERROR=1 oracle
	$(PY) tests/tools/test_cli.py $(CLI)
	$(PY) tests/tools/test_train_cli.py $(CLI)
	$(PY) tests/tools/test_translate_cli.py $(CLI)
	$(PY) tests/tools/test_data_cli.py $(CLI)
	$(PY) tests/tools/test_hostile.py $(CLI)
	$(PY) tests/test_determinism.py $(CLI)
	BK_REQUIRE_MPI=$(MPI) $(PY) tests/tools/test_mpi.py $(CLI)
	$(MAKE) test-python
	FUZZ_MODE=replay FUZZ_REQUIRED=1 FUZZ_INSTALL=1 ./scripts/fuzz.sh

# PyTorch from pip beside Debian's: a virtual environment of $(PY) with torch==$(TORCH2_VERSION)
# (the CPU wheel the machines keep on disk; pip's own configuration says where) and numpy from
# the registry (and sacreBLEU, the oracle of birkhoff bleu), made once and reused while its recorded
# torch version and packages ($(TORCH2_VENV)/torch-version)
# is TORCH2_VERSION; `make venv-torch2` (re)makes it, TORCH2_PY is its interpreter
TORCH2_VERSION ?= 2.13.0
TORCH2_PKGS = numpy sacrebleu
TORCH2_VENV = $(BUILD)/venv-torch2
TORCH2_PY = $(TORCH2_VENV)/bin/python
.PHONY: venv-torch2
venv-torch2:
	@if [ "$$(cat $(TORCH2_VENV)/torch-version 2>/dev/null)" = "$(TORCH2_VERSION) $(TORCH2_PKGS)" ] && $(TORCH2_PY) -c '' 2>/dev/null; then \
	  echo "venv-torch2: $(TORCH2_VENV) has torch $(TORCH2_VERSION) (reused)"; \
	else \
	  echo "venv-torch2: making $(TORCH2_VENV) (pip install torch==$(TORCH2_VERSION) $(TORCH2_PKGS))"; \
	  rm -rf $(TORCH2_VENV) && $(PY) -m venv $(TORCH2_VENV) && \
	  $(TORCH2_PY) -m pip install --quiet --disable-pip-version-check torch==$(TORCH2_VERSION) $(TORCH2_PKGS) && \
	  $(TORCH2_PY) -c 'import sys, numpy, torch; v = torch.__version__.split("+")[0]; \
	    print("venv-torch2: torch %s, numpy %s, Python %s" % (torch.__version__, numpy.__version__, sys.version.split()[0])); \
	    sys.exit(0 if v == "$(TORCH2_VERSION)" else "venv-torch2: pip gave torch " + torch.__version__)' && \
	  echo "$(TORCH2_VERSION) $(TORCH2_PKGS)" > $(TORCH2_VENV)/torch-version; \
	fi

# the Python package by the standard route (pyproject.toml, tools/pybuild): pip install,
# pip wheel, the sdist, python -m birkhoff, an unprivileged user and pip uninstall, in a
# fresh virtual environment of $(PY) that sees Debian's numpy and torch 1.13
# (tests/packaging/test_pip.py); then as a PyTorch user installs it: `pip install .` into the
# torch $(TORCH2_VERSION) venv, the README's PyTorch section run as written there, and
# uninstalled again (tests/packaging/test_pip_torch2.py); the wheels reuse this build's
# objects (BIRKHOFF_BUILD_DIR)
.PHONY: check-pip
check-pip: all venv-torch2
	BIRKHOFF_BUILD_DIR=$(abspath $(BUILD)) $(PY) tests/packaging/test_pip.py
	BIRKHOFF_BUILD_DIR=$(abspath $(BUILD)) $(PY) tests/packaging/test_pip_torch2.py --python $(TORCH2_PY)

# the Python tests that use PyTorch, run under an interpreter: $(call torch_tests,PYTHON)
define torch_tests
	$(1) tests/python/test_bindings.py
	$(1) tests/python/test_data.py
	$(1) tests/python/test_vit_mnist.py
	$(1) tests/python/test_models.py --birkhoff $(CLI)
	$(1) tests/python/test_compile.py
	$(1) tests/python/test_ddp.py --birkhoff $(CLI)
endef

# the Python package over the shared library (numpy and PyTorch APIs), under Debian's
# python3-torch 1.13 ($(PY)) and again under torch $(TORCH2_VERSION) from pip ($(TORCH2_PY)):
# bindings against the references, gradcheck, leaks, and a ViT on MNIST with birkhoff's
# Sinkhorn attention; birkhoff.models (C checkpoints <-> torch modules, against this build's
# CLI) and DistributedDataParallel (gloo, 2 processes). test_parallel (no torch) and test_cuda
# (skips without a GPU) run under $(PY) only.
test-python: all venv-torch2
	$(PY) tests/python/test_parallel.py
	$(PY) tests/python/test_cuda.py
	$(call torch_tests,$(PY))
	$(call torch_tests,$(TORCH2_PY))

# the parsers' libFuzzer targets (tests/fuzz/), FUZZ_SECONDS each
FUZZ_SECONDS ?= 10
fuzz:
	FUZZ_SECONDS=$(FUZZ_SECONDS) ./scripts/fuzz.sh

# the main job (scripts/main.sh): MNIST, Transformer vs Sinkformer, ASAP,
# evaluation and figures; the PyTorch oracle packages are not needed for it
run:
	BK_NO_ORACLE=1 ./scripts/deps.sh
	$(MAKE) all
	./scripts/main.sh

# a reduced run of every reproduction experiment (docs/REPRODUCTION.md; minutes, so the scripts
# cannot rot; the full runs are the scripts without QUICK, outside CI)
repro-quick: all
	./scripts/data.sh mnist spam
	rm -rf runs/repro-quick
	QUICK=1 OUT=runs/repro-quick/colsums ./scripts/repro/colsums.sh
	QUICK=1 OUT=runs/repro-quick/iters ./scripts/repro/iters.sh
	QUICK=1 OUT=runs/repro-quick/sets ./scripts/repro/sets.sh
	QUICK=1 OUT=runs/repro-quick/asap ./scripts/repro/asap.sh
	QUICK=1 OUT=runs/repro-quick/patches ./scripts/repro/patches.sh
	QUICK=1 OUT=runs/repro-quick/otk ./scripts/repro/otk.sh
	QUICK=1 OUT=runs/repro-quick/otk_sup ./scripts/repro/otk_sup.sh
	./scripts/data.sh fashion-mnist
	QUICK=1 OUT=runs/repro-quick/lowdata ./scripts/repro/lowdata.sh
	QUICK=1 OUT=runs/repro-quick/lot_vit ./scripts/repro/lot_vit.sh
	QUICK=1 OUT=runs/repro-quick/text ./scripts/repro/text.sh
	QUICK=1 OUT=runs/repro-quick/listops ./scripts/repro/listops.sh

demo: deps
	$(MAKE) all
	$(CLI) demo

bench: all
	$(CLI) bench

# the training step's Linear products and LayerNorm backward alone (a development benchmark on
# the library's internal entry points; docs/PERFORMANCE.md)
GEMMB = $(BUILD)/gemm_products
$(GEMMB): $(BUILD)/obj/bench/gemm_products.o $(LIB_A)
	$(CC) -o $@ $^ $(LDLIBS_ALL)
bench-gemm: $(GEMMB)

# what `make install` writes from templates: birkhoff.pc (pkg-config) and the CMake package
# (cmake/*.cmake.in -> $(PREFIX)/lib/cmake/birkhoff: targets birkhoff::birkhoff and
# birkhoff::birkhoff_static). The static library's link dependencies are LDLIBS_ALL without
# the sanitizers and the caller's LDLIBS; for CMake, -L gives link directories and -fopenmp
# the OpenMP runtime the objects were compiled for (GCC: libgomp)
empty :=
space := $(empty) $(empty)
DEP_LIBS = $(strip $(filter-out $(LDSAN) $(LDLIBS),$(LDLIBS_ALL)))
OPENMP_LIB ?= $(if $(findstring clang,$(CC)),omp,gomp)
CMAKE_DEP_DIRS = $(subst $(space),;,$(strip $(patsubst -L%,%,$(filter -L%,$(DEP_LIBS)))))
CMAKE_DEP_LIBS = $(subst $(space),;,$(strip $(patsubst -l%,%,$(patsubst -fopenmp,$(OPENMP_LIB),$(filter-out -L%,$(DEP_LIBS))))))
CMAKE_DIR = $(PREFIX)/lib/cmake/birkhoff
SUBST = sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(VERSION)|g' -e 's|@SOVERSION@|$(SOVERSION)|g' \
            -e 's|@VERSION_MAJOR@|$(VERSION_MAJOR)|g' -e 's|@VERSION_MINOR@|$(VERSION_MINOR)|g' \
            -e 's|@LIBS_PRIVATE@|$(DEP_LIBS)|g' -e 's|@CMAKE_DEP_DIRS@|$(CMAKE_DEP_DIRS)|g' \
            -e 's|@CMAKE_DEP_LIBS@|$(CMAKE_DEP_LIBS)|g'

# the shared library as libbirkhoff.so -> libbirkhoff.so.MAJOR (its soname) -> libbirkhoff.so.VERSION
install: $(LIB_A) $(LIB_SO) $(CLI)
	install -d $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include/birkhoff $(DESTDIR)$(PREFIX)/bin \
	           $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(CMAKE_DIR)
	install -m 644 include/birkhoff.h $(DESTDIR)$(PREFIX)/include/
	install -m 644 include/birkhoff/*.h $(DESTDIR)$(PREFIX)/include/birkhoff/
	install -m 644 $(LIB_A) $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(LIB_SO) $(DESTDIR)$(PREFIX)/lib/libbirkhoff.so.$(VERSION)
	ln -sf libbirkhoff.so.$(VERSION) $(DESTDIR)$(PREFIX)/lib/libbirkhoff.so.$(SOVERSION)
	ln -sf libbirkhoff.so.$(SOVERSION) $(DESTDIR)$(PREFIX)/lib/libbirkhoff.so
	install -m 755 $(CLI) $(DESTDIR)$(PREFIX)/bin/
	$(SUBST) birkhoff.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/birkhoff.pc
	$(SUBST) cmake/birkhoffConfig.cmake.in > $(DESTDIR)$(CMAKE_DIR)/birkhoffConfig.cmake
	$(SUBST) cmake/birkhoffConfigVersion.cmake.in > $(DESTDIR)$(CMAKE_DIR)/birkhoffConfigVersion.cmake
	install -d $(DESTDIR)$(PYTHON_SITE)/birkhoff
	install -m 644 $(PY_PKG) $(DESTDIR)$(PYTHON_SITE)/birkhoff/
	printf '"""written by make install"""\nLIBDIR = "%s"\n' '$(PREFIX)/lib' > $(DESTDIR)$(PYTHON_SITE)/birkhoff/_install.py

uninstall:
	rm -rf $(DESTDIR)$(PYTHON_SITE)/birkhoff
	rm -rf $(DESTDIR)$(PREFIX)/include/birkhoff $(DESTDIR)$(CMAKE_DIR)
	rm -f $(DESTDIR)$(PREFIX)/include/birkhoff.h $(DESTDIR)$(PREFIX)/lib/libbirkhoff.a \
	      $(DESTDIR)$(PREFIX)/lib/libbirkhoff.so $(DESTDIR)$(PREFIX)/lib/libbirkhoff.so.$(SOVERSION) \
	      $(DESTDIR)$(PREFIX)/lib/libbirkhoff.so.$(VERSION) \
	      $(DESTDIR)$(PREFIX)/bin/birkhoff $(DESTDIR)$(PREFIX)/lib/pkgconfig/birkhoff.pc

clean:
	rm -rf build build-asan
