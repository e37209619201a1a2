/* attn.c -- `birkhoff attn`: run an attention operator on .npy files. */
#include "../cli.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void attn_usage(FILE *f)
{
    fprintf(f,
            "usage: birkhoff attn --op softmax|sinkhorn|unbalanced|esp|lot|diff|asap|asap0 --q Q.npy --k K.npy --v V.npy --out O.npy [options]\n"
            "\n"
            "Inputs are float32 .npy arrays: Q [B,H,Nq,d], K [B,H,Nk,d], V [B,H,Nk,dv].\n"
            "Writes O [B,H,Nq,dv]. Every output file is written atomically.\n"
            "\n"
            "options:\n"
            "  --iters S         Sinkhorn half-steps, row first (default 5; S=1 is softmax)\n"
            "  --eps E           temperature (default 1)\n"
            "  --scale s         score scale (default 1/sqrt(d))\n"
            "  --tol T           per-problem early stop on the column-marginal error (default off)\n"
            "  --grad MODE       unrolled (default, exact for the S steps run) | implicit (at convergence)\n"
            "  --q-len L.npy     int32 [B] valid query lengths (padding)\n"
            "  --k-len L.npy     int32 [B] valid key lengths\n"
            "  --attn A.npy      also write the attention matrix [B,H,Nq,Nk]\n"
            "  --diag D.npy      also write per-problem [iters, row_err, col_err] as float32 [B,H,3]\n"
            "  --dout dO.npy     upstream gradient [B,H,Nq,dv]: run the backward too, writing\n"
            "  --dq F --dk F --dv F   the gradients (any subset)\n"
            "  --threads N       threads (default: all cores); results do not depend on it\n"
            "unbalanced Sinkhorn (--op unbalanced; --iters/--eps/--scale/--tol/--diag as Sinkhorn):\n"
            "  --rho R           KL penalty on the column marginal, > 0 (default 10): column half-steps\n"
            "                    damped by R / (R + eps); no --grad (exact unrolled backward)\n"
            "ESP (--op esp):\n"
            "  --sort hard|soft  exact argsort (default; exactly doubly stochastic) or SoftSort\n"
            "  --softsort-t t    SoftSort temperature (default 1e-3)\n"
            "  --tau T           slice-mixing inverse temperature >= 0 (default 1)\n"
            "  --cost sq|euclid  squared (paper, default) or plain Euclidean (reference code)\n"
            "  --esp-scale rows|paper   A = n G (rows sum to 1, default) or the paper's G\n"
            "  --slices T.npy    float32 [L, d] slice matrix (default: axis-aligned, L = d)\n"
            "  --num-slices L --seed S  L random unit slices from a seed\n"
            "  --sigma S.npy     write the slice weights [B,H,L]\n"
            "  --dslices F.npy   write the gradient w.r.t. the slices [L, d] (zeros under hard sort)\n"
            "  --diag D.npy      (esp) per-problem [row_err, col_err] of the plan, [B,H,2]\n"
            "  --scale s         q, k scale (default 1/sqrt(d))\n"
            "LOT (--op lot):\n"
            "  --pivots Z.npy    float32 [H, r, d] pivot locations (required)\n"
            "  --pivot-logits T.npy  float32 [H, r] pivot-mass logits (required)\n"
            "  --pivot-temp t    p0 = softmax(theta / t) (default 1)\n"
            "  --iters T --eps E --tol t   half-steps of each inner Sinkhorn problem (default 5), eps (1)\n"
            "  --dpivots F.npy --dpivot-logits F.npy   gradients w.r.t. Z and theta (with --dout)\n"
            "  --diag D.npy      (lot) per-problem [iters1, iters2, row_err, col_err], [B,H,4]\n"
            "differential attention (--op diff; d even: q = [q1, q2], k = [k1, k2]):\n"
            "  --lambda L.npy    float32 [H] per-head lambda (required): O = (softmax(s Q1 K1^T)\n"
            "                    - lambda softmax(s Q2 K2^T)) V; --scale s (default 1/sqrt(d/2)), --attn\n"
            "                    writes the combined map\n"
            "  --dlambda F.npy   write dL/dlambda [H], summed over the batch (with --dout)\n"
            "ASAP (--op asap | asap0; inference only, no backward):\n"
            "  --layer F.asap    compiled layer from `birkhoff asap calibrate` (required; it fixes\n"
            "                    scale, eps and the slice bank)\n"
            "  --variant V       auto (asap: the teacher's ending) | zero (asap0) | column | row\n"
            "  --diag D.npy      (asap) per-problem [half-steps, row_err, col_err], [B,H,3]\n");
}

typedef struct {
    const char *op, *q, *k, *v, *out, *qlen, *klen, *attn, *diag, *dout, *dq, *dk, *dv;
    const char *iters, *eps, *scale, *tol, *grad, *threads;
    const char *sort, *tau, *sst, *cost, *escale, *slices, *nslices, *seed, *sigma, *dslices;
    const char *pivots, *plogits, *ptemp, *dpivots, *dplogits;
    const char *layer, *variant;
    const char *rho;
    const char *lambda, *dlambda;
} attn_args;

/* the larger of two errors, NaN when either is (a NaN error is never
 * printed as 0) */
static float max_err(float a, float b) { return isnan(a) || isnan(b) ? NAN : (a > b ? a : b); }

static int load4(const char *what, const char *path, bk_npy *a) { return cli_load_f32("attn", what, path, 4, a); }

static int load_len(const char *what, const char *path, int64_t B, bk_npy *a)
{
    return cli_load_len("attn", what, path, B, a);
}

static int shape_is(const bk_npy *a, int64_t s0, int64_t s1, int64_t s2, int64_t s3)
{
    return a->shape[0] == s0 && a->shape[1] == s1 && a->shape[2] == s2 && a->shape[3] == s3;
}

int cmd_attn(int argc, char **argv)
{
    attn_args a;
    memset(&a, 0, sizeof a);
    const cli_opt opts[] = {
        {"--op", &a.op, 0},       {"--q", &a.q, 0},         {"--k", &a.k, 0},         {"--v", &a.v, 0},
        {"--out", &a.out, 0},     {"--q-len", &a.qlen, 0},  {"--k-len", &a.klen, 0},  {"--attn", &a.attn, 0},
        {"--diag", &a.diag, 0},   {"--dout", &a.dout, 0},   {"--dq", &a.dq, 0},       {"--dk", &a.dk, 0},
        {"--dv", &a.dv, 0},       {"--iters", &a.iters, 0}, {"--eps", &a.eps, 0},     {"--scale", &a.scale, 0},
        {"--tol", &a.tol, 0},     {"--grad", &a.grad, 0},   {"--threads", &a.threads, 0},
        {"--sort", &a.sort, 0},   {"--tau", &a.tau, 0},     {"--softsort-t", &a.sst, 0}, {"--cost", &a.cost, 0},
        {"--esp-scale", &a.escale, 0}, {"--slices", &a.slices, 0}, {"--num-slices", &a.nslices, 0}, {"--seed", &a.seed, 0},
        {"--sigma", &a.sigma, 0}, {"--dslices", &a.dslices, 0},
        {"--pivots", &a.pivots, 0}, {"--pivot-logits", &a.plogits, 0}, {"--pivot-temp", &a.ptemp, 0},
        {"--dpivots", &a.dpivots, 0}, {"--dpivot-logits", &a.dplogits, 0},
        {"--layer", &a.layer, 0}, {"--variant", &a.variant, 0}, {"--rho", &a.rho, 0},
        {"--lambda", &a.lambda, 0}, {"--dlambda", &a.dlambda, 0},
    };
    int done = 0, rc0 = cli_parse_opts("attn", argc, argv, opts, (int)(sizeof opts / sizeof opts[0]), attn_usage, &done);
    if (rc0 != CLI_OK || done) return rc0;
    if (!a.op || !a.q || !a.k || !a.v || !a.out) {
        fprintf(stderr, "birkhoff attn: --op, --q, --k, --v and --out are required\n");
        attn_usage(stderr);
        return CLI_USAGE;
    }
    /* the operators are the registry's (asap0: asap with the zero variant) */
    if (!bk_op_find(a.op) && strcmp(a.op, "asap0")) {
        char names[256] = "";
        for (int i = 0; i < bk_op_count(); i++) {
            strncat(names, bk_op_name(bk_op_at(i)), sizeof names - strlen(names) - 1);
            strncat(names, ", ", sizeof names - strlen(names) - 1);
        }
        fprintf(stderr, "birkhoff attn: unknown --op '%s' (%sasap0)\n", a.op, names);
        return CLI_USAGE;
    }
    const int unb = !strcmp(a.op, "unbalanced");
    const int sink = !strcmp(a.op, "sinkhorn") || unb, esp = !strcmp(a.op, "esp"), lot = !strcmp(a.op, "lot");
    const int asap = !strcmp(a.op, "asap") || !strcmp(a.op, "asap0");
    const int dif = !strcmp(a.op, "diff");
    if (!sink && !esp && !lot && !asap && !dif && strcmp(a.op, "softmax")) { /* until the generic path lands */
        fprintf(stderr, "birkhoff attn: --op %s is registered but not wired into this command yet (use bk_op_forward or "
                        "Python's birkhoff.attention)\n", a.op);
        return CLI_USAGE;
    }
    if (!dif && (a.lambda || a.dlambda)) {
        fprintf(stderr, "birkhoff attn: --lambda/--dlambda apply to --op diff only\n");
        return CLI_USAGE;
    }
    if (dif && !a.lambda) {
        fprintf(stderr, "birkhoff attn: --op diff needs --lambda L.npy (float32 [H], one lambda per head)\n");
        return CLI_USAGE;
    }
    if (a.dlambda && !a.dout) {
        fprintf(stderr, "birkhoff attn: --dlambda needs --dout\n");
        return CLI_USAGE;
    }
    if (a.rho && !unb) {
        fprintf(stderr, "birkhoff attn: --rho applies to --op unbalanced only\n");
        return CLI_USAGE;
    }
    float rho = bk_unbalanced_config_default().rho;
    if (a.rho && (!cli_parse_float(a.rho, &rho) || !(rho > 0))) {
        fprintf(stderr, "birkhoff attn: --rho must be a number > 0, got '%s'\n", a.rho);
        return CLI_USAGE;
    }
    bk_asap_variant av = !strcmp(a.op, "asap0") ? BK_ASAP_ZERO : BK_ASAP_AUTO;
    if (!asap && (a.layer || a.variant)) {
        fprintf(stderr, "birkhoff attn: --layer/--variant apply to --op asap/asap0 only\n");
        return CLI_USAGE;
    }
    if (asap) {
        if (!a.layer) {
            fprintf(stderr, "birkhoff attn: --op %s needs --layer F.asap (from `birkhoff asap calibrate`)\n", a.op);
            return CLI_USAGE;
        }
        if (a.iters || a.eps || a.tol || a.grad || a.scale) {
            fprintf(stderr, "birkhoff attn: --iters/--eps/--tol/--grad/--scale do not apply to --op %s "
                            "(the compiled layer fixes them)\n", a.op);
            return CLI_USAGE;
        }
        if (a.dout || a.dq || a.dk || a.dv) {
            fprintf(stderr, "birkhoff attn: --op %s is inference only (no backward; --dout/--dq/--dk/--dv)\n", a.op);
            return CLI_USAGE;
        }
        if (a.variant) {
            if (!strcmp(a.variant, "auto")) av = BK_ASAP_AUTO;
            else if (!strcmp(a.variant, "zero")) av = BK_ASAP_ZERO;
            else if (!strcmp(a.variant, "column")) av = BK_ASAP_COLUMN;
            else if (!strcmp(a.variant, "row")) av = BK_ASAP_ROW;
            else {
                fprintf(stderr, "birkhoff attn: --variant must be auto, zero, column or row, got '%s'\n", a.variant);
                return CLI_USAGE;
            }
        }
    }
    if (!lot && (a.pivots || a.plogits || a.ptemp || a.dpivots || a.dplogits)) {
        fprintf(stderr, "birkhoff attn: --pivots/--pivot-logits/--pivot-temp/--dpivots/--dpivot-logits apply to --op lot only\n");
        return CLI_USAGE;
    }
    if (lot && (!a.pivots || !a.plogits)) {
        fprintf(stderr, "birkhoff attn: --op lot needs --pivots Z.npy and --pivot-logits theta.npy\n");
        return CLI_USAGE;
    }
    if ((a.dpivots || a.dplogits) && !a.dout) {
        fprintf(stderr, "birkhoff attn: --dpivots/--dpivot-logits need --dout\n");
        return CLI_USAGE;
    }
    bk_lot_config lp = bk_lot_config_default();
    if (lot && a.ptemp && (!cli_parse_float(a.ptemp, &lp.temp) || !(lp.temp > 0))) {
        fprintf(stderr, "birkhoff attn: --pivot-temp must be a number > 0, got '%s'\n", a.ptemp);
        return CLI_USAGE;
    }
    if (!esp && (a.sort || a.tau || a.sst || a.cost || a.escale || a.slices || a.nslices || a.seed || a.sigma ||
                 a.dslices)) {
        fprintf(stderr, "birkhoff attn: --sort/--tau/--softsort-t/--cost/--esp-scale/--slices/--num-slices/--seed/"
                        "--sigma/--dslices apply to --op esp only\n");
        return CLI_USAGE;
    }
    bk_esp_config ep = bk_esp_config_default();
    if (esp) {
        if (a.iters || a.eps || a.tol || a.grad) {
            fprintf(stderr, "birkhoff attn: --iters/--eps/--tol/--grad apply to --op sinkhorn only\n");
            return CLI_USAGE;
        }
        if (a.sort && !strcmp(a.sort, "soft")) ep.sort = BK_ESP_SOFT;
        else if (a.sort && strcmp(a.sort, "hard")) {
            fprintf(stderr, "birkhoff attn: --sort must be hard or soft, got '%s'\n", a.sort);
            return CLI_USAGE;
        }
        if (a.cost && !strcmp(a.cost, "euclid")) ep.cost = BK_ESP_COST_EUCLID;
        else if (a.cost && strcmp(a.cost, "sq")) {
            fprintf(stderr, "birkhoff attn: --cost must be sq or euclid, got '%s'\n", a.cost);
            return CLI_USAGE;
        }
        if (a.escale && !strcmp(a.escale, "paper")) ep.out_scale = BK_ESP_SCALE_PAPER;
        else if (a.escale && strcmp(a.escale, "rows")) {
            fprintf(stderr, "birkhoff attn: --esp-scale must be rows or paper, got '%s'\n", a.escale);
            return CLI_USAGE;
        }
        if (a.tau && (!cli_parse_float(a.tau, &ep.tau) || ep.tau < 0)) {
            fprintf(stderr, "birkhoff attn: --tau must be a finite number >= 0, got '%s'\n", a.tau);
            return CLI_USAGE;
        }
        if (a.sst && (!cli_parse_float(a.sst, &ep.t) || !(ep.t > 0))) {
            fprintf(stderr, "birkhoff attn: --softsort-t must be a number > 0, got '%s'\n", a.sst);
            return CLI_USAGE;
        }
        if (a.nslices && (!cli_parse_int(a.nslices, &ep.L) || ep.L < 1)) {
            fprintf(stderr, "birkhoff attn: --num-slices must be an integer >= 1, got '%s'\n", a.nslices);
            return CLI_USAGE;
        }
        if (a.seed) {
            int sd;
            if (!cli_parse_int(a.seed, &sd) || sd < 0) {
                fprintf(stderr, "birkhoff attn: --seed must be an integer >= 0, got '%s'\n", a.seed);
                return CLI_USAGE;
            }
            ep.seed = (uint64_t)sd;
        }
        if (a.slices && a.nslices) {
            fprintf(stderr, "birkhoff attn: give either --slices or --num-slices, not both\n");
            return CLI_USAGE;
        }
    }
    if (a.dslices && !a.dout) {
        fprintf(stderr, "birkhoff attn: --dslices needs --dout\n");
        return CLI_USAGE;
    }
    bk_sinkhorn_config p = bk_sinkhorn_config_default();
    if (a.iters && (!cli_parse_int(a.iters, &p.iters) || p.iters < 1)) {
        fprintf(stderr, "birkhoff attn: --iters must be an integer >= 1, got '%s'\n", a.iters);
        return CLI_USAGE;
    }
    if (a.eps && (!cli_parse_float(a.eps, &p.eps) || !(p.eps > 0))) {
        fprintf(stderr, "birkhoff attn: --eps must be a number > 0, got '%s'\n", a.eps);
        return CLI_USAGE;
    }
    if (a.scale && !cli_parse_float(a.scale, &p.scale)) {
        fprintf(stderr, "birkhoff attn: --scale must be a finite number, got '%s'\n", a.scale);
        return CLI_USAGE;
    }
    if (a.tol && (!cli_parse_float(a.tol, &p.tol) || p.tol < 0)) {
        fprintf(stderr, "birkhoff attn: --tol must be a number >= 0, got '%s'\n", a.tol);
        return CLI_USAGE;
    }
    if (a.grad) {
        if (!strcmp(a.grad, "unrolled")) p.grad = BK_GRAD_UNROLLED;
        else if (!strcmp(a.grad, "implicit")) p.grad = BK_GRAD_IMPLICIT;
        else {
            fprintf(stderr, "birkhoff attn: --grad must be unrolled or implicit, got '%s'\n", a.grad);
            return CLI_USAGE;
        }
    }
    if ((lot || unb) && a.grad) {
        fprintf(stderr, "birkhoff attn: --grad applies to --op sinkhorn only\n");
        return CLI_USAGE;
    }
    const bk_unbalanced_config up = {p.scale, p.eps, p.iters, p.tol, rho};
    if (!sink && !esp && !lot && !asap && (a.iters || a.eps || a.tol || a.grad || a.diag)) {
        fprintf(stderr, "birkhoff attn: --iters/--eps/--tol/--grad/--diag apply to --op sinkhorn only\n");
        return CLI_USAGE;
    }
    if (a.threads) {
        int nt;
        if (!cli_parse_int(a.threads, &nt) || nt < 1 || nt > 4096) {
            fprintf(stderr, "birkhoff attn: --threads must be an integer in [1, 4096]\n");
            return CLI_USAGE;
        }
        bk_set_num_threads(nt);
    }
    if ((a.dq || a.dk || a.dv) && !a.dout) {
        fprintf(stderr, "birkhoff attn: --dq/--dk/--dv need --dout\n");
        return CLI_USAGE;
    }

    int rc = CLI_FAIL;
    bk_npy Q = {0}, K = {0}, V = {0}, QL = {0}, KL = {0}, DO = {0}, TH = {0}, PZ = {0}, PT = {0}, LAM = {0};
    float *O = NULL, *A = NULL, *dQ = NULL, *dK = NULL, *dV = NULL, *D = NULL, *SG = NULL, *DTH = NULL;
    float *DPZ = NULL, *DPT = NULL, *DLAM = NULL;
    bk_diff_config dp = bk_diff_config_default();
    bk_sinkhorn_diag *diag = NULL;
    bk_esp_diag *ediag = NULL;
    bk_lot_diag *ldiag = NULL;
    bk_asap_layer layer;
    memset(&layer, 0, sizeof layer);
    int L = 0;
    void *tape = NULL;
    if (!load4("Q", a.q, &Q) || !load4("K", a.k, &K) || !load4("V", a.v, &V)) goto done;
    const int B = (int)Q.shape[0], H = (int)Q.shape[1], Nq = (int)Q.shape[2], d = (int)Q.shape[3];
    const int Nk = (int)K.shape[2], dv = (int)V.shape[3];
    if (!shape_is(&K, B, H, Nk, d)) {
        fprintf(stderr, "birkhoff attn: K has shape [%lld,%lld,%lld,%lld], expected [%d,%d,Nk,%d] to match Q\n",
                (long long)K.shape[0], (long long)K.shape[1], (long long)K.shape[2], (long long)K.shape[3], B, H, d);
        goto done;
    }
    if (!shape_is(&V, B, H, Nk, dv)) {
        fprintf(stderr, "birkhoff attn: V has shape [%lld,%lld,%lld,%lld], expected [%d,%d,%d,dv] to match K\n",
                (long long)V.shape[0], (long long)V.shape[1], (long long)V.shape[2], (long long)V.shape[3], B, H, Nk);
        goto done;
    }
    if (a.qlen && !load_len("--q-len", a.qlen, B, &QL)) goto done;
    if (a.klen && !load_len("--k-len", a.klen, B, &KL)) goto done;
    if (a.dout) {
        if (!load4("dO", a.dout, &DO)) goto done;
        if (!shape_is(&DO, B, H, Nq, dv)) {
            fprintf(stderr, "birkhoff attn: dO must have shape [%d,%d,%d,%d] like the output\n", B, H, Nq, dv);
            goto done;
        }
    }
    if (esp && a.slices) {
        if (bk_npy_read(a.slices, &TH) != BK_OK) {
            fprintf(stderr, "birkhoff attn: %s\n", bk_last_error());
            goto done;
        }
        if (TH.dtype != BK_F32 || TH.ndim != 2 || TH.shape[1] != d || TH.shape[0] < 1 || TH.shape[0] > 65536) {
            fprintf(stderr, "birkhoff attn: --slices (%s) must be a float32 array [L, d] with d = %d\n", a.slices, d);
            goto done;
        }
        ep.L = (int)TH.shape[0];
        ep.theta = TH.data;
    }
    if (esp) ep.scale = p.scale;
    if (lot) {
        if (bk_npy_read(a.pivots, &PZ) != BK_OK || bk_npy_read(a.plogits, &PT) != BK_OK) {
            fprintf(stderr, "birkhoff attn: %s\n", bk_last_error());
            goto done;
        }
        if (PZ.dtype != BK_F32 || PZ.ndim != 3 || PZ.shape[0] != H || PZ.shape[2] != d || PZ.shape[1] < 1 ||
            PZ.shape[1] > (1 << 20)) {
            fprintf(stderr, "birkhoff attn: --pivots (%s) must be a float32 array [H, r, d] with H = %d, d = %d\n",
                    a.pivots, H, d);
            goto done;
        }
        if (PT.dtype != BK_F32 || PT.ndim != 2 || PT.shape[0] != H || PT.shape[1] != PZ.shape[1]) {
            fprintf(stderr, "birkhoff attn: --pivot-logits (%s) must be a float32 array [H, r] = [%d, %lld]\n", a.plogits,
                    H, (long long)PZ.shape[1]);
            goto done;
        }
        lp.r = (int)PZ.shape[1];
        lp.Z = PZ.data;
        lp.theta = PT.data;
        lp.iters = p.iters;
        lp.eps = p.eps;
        lp.scale = p.scale;
        lp.tol = p.tol;
    }
    if (dif) {
        if (bk_npy_read(a.lambda, &LAM) != BK_OK) {
            fprintf(stderr, "birkhoff attn: %s\n", bk_last_error());
            goto done;
        }
        if (LAM.dtype != BK_F32 || LAM.ndim != 1 || LAM.shape[0] != H) {
            fprintf(stderr, "birkhoff attn: --lambda (%s) must be a float32 array [H] with H = %d\n", a.lambda, H);
            goto done;
        }
        dp.lambda = LAM.data;
        dp.scale = p.scale;
    }
    if (asap) {
        if (bk_asap_load(a.layer, &layer) != BK_OK) {
            fprintf(stderr, "birkhoff attn: %s\n", bk_last_error());
            goto done;
        }
        if (layer.d != d) {
            fprintf(stderr, "birkhoff attn: the layer %s was compiled for head dim %d, Q has d = %d\n", a.layer, layer.d, d);
            goto done;
        }
    }
    bk_attn_desc desc = {B, H, Nq, Nk, d, dv, QL.data, KL.data};
    if (esp) L = bk_esp_num_slices(&ep, d);
    if (!sink) p.iters = 1; /* softmax: the S = 1 case, through its own entry points below */
    size_t nq = (size_t)B * H * Nq, nk = (size_t)B * H * Nk;
    O = malloc(nq * dv * sizeof(float));
    if (a.attn) A = malloc(nq * Nk * sizeof(float));
    if (a.diag && (sink || asap)) diag = malloc(sizeof(*diag) * (size_t)B * H);
    if (a.diag && lot) ldiag = malloc(sizeof(*ldiag) * (size_t)B * H);
    if (a.diag && esp) ediag = malloc(sizeof(*ediag) * (size_t)B * H);
    if (a.sigma) SG = malloc(sizeof(float) * (size_t)B * H * (L > 0 ? L : 1));
    size_t tsz = esp ? bk_esp_tape_size(&desc, &ep)
                 : lot ? bk_lot_tape_size(&desc, &lp)
                 : dif ? bk_diff_tape_size(&desc, &dp)
                 : unb ? bk_unbalanced_tape_size(&desc, &up)
                 : sink ? bk_sinkhorn_tape_size(&desc, &p) : bk_softmax_tape_size(&desc);
    if (a.dout) tape = malloc(tsz ? tsz : 1);
    if (!O || (a.attn && !A) || (a.diag && !diag && !ediag && !ldiag) || (a.sigma && !SG) || (a.dout && !tape)) {
        fprintf(stderr, "birkhoff attn: out of memory\n");
        goto done;
    }
    bk_tensor tq = bk_tensor_bhnd(Q.data, H, Nq, d), tk = bk_tensor_bhnd(K.data, H, Nk, d);
    bk_tensor tv = bk_tensor_bhnd(V.data, H, Nk, dv), to = bk_tensor_bhnd(O, H, Nq, dv);
    bk_tensor ta = bk_tensor_bhnd(A, H, Nq, Nk);
    bk_status s;
    if (esp) {
        bk_esp_extras ex = {ta, SG, NULL, ediag};
        s = bk_esp_forward(&desc, &ep, &tq, &tk, &tv, &to, tape, &ex, NULL, 0);
    } else if (asap) {
        bk_asap_extras ex = {ta, NULL, diag};
        s = bk_asap_forward(&desc, &layer, av, &tq, &tk, &tv, &to, &ex, NULL, 0);
    } else if (dif) {
        bk_diff_extras ex = {ta};
        s = bk_diff_forward(&desc, &dp, &tq, &tk, &tv, &to, tape, &ex, NULL, 0);
    } else if (lot) {
        bk_lot_extras ex = {ta, ldiag};
        s = bk_lot_forward(&desc, &lp, &tq, &tk, &tv, &to, tape, &ex, NULL, 0);
    } else if (sink) {
        bk_sinkhorn_extras ex = {ta, NULL, NULL, diag};
        s = unb ? bk_unbalanced_forward(&desc, &up, &tq, &tk, &tv, &to, tape, &ex, NULL, 0)
                : bk_sinkhorn_forward(&desc, &p, &tq, &tk, &tv, &to, tape, &ex, NULL, 0);
    } else {
        bk_softmax_config sp = {p.scale, 0};
        s = bk_softmax_forward(&desc, &sp, &tq, &tk, &tv, &to, tape, A ? &ta : NULL, NULL, 0);
    }
    if (s != BK_OK) {
        fprintf(stderr, "birkhoff attn: forward failed: %s: %s\n", bk_status_str(s), bk_last_error());
        goto done;
    }
    if (a.dout) {
        dQ = malloc(nq * d * sizeof(float));
        dK = malloc(nk * d * sizeof(float));
        dV = malloc(nk * dv * sizeof(float));
        if (!dQ || !dK || !dV) {
            fprintf(stderr, "birkhoff attn: out of memory\n");
            goto done;
        }
        bk_tensor tdo = bk_tensor_bhnd(DO.data, H, Nq, dv), tdq = bk_tensor_bhnd(dQ, H, Nq, d);
        bk_tensor tdk = bk_tensor_bhnd(dK, H, Nk, d), tdv = bk_tensor_bhnd(dV, H, Nk, dv);
        if (a.dslices && !(DTH = malloc(sizeof(float) * (size_t)L * d))) {
            fprintf(stderr, "birkhoff attn: out of memory\n");
            goto done;
        }
        if (lot && ((a.dpivots && !(DPZ = malloc(sizeof(float) * (size_t)H * lp.r * d))) ||
                    (a.dplogits && !(DPT = malloc(sizeof(float) * (size_t)H * lp.r))))) {
            fprintf(stderr, "birkhoff attn: out of memory\n");
            goto done;
        }
        if (a.dlambda && !(DLAM = malloc(sizeof(float) * (size_t)H))) {
            fprintf(stderr, "birkhoff attn: out of memory\n");
            goto done;
        }
        if (dif) {
            s = bk_diff_backward(&desc, &dp, &tq, &tk, &tv, &tdo, tape, &tdq, &tdk, &tdv, DLAM, NULL, 0);
        } else if (esp) {
            s = bk_esp_backward(&desc, &ep, &tq, &tk, &tv, &tdo, tape, &tdq, &tdk, &tdv, DTH, NULL, 0);
        } else if (lot) {
            s = bk_lot_backward(&desc, &lp, &tq, &tk, &tv, &tdo, tape, &tdq, &tdk, &tdv, DPZ, DPT, NULL, 0);
        } else if (sink) {
            s = unb ? bk_unbalanced_backward(&desc, &up, &tq, &tk, &tv, &tdo, tape, &tdq, &tdk, &tdv, NULL, 0)
                    : bk_sinkhorn_backward(&desc, &p, &tq, &tk, &tv, &tdo, tape, &tdq, &tdk, &tdv, NULL, 0);
        } else {
            bk_softmax_config sp = {p.scale, 0};
            s = bk_softmax_backward(&desc, &sp, &tq, &tk, &tv, &tdo, tape, &tdq, &tdk, &tdv, NULL, 0);
        }
        if (s != BK_OK) {
            fprintf(stderr, "birkhoff attn: backward failed: %s: %s\n", bk_status_str(s), bk_last_error());
            goto done;
        }
    }
    /* every result is computed: now write the files */
    int64_t so[4] = {B, H, Nq, dv}, sa[4] = {B, H, Nq, Nk}, sq[4] = {B, H, Nq, d}, sk[4] = {B, H, Nk, d};
    int64_t sv[4] = {B, H, Nk, dv}, sd[3] = {B, H, 3}, sg[3] = {B, H, L}, sth[2] = {L, d};
    int64_t spz[3] = {H, lp.r, d}, spt[2] = {H, lp.r}, slam[1] = {H};
    if (ldiag) {
        sd[2] = 4;
        D = malloc(sizeof(float) * (size_t)B * H * 4);
        if (!D) goto done;
        for (int i = 0; i < B * H; i++) {
            D[4 * i] = (float)ldiag[i].iters1;
            D[4 * i + 1] = (float)ldiag[i].iters2;
            D[4 * i + 2] = ldiag[i].row_err;
            D[4 * i + 3] = ldiag[i].col_err;
        }
    }
    if (ediag) {
        sd[2] = 2;
        D = malloc(sizeof(float) * (size_t)B * H * 2);
        if (!D) goto done;
        for (int i = 0; i < B * H; i++) {
            D[2 * i] = ediag[i].row_err;
            D[2 * i + 1] = ediag[i].col_err;
        }
    }
    if (diag) {
        D = malloc(sizeof(float) * (size_t)B * H * 3);
        if (!D) goto done;
        for (int i = 0; i < B * H; i++) {
            D[3 * i] = (float)diag[i].iters;
            D[3 * i + 1] = diag[i].row_err;
            D[3 * i + 2] = diag[i].col_err;
        }
    }
    const cli_output outs[11] = {
        {a.out, 4, so, O}, {A ? a.attn : NULL, 4, sa, A}, {D ? a.diag : NULL, 3, sd, D},
        {a.dq, 4, sq, dQ}, {a.dk, 4, sk, dK}, {a.dv, 4, sv, dV}, {SG ? a.sigma : NULL, 3, sg, SG},
        {DTH ? a.dslices : NULL, 2, sth, DTH}, {DPZ ? a.dpivots : NULL, 3, spz, DPZ},
        {DPT ? a.dplogits : NULL, 2, spt, DPT}, {DLAM ? a.dlambda : NULL, 1, slam, DLAM}};
    if (!cli_write_outputs("attn", 11, outs)) goto done;
    if (diag) {
        float re = 0, ce = 0;
        int it = 0;
        for (int i = 0; i < B * H; i++) {
            re = max_err(re, diag[i].row_err);
            ce = max_err(ce, diag[i].col_err);
            it = diag[i].iters > it ? diag[i].iters : it;
        }
        fprintf(stderr, "%s: %d problems, max half-steps %d, max |row sum - 1| %.3g, max |col sum - 1| %.3g (relative)\n",
                a.op, B * H, it, (double)re, (double)ce);
    }
    rc = CLI_OK;
done:
    bk_npy_free(&Q); bk_npy_free(&K); bk_npy_free(&V); bk_npy_free(&QL); bk_npy_free(&KL); bk_npy_free(&DO);
    bk_npy_free(&TH); bk_npy_free(&PZ); bk_npy_free(&PT); bk_npy_free(&LAM);
    free(DPZ); free(DPT); free(DLAM); free(ldiag);
    bk_asap_layer_free(&layer);
    free(O); free(A); free(dQ); free(dK); free(dV); free(D); free(diag); free(ediag); free(SG); free(DTH); free(tape);
    return rc;
}
