/* test_main.c -- runs every test group of build/test_birkhoff (the harness:
 * harness.h, harness.c); exits 1 if any check failed. */
#include "harness.h"

#include <string.h>

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
    test_linear();
    test_nystrom();
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
    return th_summary();
}
