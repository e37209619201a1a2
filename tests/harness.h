/* harness.h -- THE test harness (tests/harness.c): named checks, a pass/fail
 * count, and the closing line "N passed, N failed" (th_summary). Used by
 * build/test_birkhoff (tests/test_main.c) and by every separate test program
 * (tests/data, tests/train, tests/tools/test_chart.c, the references'
 * self-tests tests/ops/ref_*_selftest.c), each linking tests/harness.c. */
#ifndef BK_HARNESS_H
#define BK_HARNESS_H
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct {
    int passed, failed;
    int quick;        /* --quick: smaller grids */
    int verbose;
    const char *filter;
} th_state;
extern th_state TH;

/* Records one check; prints failures always ("FAIL name: detail") and
 * passes when verbose ("ok   name: detail"; the separate programs set
 * TH.verbose: one line per check). fmt "" or NULL: no detail. Returns ok. */
int th_check(int ok, const char *name, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* prints "N passed, N failed"; the exit status: 1 if any check failed */
int th_summary(void);
/* a new directory $TMPDIR/bk-NAME-XXXXXX (else under /tmp) in buf; 1 on
 * success */
int th_tmpdir(char *buf, size_t cap, const char *name);

/* deterministic random numbers (the library's splitmix64, bk_splitmix64) */
typedef struct { uint64_t s; } th_rng;
uint64_t th_next(th_rng *r);
double th_unif(th_rng *r);   /* [0, 1) */
double th_normal(th_rng *r); /* N(0, 1) */

/* test groups (each file registers its own) */
void test_attn(void);
void test_npy(void);
void test_outfile(void); /* tests/core/test_outfile.c */
void test_text(void);    /* tests/core/test_text.c */
void test_escape(void);  /* tests/core/test_escape.c */
void test_compat(void); /* tests/core/test_compat.c */
void test_gemm(void);   /* tests/core/test_gemm.c */
void test_vmath(void);  /* tests/core/test_vmath.c */
void test_engine(void); /* tests/core/test_engine.c */
void test_pool(void);   /* tests/core/test_pool.c */
void test_esp(void);
void test_lot(void);
void test_diff(void); /* tests/ops/test_diff.c */
void test_linear(void); /* tests/ops/test_linear.c */
void test_nystrom(void); /* tests/ops/test_nystrom.c */
void test_schema(void); /* tests/ops/test_schema.c: every operator's description */
void test_otk(void);
void test_asap(void);
void test_model(void);
void test_seq2seq(void);
void test_vit(void); /* tests/nn/test_model.c: LOTFormer's ViT ingredients */
void test_set(void); /* tests/nn/test_model.c: Set Transformer blocks (ISAB, PMA) */
void test_otk_pool(void); /* tests/nn/test_model.c: the supervised OTK layer */
void test_backend(void);
void test_ops_harness(void); /* tests/backend/test_ops.c */
void test_cuda(void);        /* tests/backend/test_cuda.c */
#endif
