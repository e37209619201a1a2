/* otk.c -- `birkhoff otk embed|fit-anchors|fit-refs`: the OTK embedding
 * and its unsupervised fits on .npy files. */
#include "../cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void otk_usage(FILE *f)
{
    fprintf(f,
            "usage: birkhoff otk embed --x X.npy --refs Z.npy --out Phi.npy [options]\n"
            "       birkhoff otk fit-anchors --x X.npy --k K --out W.npy [options]\n"
            "       birkhoff otk fit-refs --x X.npy --q Q --p P --out Z.npy [options]\n"
            "\n"
            "Sets X: float32 [B, n, d]; references Z: float32 [q, p, k]; anchors W: float32 [k, d].\n"
            "embed writes Phi [B, p, q*k] (support, then reference, then feature). Outputs are written\n"
            "all or nothing, each atomically.\n"
            "\n"
            "common options:\n"
            "  --lengths L.npy   int32 [B] valid elements per set (1..n; padding is never read)\n"
            "  --anchors W.npy   Nystrom anchors (unit rows); without them psi is the identity (k = d)\n"
            "  --sigma s         kernel bandwidth, alpha = 1/s^2 (default 0.5)\n"
            "  --eta e           inverse square root regulariser (default 0.01, the reference's)\n"
            "  --eps E           entropic temperature (default 0.5)\n"
            "  --iters S         Sinkhorn half-steps, even: S/2 iterations, each a row then a column step\n"
            "                    (default 20)\n"
            "  --threads N       threads (default: all cores); results do not depend on it\n"
            "embed:\n"
            "  --domain log|scaling          log-domain engine (default) or exp(K/eps) scaling form\n"
            "  --convention paper|reference  Phi = sqrt(p/q) P^T psi (default) or the code's p P^T psi\n"
            "  --pe none|1d|2d --sigma-pos s positional encoding S_ij (default none; sigma-pos 0.1)\n"
            "  --pe-double                   also multiply K by S before the exponential (reference code)\n"
            "  --grid HxW                    2-D input grid (n = H*W; p must be a square)\n"
            "  --isqrt-grad exact|reference  gradient through the inverse square root (default exact)\n"
            "  --plan P.npy                  also write the pooling weights c P (x) S, [B, q, n, p]\n"
            "  --diag D.npy                  per (set, reference) [row_err, col_err], [B, q, 2]\n"
            "  --dout dPhi.npy               upstream gradient [B, p, q*k]: run the backward, writing\n"
            "  --dx F --drefs F --danchors F the gradients (any subset; --danchors needs --anchors)\n"
            "fit-anchors / fit-refs (spherical K-means; reproducible for a seed):\n"
            "  --k K             fit-anchors: number of anchors\n"
            "  --q Q --p P       fit-refs: references and supports (k is the feature dimension)\n"
            "  --samples N       elements sampled for K-means (default 0 = all)\n"
            "  --kmeans-iters I  K-means (or Wasserstein K-means for q > 1) iterations (default 100)\n"
            "  --tol t           relative objective change to stop (default 1e-6)\n"
            "  --barycenter S    fit-refs: damped barycentric steps after each K-means (default 0)\n"
            "  --seed S          random seed (default 0)\n");
}

typedef struct {
    const char *x, *lengths, *refs, *anchors, *sigma, *eta, *eps, *iters, *domain, *conv, *pe, *spos, *pedouble;
    const char *grid, *isqrt, *out, *plan, *diag, *dout, *dx, *drefs, *danchors, *threads;
    const char *k, *q, *p, *samples, *kiters, *tol, *bary, *seed;
} otk_args;

static int bad_value(const char *flag, const char *v, const char *what)
{
    fprintf(stderr, "birkhoff otk: %s must be %s, got '%s'\n", flag, what, v);
    return 0;
}

/* parses the options shared by every subcommand into p (anchors loaded
 * into W) */
static int common_params(const otk_args *a, bk_otk_config *p, bk_npy *W)
{
    *p = bk_otk_config_default();
    if (a->threads) {
        int nt;
        if (!cli_parse_int(a->threads, &nt) || nt < 1 || nt > 4096) return bad_value("--threads", a->threads, "an integer in [1, 4096]");
        bk_set_num_threads(nt);
    }
    if (a->sigma && (!cli_parse_float(a->sigma, &p->sigma) || !(p->sigma > 0))) return bad_value("--sigma", a->sigma, "a number > 0");
    if (a->eta && (!cli_parse_float(a->eta, &p->eta) || !(p->eta >= 0))) return bad_value("--eta", a->eta, "a number >= 0");
    if (a->eps && (!cli_parse_float(a->eps, &p->eps) || !(p->eps > 0))) return bad_value("--eps", a->eps, "a number > 0");
    if (a->iters && (!cli_parse_int(a->iters, &p->iters) || p->iters < 2 || p->iters % 2))
        return bad_value("--iters", a->iters, "an even integer >= 2 (half-steps: 2 L for L iterations)");
    if (a->anchors) {
        if (!cli_load_f32("otk", "anchors", a->anchors, 2, W)) return 0;
        p->W = W->data;
    }
    return 1;
}

static int kmeans_params(const otk_args *a, bk_kmeans_config *kp)
{
    *kp = bk_kmeans_config_default();
    int v;
    if (a->kiters && (!cli_parse_int(a->kiters, &kp->iters) || kp->iters < 1)) return bad_value("--kmeans-iters", a->kiters, "an integer >= 1");
    if (a->tol && (!cli_parse_float(a->tol, &kp->tol) || !(kp->tol >= 0))) return bad_value("--tol", a->tol, "a number >= 0");
    if (a->samples) {
        if (!cli_parse_int(a->samples, &v) || v < 0) return bad_value("--samples", a->samples, "an integer >= 0");
        kp->max_samples = v;
    }
    if (a->seed) {
        if (!cli_parse_int(a->seed, &v) || v < 0) return bad_value("--seed", a->seed, "an integer >= 0");
        kp->seed = (uint64_t)v;
    }
    return 1;
}

static int run_embed(const otk_args *a)
{
    int rc = CLI_FAIL;
    bk_npy X = {0}, Z = {0}, W = {0}, LEN = {0}, DO = {0};
    float *O = NULL, *PL = NULL, *D = NULL, *DX = NULL, *DZ = NULL, *DW = NULL;
    bk_otk_diag *dg = NULL;
    void *tape = NULL;
    bk_otk_config p;
    if (!a->refs) {
        fprintf(stderr, "birkhoff otk embed: --refs is required\n");
        return CLI_USAGE;
    }
    if ((a->dx || a->drefs || a->danchors) && !a->dout) {
        fprintf(stderr, "birkhoff otk embed: --dx/--drefs/--danchors need --dout\n");
        return CLI_USAGE;
    }
    if (a->danchors && !a->anchors) {
        fprintf(stderr, "birkhoff otk embed: --danchors needs --anchors\n");
        return CLI_USAGE;
    }
    if (!common_params(a, &p, &W)) return CLI_USAGE;
    if (a->domain) {
        if (!strcmp(a->domain, "log")) p.domain = BK_OTK_LOG;
        else if (!strcmp(a->domain, "scaling")) p.domain = BK_OTK_SCALING;
        else { bad_value("--domain", a->domain, "log or scaling"); goto usage; }
    }
    if (a->conv) {
        if (!strcmp(a->conv, "paper")) p.convention = BK_OTK_PAPER;
        else if (!strcmp(a->conv, "reference")) p.convention = BK_OTK_REFERENCE;
        else { bad_value("--convention", a->conv, "paper or reference"); goto usage; }
    }
    if (a->isqrt) {
        if (!strcmp(a->isqrt, "exact")) p.isqrt_grad = BK_OTK_ISQRT_EXACT;
        else if (!strcmp(a->isqrt, "reference")) p.isqrt_grad = BK_OTK_ISQRT_REFERENCE;
        else { bad_value("--isqrt-grad", a->isqrt, "exact or reference"); goto usage; }
    }
    if (a->pe) {
        if (!strcmp(a->pe, "none")) p.pe = BK_OTK_PE_NONE;
        else if (!strcmp(a->pe, "1d")) p.pe = BK_OTK_PE_1D;
        else if (!strcmp(a->pe, "2d")) p.pe = BK_OTK_PE_2D;
        else { bad_value("--pe", a->pe, "none, 1d or 2d"); goto usage; }
    }
    if ((a->spos || a->pedouble || a->grid) && p.pe == BK_OTK_PE_NONE) {
        fprintf(stderr, "birkhoff otk embed: --sigma-pos/--pe-double/--grid need --pe 1d|2d\n");
        goto usage;
    }
    if (a->spos && (!cli_parse_float(a->spos, &p.sigma_pos) || !(p.sigma_pos > 0))) { bad_value("--sigma-pos", a->spos, "a number > 0"); goto usage; }
    p.pe_double = a->pedouble != NULL;
    if (p.pe == BK_OTK_PE_2D) {
        /* H and W in [1, 2^31): strtol, as sscanf's %d overflows silently */
        char *x = a->grid ? strchr(a->grid, 'x') : NULL, hs[16] = "";
        long long gh = 0, gw = 0;
        if (x && (size_t)(x - a->grid) < sizeof hs) memcpy(hs, a->grid, (size_t)(x - a->grid));
        if (!x || !cli_parse_range(hs, 1, 2147483647, &gh) || !cli_parse_range(x + 1, 1, 2147483647, &gw)) {
            fprintf(stderr, "birkhoff otk embed: --pe 2d needs --grid HxW (integers in [1, 2147483647])\n");
            goto usage;
        }
        p.grid_h = (int)gh;
        p.grid_w = (int)gw;
    } else if (a->grid) {
        fprintf(stderr, "birkhoff otk embed: --grid applies to --pe 2d only\n");
        goto usage;
    }
    if (!cli_load_f32("otk", "X", a->x, 3, &X) || !cli_load_f32("otk", "refs", a->refs, 3, &Z)) goto done;
    const int B = (int)X.shape[0], n = (int)X.shape[1], d = (int)X.shape[2];
    const int q = (int)Z.shape[0], P = (int)Z.shape[1], k = (int)Z.shape[2];
    if (p.W && (W.shape[0] != k || W.shape[1] != d)) {
        fprintf(stderr, "birkhoff otk embed: anchors must be [k=%d, d=%d] (refs are [q, p, k]), got [%lld, %lld]\n", k, d,
                (long long)W.shape[0], (long long)W.shape[1]);
        goto done;
    }
    if (!p.W && k != d) {
        fprintf(stderr, "birkhoff otk embed: without --anchors the references' feature dimension k (%d) must equal d (%d)\n", k, d);
        goto done;
    }
    if (a->lengths && !cli_load_len("otk", "--lengths", a->lengths, B, &LEN)) goto done;
    bk_otk_desc desc = {B, n, d, q, P, k, a->lengths ? (const int32_t *)LEN.data : NULL};
    if (a->dout) {
        if (!cli_load_f32("otk", "dout", a->dout, 3, &DO)) goto done;
        if (DO.shape[0] != B || DO.shape[1] != P || DO.shape[2] != (int64_t)q * k) {
            fprintf(stderr, "birkhoff otk embed: dout must be [B=%d, p=%d, q*k=%d]\n", B, P, q * k);
            goto done;
        }
    }
    const size_t no = (size_t)B * P * q * k;
    O = malloc(sizeof(float) * no);
    if (a->plan) PL = malloc(sizeof(float) * (size_t)B * q * n * P);
    if (a->diag) dg = malloc(sizeof(bk_otk_diag) * (size_t)B * q);
    if (a->dout) tape = malloc(bk_otk_tape_size(&desc, &p));
    if (!O || (a->plan && !PL) || (a->diag && !dg) || (a->dout && !tape)) {
        fprintf(stderr, "birkhoff otk embed: out of memory\n");
        goto done;
    }
    bk_tensor tx = bk_tensor_bhnd(X.data, 1, n, d), to = bk_tensor_bhnd(O, 1, P, q * k);
    bk_otk_extras ex = {PL, dg};
    bk_status s = bk_otk_forward(&desc, &p, &tx, Z.data, &to, tape, &ex, NULL, 0);
    if (s != BK_OK) {
        fprintf(stderr, "birkhoff otk embed: %s: %s\n", bk_status_str(s), bk_last_error());
        goto done;
    }
    if (a->dout) {
        if ((a->dx && !(DX = malloc(sizeof(float) * (size_t)B * n * d))) ||
            (a->drefs && !(DZ = malloc(sizeof(float) * (size_t)q * P * k))) ||
            (a->danchors && !(DW = malloc(sizeof(float) * (size_t)k * d)))) {
            fprintf(stderr, "birkhoff otk embed: out of memory\n");
            goto done;
        }
        bk_tensor tdo = bk_tensor_bhnd(DO.data, 1, P, q * k), tdx = bk_tensor_bhnd(DX, 1, n, d);
        s = bk_otk_backward(&desc, &p, &tx, Z.data, &tdo, tape, DX ? &tdx : NULL, DZ, DW, NULL, 0);
        if (s != BK_OK) {
            fprintf(stderr, "birkhoff otk embed: backward failed: %s: %s\n", bk_status_str(s), bk_last_error());
            goto done;
        }
    }
    if (dg) {
        if (!(D = malloc(sizeof(float) * (size_t)B * q * 2))) goto done;
        float re = 0, ce = 0;
        for (int i = 0; i < B * q; i++) {
            D[2 * i] = dg[i].row_err;
            D[2 * i + 1] = dg[i].col_err;
            re = dg[i].row_err > re ? dg[i].row_err : re;
            ce = dg[i].col_err > ce ? dg[i].col_err : ce;
        }
        fprintf(stderr, "otk: %d plans, max |n rowsum - 1| %.3g, max |p colsum - 1| %.3g\n", B * q, (double)re, (double)ce);
    }
    int64_t so[3] = {B, P, (int64_t)q * k}, spl[4] = {B, q, n, P}, sd[3] = {B, q, 2}, sx[3] = {B, n, d};
    int64_t sz[3] = {q, P, k}, sw[2] = {k, d};
    const cli_output outs[6] = {{a->out, 3, so, O},     {PL ? a->plan : NULL, 4, spl, PL}, {D ? a->diag : NULL, 3, sd, D},
                                {a->dx, 3, sx, DX},     {a->drefs, 3, sz, DZ},             {a->danchors, 2, sw, DW}};
    if (!cli_write_outputs("otk", 6, outs)) goto done;
    rc = CLI_OK;
    goto done;
usage:
    rc = CLI_USAGE;
done:
    bk_npy_free(&X); bk_npy_free(&Z); bk_npy_free(&W); bk_npy_free(&LEN); bk_npy_free(&DO);
    free(O); free(PL); free(D); free(DX); free(DZ); free(DW); free(dg); free(tape);
    return rc;
}

static int run_fit(const otk_args *a, int refs)
{
    int rc = CLI_FAIL;
    bk_npy X = {0}, W = {0}, LEN = {0};
    float *out = NULL;
    bk_otk_config p;
    bk_kmeans_config kp;
    int K = 0, q = 1, P = 0, bary = 0;
    if (!common_params(a, &p, &W) || !kmeans_params(a, &kp)) goto usage;
    if (!refs) {
        if (!a->k || !cli_parse_int(a->k, &K) || K < 1) {
            fprintf(stderr, "birkhoff otk fit-anchors: --k (number of anchors, >= 1) is required\n");
            goto usage;
        }
        if (a->anchors || a->q || a->p || a->bary) {
            fprintf(stderr, "birkhoff otk fit-anchors: --anchors/--q/--p/--barycenter apply to fit-refs only\n");
            goto usage;
        }
    } else {
        if (!a->q || !cli_parse_int(a->q, &q) || q < 1 || !a->p || !cli_parse_int(a->p, &P) || P < 1) {
            fprintf(stderr, "birkhoff otk fit-refs: --q Q and --p P (integers >= 1) are required\n");
            goto usage;
        }
        if (a->k) {
            fprintf(stderr, "birkhoff otk fit-refs: --k applies to fit-anchors (the feature dimension comes from the anchors)\n");
            goto usage;
        }
        if (a->bary && (!cli_parse_int(a->bary, &bary) || bary < 0)) { bad_value("--barycenter", a->bary, "an integer >= 0"); goto usage; }
    }
    if (!cli_load_f32("otk", "X", a->x, 3, &X)) goto done;
    const int B = (int)X.shape[0], n = (int)X.shape[1], d = (int)X.shape[2];
    if (a->lengths && !cli_load_len("otk", "--lengths", a->lengths, B, &LEN)) goto done;
    const int32_t *len = a->lengths ? (const int32_t *)LEN.data : NULL;
    bk_tensor tx = bk_tensor_bhnd(X.data, 1, n, d);
    bk_kmeans_report rep = {0, 0, 0.0};
    bk_status s;
    int64_t shape[3];
    int ndim;
    if (!refs) {
        bk_otk_desc desc = {B, n, d, 1, 1, K, len};
        if (!(out = malloc(sizeof(float) * (size_t)K * d))) {
            fprintf(stderr, "birkhoff otk fit-anchors: out of memory for %d anchors of dimension %d (--k)\n", K, d);
            goto done;
        }
        s = bk_otk_fit_anchors(&desc, &tx, &kp, out, &rep);
        shape[0] = K; shape[1] = d; ndim = 2;
    } else {
        if (p.W && W.shape[1] != d) {
            fprintf(stderr, "birkhoff otk fit-refs: anchors must be [k, d=%d], got [%lld, %lld]\n", d, (long long)W.shape[0],
                    (long long)W.shape[1]);
            goto done;
        }
        const int k = p.W ? (int)W.shape[0] : d;
        bk_otk_desc desc = {B, n, d, q, P, k, len};
        if (!(out = malloc(sizeof(float) * (size_t)q * P * k))) {
            fprintf(stderr, "birkhoff otk fit-refs: out of memory for %d x %d references of dimension %d (--q, --p)\n",
                    q, P, k);
            goto done;
        }
        s = bk_otk_fit_refs(&desc, &p, &tx, &kp, bary, out, &rep);
        shape[0] = q; shape[1] = P; shape[2] = k; ndim = 3;
    }
    if (s != BK_OK) {
        fprintf(stderr, "birkhoff otk %s: %s: %s\n", refs ? "fit-refs" : "fit-anchors", bk_status_str(s), bk_last_error());
        goto done;
    }
    fprintf(stderr, "otk %s: %d iterations, %s, objective %.6f\n", refs ? "fit-refs" : "fit-anchors", rep.iters,
            rep.converged ? "converged" : "not converged", rep.objective);
    const cli_output o[1] = {{a->out, ndim, shape, out}};
    if (!cli_write_outputs("otk", 1, o)) goto done;
    rc = CLI_OK;
    goto done;
usage:
    rc = CLI_USAGE;
done:
    bk_npy_free(&X); bk_npy_free(&W); bk_npy_free(&LEN);
    free(out);
    return rc;
}

int cmd_otk(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        otk_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? CLI_USAGE : CLI_OK;
    }
    const char *sub = argv[1];
    const int embed = !strcmp(sub, "embed"), fa = !strcmp(sub, "fit-anchors"), fr = !strcmp(sub, "fit-refs");
    if (!embed && !fa && !fr) {
        fprintf(stderr, "birkhoff otk: unknown subcommand '%s' (embed, fit-anchors or fit-refs)\n", sub);
        return CLI_USAGE;
    }
    otk_args a;
    memset(&a, 0, sizeof a);
    const cli_opt opts[] = {
        {"--x", &a.x, 0},           {"--lengths", &a.lengths, 0},   {"--refs", &a.refs, 0},     {"--anchors", &a.anchors, 0},
        {"--sigma", &a.sigma, 0},   {"--eta", &a.eta, 0},           {"--eps", &a.eps, 0},       {"--iters", &a.iters, 0},
        {"--domain", &a.domain, 0}, {"--convention", &a.conv, 0},   {"--pe", &a.pe, 0},         {"--sigma-pos", &a.spos, 0},
        {"--pe-double", &a.pedouble, 1}, {"--grid", &a.grid, 0},    {"--isqrt-grad", &a.isqrt, 0}, {"--out", &a.out, 0},
        {"--plan", &a.plan, 0},     {"--diag", &a.diag, 0},         {"--dout", &a.dout, 0},     {"--dx", &a.dx, 0},
        {"--drefs", &a.drefs, 0},   {"--danchors", &a.danchors, 0}, {"--threads", &a.threads, 0}, {"--k", &a.k, 0},
        {"--q", &a.q, 0},           {"--p", &a.p, 0},               {"--samples", &a.samples, 0}, {"--kmeans-iters", &a.kiters, 0},
        {"--tol", &a.tol, 0},       {"--barycenter", &a.bary, 0},   {"--seed", &a.seed, 0},
    };
    int done = 0, rc = cli_parse_opts("otk", argc - 1, argv + 1, opts, (int)(sizeof opts / sizeof opts[0]), otk_usage, &done);
    if (rc != CLI_OK || done) return rc;
    if (!a.x || !a.out) {
        fprintf(stderr, "birkhoff otk %s: --x and --out are required\n", sub);
        return CLI_USAGE;
    }
    if (!embed && (a.refs || a.domain || a.conv || a.pe || a.spos || a.pedouble || a.grid || a.isqrt || a.plan || a.diag ||
                   a.dout || a.dx || a.drefs || a.danchors)) {
        fprintf(stderr, "birkhoff otk %s: embedding options (--refs, --domain, --pe, --dout, ...) apply to embed only\n", sub);
        return CLI_USAGE;
    }
    if (embed && (a.k || a.q || a.p || a.samples || a.kiters || a.tol || a.bary || a.seed)) {
        fprintf(stderr, "birkhoff otk embed: fitting options (--k, --q, --p, --samples, ...) apply to fit-anchors/fit-refs\n");
        return CLI_USAGE;
    }
    if (embed) return run_embed(&a);
    return run_fit(&a, fr);
}
