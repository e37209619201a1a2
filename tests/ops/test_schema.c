/* test_schema.c -- every registered operator's description (its bki_op
 * schema, read through birkhoff/ops.h): docs present, defaults that pass the
 * operator's own checks, ranges never stricter than the operator's check()
 * (a value just outside a range is refused by check() itself, written past
 * the setter), ranges enforced by the setter, bench cases and presets that
 * parse and pass the checks, arrays with shapes; and the generic entry
 * points with arrays == the typed ones with extras, bitwise. An operator
 * registered later is checked with no edit here. */
#include "birkhoff.h"
#include "../../src/ops/op.h"
#include "../harness.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const bki_op *in_of(const bk_op *op) { return (const bki_op *)(const void *)op; }

/* the checks of a call of op on a small problem (B = 2, H = 2, N = 6, d = 4)
 * with its required input arrays zero (the optional ones absent); ws_mode 0
 * (everything checked) */
static bk_status full_check(const bki_op *op, void *par, float *zeros)
{
    static const bk_attn_desc d = {2, 2, 6, 6, 4, 4, NULL, NULL};
    for (int i = 0; i < op->narrays; i++)
        if ((op->arrays[i].kind & (BKI_ARR_IN | BKI_ARR_FILE | BKI_ARR_REQUIRED)) == (BKI_ARR_IN | BKI_ARR_REQUIRED))
            memcpy((char *)par + op->arrays[i].offset, &zeros, sizeof zeros);
    bki_call c = bki_call_of(op, &d, par);
    return op->check(&c);
}

static int has_file_input(const bki_op *op)
{
    for (int i = 0; i < op->narrays; i++)
        if (op->arrays[i].kind & BKI_ARR_FILE) return 1;
    return 0;
}

/* writes x into a scalar field past the setter */
static void poke(void *par, const bki_field *f, double x)
{
    char *p = (char *)par + f->offset;
    if (f->type == BKI_F_INT) *(int *)p = (int)x;
    else if (f->type == BKI_F_I64) *(int64_t *)p = (int64_t)x;
    else if (f->type == BKI_F_U64) *(uint64_t *)p = (uint64_t)x;
    else *(float *)p = (float)x;
}

/* values just outside f's range (up to 2) */
static int outside(const bki_field *f, double out[2])
{
    int n = 0;
    const int integral = f->type != BKI_F_FLOAT;
    if (f->rflags & BKI_FR_OPEN_LO) out[n++] = f->lo;
    else if (isfinite(f->lo)) out[n++] = integral ? f->lo - 1 : nextafterf((float)f->lo, -INFINITY);
    if (isfinite(f->hi) && f->hi < 2e9) out[n++] = integral ? f->hi + 1 : nextafterf((float)f->hi, INFINITY);
    return n;
}

static void check_fields(const bk_op *op, void *par, float *zeros)
{
    const bki_op *o = in_of(op);
    const int files = has_file_input(o);
    for (int i = 0; i < o->nfields; i++) {
        const bki_field *f = &o->fields[i];
        bk_op_param p;
        memset(&p, 0, sizeof p);
        const int got = bk_op_param_info(op, i, &p) == BK_OK && p.doc && p.type;
        th_check(got && p.doc[0] && p.def[0], "schema: every parameter documented, its default readable",
                 "%s.%s: doc '%s' default '%s'", o->name, f->name, got ? p.doc : "", p.def);
        th_check(bk_op_param_find(op, f->name) == i && (!f->alias || bk_op_param_find(op, f->alias) == i),
                 "schema: a key and its alias find the parameter", "%s.%s", o->name, f->name);
        if (!(f->lo < f->hi) || files) continue;
        double out[2];
        const int n = outside(f, out);
        for (int k = 0; k < n; k++) {
            bk_op_config_default(op, par);
            poke(par, f, out[k]);
            const bk_status s = full_check(o, par, zeros);
            th_check(s != BK_OK, "schema: a range is never stricter than the operator's check()",
                     "%s.%s = %.9g (outside %s) passes check()", o->name, f->name, out[k], p.range);
            /* the setter: a value clearly outside (a float denormal would be refused as not finite) */
            const double step = (out[k] < f->hi ? -1e-3 : 1e-3) * fmax(1.0, fabs(out[k]));
            const double far = f->type == BKI_F_FLOAT ? out[k] + step : out[k];
            char text[64];
            snprintf(text, sizeof text, f->type == BKI_F_FLOAT ? "%.9g" : "%.0f", far);
            bk_op_config_default(op, par);
            th_check(bk_op_config_set(op, par, f->name, text) == BK_ERR_PARAM && strstr(bk_last_error(), "outside"),
                     "schema: the setter enforces the range", "%s.%s=%s: %s", o->name, f->name, text, bk_last_error());
        }
    }
}

static void check_cases(const bk_op *op, void *par, float *zeros)
{
    const bki_op *o = in_of(op);
    for (int j = 0; j < bk_op_bench_count(op); j++) {
        bk_op_bench_case bc;
        memset(&bc, 0, sizeof bc);
        bk_op_config_default(op, par);
        th_check(bk_op_bench_info(op, j, &bc) == BK_OK && bc.B >= 1 && bc.H >= 1 && bc.Nq >= 1 && bc.d >= 1 &&
                     bk_op_config_parse(op, par, bc.params) == BK_OK && full_check(o, par, zeros) == BK_OK,
                 "schema: every bench case parses and passes the checks", "%s case %d '%s': %s", o->name, j,
                 bc.params, bk_last_error());
    }
    for (int j = 0; j < bk_op_preset_count(op); j++) {
        bk_op_preset pr;
        memset(&pr, 0, sizeof pr);
        const char *txt = NULL;
        bk_op_config_default(op, par);
        th_check(bk_op_preset_info(op, j, &pr) == BK_OK && bk_op_find_preset(pr.name, &txt) == op &&
                     bk_op_config_parse(op, par, txt) == BK_OK && bk_op_config_check(op, par) == BK_OK,
                 "schema: every preset names its operator and parses", "%s preset %d: %s", o->name, j,
                 bk_last_error());
    }
    const bk_attn_desc d = {2, 3, 5, 7, 4, 6, NULL, NULL};
    bk_op_config_default(op, par);
    for (int j = 0; j < bk_op_array_count(op); j++) {
        bk_op_array a;
        int64_t dims[4];
        memset(&a, 0, sizeof a);
        const int r = bk_op_array_info(op, j, &a) == BK_OK ? bk_op_array_shape(op, j, &d, par, dims) : -1;
        th_check(a.doc[0] && a.shape[0] && bk_op_param_find(op, a.name) < 0 && bk_op_array_find(op, a.name) == j &&
                     ((a.kind & BK_OP_ARRAY_FILE) ? r == 0 : r >= 1 && r <= 4),
                 "schema: every array documented, with a shape, its name no key's", "%s.%s rank %d", o->name, a.name,
                 r);
    }
}

static void test_operators(void)
{
    float *zeros = calloc(1 << 16, sizeof(float));
    for (int i = 0; i < bk_op_count(); i++) {
        const bk_op *op = bk_op_at(i);
        const bki_op *o = in_of(op);
        void *par = calloc(1, bk_op_config_size(op) + 16);
        bk_op_config_default(op, par);
        th_check(bk_op_doc(op)[0] && bk_op_config_check(op, par) == BK_OK &&
                     (o->caps & BKI_CAP_CAUSAL) == (bk_op_param_find(op, "causal") >= 0 ? BKI_CAP_CAUSAL : 0u),
                 "schema: every operator documented; its defaults pass its checks; causal iff a causal key",
                 "%s: %s", o->name, bk_last_error());
        th_check(has_file_input(o) || full_check(o, par, zeros) == BK_OK,
                 "schema: the defaults with zero input arrays pass the operator's full check", "%s: %s", o->name,
                 bk_last_error());
        check_fields(op, par, zeros);
        check_cases(op, par, zeros);
        free(par);
    }
    free(zeros);
}

static int same(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof(float)) == 0; }

/* the generic entry points with arrays == the typed ones with extras */
static void test_arrays_bitwise(void)
{
    enum { B = 2, H = 2, N = 7, M = 5, D = 4, R = 3 };
    static float q[B * H * N * D], k[B * H * M * D], v[B * H * M * D], dout[B * H * N * D];
    static float o1[B * H * N * D], o2[B * H * N * D], g1[3][B * H * N * D], g2[3][B * H * N * D];
    float Z[H * R * D], th[H * R];
    th_rng rng = {42};
    for (size_t i = 0; i < sizeof q / sizeof q[0]; i++) q[i] = (float)th_normal(&rng), dout[i] = (float)th_normal(&rng);
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) k[i] = (float)th_normal(&rng), v[i] = (float)th_normal(&rng);
    for (int i = 0; i < H * R * D; i++) Z[i] = (float)th_normal(&rng);
    for (int i = 0; i < H * R; i++) th[i] = (float)th_normal(&rng);
    const int32_t ql[B] = {7, 4}, kl[B] = {5, 3};
    const bk_attn_desc d = {B, H, N, M, D, D, ql, kl};
    bk_tensor tq = bk_tensor_bhnd(q, H, N, D), tk = bk_tensor_bhnd(k, H, M, D), tv = bk_tensor_bhnd(v, H, M, D);
    bk_tensor t1 = bk_tensor_bhnd(o1, H, N, D), t2 = bk_tensor_bhnd(o2, H, N, D), tdo = bk_tensor_bhnd(dout, H, N, D);
    /* sinkhorn: diag, f, g */
    {
        const bk_op *op = bk_op_find("sinkhorn");
        bk_sinkhorn_config p = bk_sinkhorn_config_default();
        p.iters = 4;
        bk_sinkhorn_diag dg[B * H];
        float f1[B * H * N], gg1[B * H * M], f2[B * H * N], gg2[B * H * M], dg2[B * H * 3];
        bk_sinkhorn_extras ex = {{0}, f1, gg1, dg};
        float *arr[3] = {dg2, f2, gg2};
        bk_status s1 = bk_sinkhorn_forward(&d, &p, &tq, &tk, &tv, &t1, NULL, &ex, NULL, 0);
        bk_status s2 = bk_op_forward_arrays(op, &d, &p, &tq, &tk, &tv, &t2, NULL, NULL, arr, NULL, 0);
        int ok = !s1 && !s2 && same(o1, o2, sizeof o1 / 4) && same(f1, f2, B * H * N) && same(gg1, gg2, B * H * M);
        for (int i = 0; ok && i < B * H; i++)
            ok = dg2[3 * i] == (float)dg[i].iters && dg2[3 * i + 1] == dg[i].row_err && dg2[3 * i + 2] == dg[i].col_err;
        th_check(ok, "schema: bk_op_forward_arrays(sinkhorn: diag, f, g) == bk_sinkhorn_forward (bitwise)", "%d %d",
                 s1, s2);
    }
    /* lot: diag and the pivots' gradients */
    {
        const bk_op *op = bk_op_find("lot");
        bk_lot_config p = bk_lot_config_default();
        int64_t zd[3] = {H, R, D}, td[2] = {H, R};
        bk_lot_config p2;
        bk_op_config_default(op, &p2);
        int ok = bk_op_config_set_array(op, &p2, &d, bk_op_array_find(op, "pivots"), Z, 3, zd) == BK_OK &&
                 bk_op_config_set_array(op, &p2, &d, bk_op_array_find(op, "pivot_logits"), th, 2, td) == BK_OK &&
                 p2.r == R;
        p.r = R, p.Z = Z, p.theta = th;
        size_t tsz = bk_lot_tape_size(&d, &p);
        void *tp1 = malloc(tsz), *tp2 = malloc(tsz);
        bk_lot_diag dg[B * H];
        float dg2[B * H * 4], dZ1[H * R * D], dZ2[H * R * D], dt1[H * R], dt2[H * R];
        bk_lot_extras ex = {{0}, dg};
        float *fa[5] = {NULL, NULL, dg2, NULL, NULL}, *ba[5] = {NULL, NULL, NULL, dZ2, dt2};
        bk_tensor a1[3], a2[3];
        for (int j = 0; j < 3; j++) {
            a1[j] = bk_tensor_bhnd(g1[j], H, j ? M : N, D);
            a2[j] = bk_tensor_bhnd(g2[j], H, j ? M : N, D);
        }
        ok = ok && !bk_lot_forward(&d, &p, &tq, &tk, &tv, &t1, tp1, &ex, NULL, 0) &&
             !bk_op_forward_arrays(op, &d, &p2, &tq, &tk, &tv, &t2, tp2, NULL, fa, NULL, 0) &&
             !bk_lot_backward(&d, &p, &tq, &tk, &tv, &tdo, tp1, &a1[0], &a1[1], &a1[2], dZ1, dt1, NULL, 0) &&
             !bk_op_backward_arrays(op, &d, &p2, &tq, &tk, &tv, &tdo, tp2, &a2[0], &a2[1], &a2[2], ba, NULL, 0);
        ok = ok && same(o1, o2, sizeof o1 / 4) && same(dZ1, dZ2, H * R * D) && same(dt1, dt2, H * R) &&
             same(g1[0], g2[0], sizeof g1[0] / 4);
        for (int i = 0; ok && i < B * H; i++)
            ok = dg2[4 * i] == (float)dg[i].iters1 && dg2[4 * i + 3] == dg[i].col_err;
        th_check(ok, "schema: bk_op_*_arrays(lot: pivots in, diag, dpivots, dpivot_logits) == bk_lot_* (bitwise)",
                 "%s", bk_last_error());
        free(tp1);
        free(tp2);
    }
    /* a shape that is not the schema's is refused, naming the array; the key its
     * dimension set is put back */
    {
        const bk_op *op = bk_op_find("lot");
        bk_lot_config p;
        bk_op_config_default(op, &p);
        int64_t bad[3] = {H, 5, D + 1};
        th_check(bk_op_config_set_array(op, &p, &d, bk_op_array_find(op, "pivots"), Z, 3, bad) == BK_ERR_SHAPE &&
                     strstr(bk_last_error(), "[H, r, d]") && p.r == 1 && !p.Z,
                 "schema: a refused input leaves the parameters as they were", "%s; r = %d", bk_last_error(), p.r);
    }
    /* a shape that is not the schema's is refused, naming the array */
    {
        const bk_op *op = bk_op_find("diff");
        bk_diff_config p;
        bk_op_config_default(op, &p);
        float lam[3] = {0};
        int64_t bad[1] = {3};
        th_check(bk_op_config_set_array(op, &p, &d, bk_op_array_find(op, "lambda"), lam, 1, bad) == BK_ERR_SHAPE &&
                     strstr(bk_last_error(), "lambda") && strstr(bk_last_error(), "[H]") && !p.lambda,
                 "schema: an input array of the wrong shape refused, naming it", "%s", bk_last_error());
    }
}

void test_schema(void)
{
    test_operators();
    test_arrays_bitwise();
}
