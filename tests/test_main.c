/* test_main.c -- runs every test group; exits 1 if any check failed. */
#include "harness.h"

#include <math.h>
#include <stdarg.h>
#include <string.h>

th_state TH;

int th_check(int ok, const char *name, const char *fmt, ...)
{
    if (ok) TH.passed++;
    else TH.failed++;
    if (!ok || TH.verbose) {
        printf("%s %s: ", ok ? "ok  " : "FAIL", name);
        va_list ap;
        va_start(ap, fmt);
        vprintf(fmt, ap);
        va_end(ap);
        printf("\n");
        fflush(stdout);
    }
    return ok;
}

uint64_t th_next(th_rng *r)
{
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
double th_unif(th_rng *r) { return (double)(th_next(r) >> 11) * (1.0 / 9007199254740992.0); }
double th_normal(th_rng *r)
{
    double u = th_unif(r), v = th_unif(r);
    if (u < 1e-300) u = 1e-300;
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) TH.quick = 1;
        else if (!strcmp(argv[i], "-v")) TH.verbose = 1;
        else TH.filter = argv[i];
    }
    test_npy();
    test_outfile();
    test_text();
    test_escape();
    test_compat();
    test_gemm();
    test_vmath();
    test_engine();
    test_pool();
    test_attn();
    test_esp();
    test_lot();
    test_diff();
    test_schema();
    test_otk();
    test_asap();
    test_model();
    test_seq2seq();
    test_vit();
    test_set();
    test_otk_pool();
    test_backend();
    test_ops_harness();
    test_cuda();
    printf("%d passed, %d failed\n", TH.passed, TH.failed);
    return TH.failed ? 1 : 0;
}
