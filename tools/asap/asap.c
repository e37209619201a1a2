/* asap.c -- `birkhoff asap calibrate|report|show|generate`: compile a
 * Sinkhorn attention layer into an ASAP layer file, measure its fidelity,
 * inspect it, and generate structured synthetic Q, K, V (asap_synth in
 * tools/cli.c); `asap compile` (a whole trained model) is compile.c. */
#include "../cli.h"

#include <glob.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void asap_usage(FILE *f)
{
    fprintf(f,
            "usage: birkhoff asap compile --ckpt SINKHORN.safetensors --out ASAP.safetensors [options]\n"
            "       (a whole trained model: `birkhoff asap compile --help`)\n"
            "       birkhoff asap calibrate --q Q.npy --k K.npy --out layer.asap [options]\n"
            "       birkhoff asap report --layer layer.asap --q Q.npy --k K.npy --v V.npy [options]\n"
            "       birkhoff asap show --layer layer.asap [--theta-out T.npy] [--omega-out W.npy]\n"
            "       birkhoff asap generate --out-q Q.npy --out-k K.npy --out-v V.npy [options]\n"
            "\n"
            "ASAP compiles a Sinkhorn attention layer (the teacher: S half-steps, eps, scale) into a\n"
            "loop-free operator: sliced 1-D potentials -> predicted dual -> 1 to 3 c-transforms.\n"
            "Q, K: float32 [B,H,N,d] and [B,H,M,d]; V [B,H,M,dv]; lengths int32 [B].\n"
            "\n"
            "calibrate (streams the calibration files; LS keeps O(L^2) memory):\n"
            "  --q LIST --k LIST   comma-separated files or globs (quoted), matched in order\n"
            "  --q-len LIST --k-len LIST   matching int32 [B] length files (padding)\n"
            "  --teacher-iters S   teacher half-steps, >= 2 (default 20)\n"
            "  --eps E --scale s   teacher temperature (1) and score scale (default 1/sqrt(d))\n"
            "  --slices L          slice-bank size (default 32)\n"
            "  --seed N | --theta T.npy   random unit slices from a seed (default 1) or a bank [L, d]\n"
            "  --lambda l          ridge (default 1e-3, added to the raw sums X^T X)\n"
            "  --fit ls|kl         least squares (default) or the one-sided KL objective (Newton\n"
            "                      from the LS solution; keeps every calibration problem in memory)\n"
            "  --kl-iters N --kl-tol t   Newton steps (50) and relative decrement tolerance (1e-13)\n"
            "  --out F.asap        the compiled layer (versioned, checksummed, written atomically)\n"
            "  --json              print the fit report as one JSON object\n"
            "report (fidelity against the teacher on held-out inputs):\n"
            "  --baselines LIST    Sinkhorn half-step counts to compare too (default 3,5)\n"
            "  --reps R            timing repetitions, median reported (default 3)\n"
            "  --json              one JSON object per method\n"
            "generate (structured synthetic attention inputs, not i.i.d. noise):\n"
            "  --b B --h H --n N --d d   sizes (default 4, 2, 128, 32; dv = d)\n"
            "  --seed N --temp t   seed (1) and score temperature multiplier (1)\n"
            "common: --q-len/--k-len, --threads N (results do not depend on it)\n");
}

/* ------------------------------------------------------------------------ */
/* helpers                                                                  */
/* ------------------------------------------------------------------------ */
typedef struct {
    char **v;
    int n;
} strlist;

static void strlist_free(strlist *l)
{
    for (int i = 0; i < l->n; i++) free(l->v[i]);
    free(l->v);
    l->v = NULL;
    l->n = 0;
}

static int strlist_add(strlist *l, const char *s)
{
    char **nv = realloc(l->v, sizeof(char *) * (size_t)(l->n + 1));
    if (!nv) return 0;
    l->v = nv;
    l->v[l->n] = malloc(strlen(s) + 1);
    if (!l->v[l->n]) return 0;
    strcpy(l->v[l->n++], s);
    return 1;
}

/* Comma-separated items; an item with a glob character expands (sorted) and
 * must match at least one file. */
static int expand_list(const char *what, const char *arg, strlist *out)
{
    char *copy = malloc(strlen(arg) + 1);
    if (!copy) return 0;
    strcpy(copy, arg);
    int ok = 1;
    for (char *tok = copy, *next; tok && ok; tok = next) {
        next = strchr(tok, ',');
        if (next) *next++ = '\0';
        if (!*tok) continue;
        if (strpbrk(tok, "*?[")) {
            glob_t g;
            int r = glob(tok, 0, NULL, &g);
            if (r != 0 || g.gl_pathc == 0) {
                fprintf(stderr, "birkhoff asap: %s pattern '%s' matches no file\n", what, tok);
                ok = 0;
            }
            for (size_t i = 0; ok && i < g.gl_pathc; i++) ok = strlist_add(out, g.gl_pathv[i]);
            if (r == 0) globfree(&g);
        } else {
            ok = strlist_add(out, tok);
        }
    }
    free(copy);
    if (ok && out->n == 0) {
        fprintf(stderr, "birkhoff asap: %s names no file\n", what);
        ok = 0;
    }
    return ok;
}

static int parse_threads(const char *s)
{
    if (!s) return 1;
    int nt;
    if (!cli_parse_int(s, &nt) || nt < 1 || nt > 4096) {
        fprintf(stderr, "birkhoff asap: --threads must be an integer in [1, 4096]\n");
        return 0;
    }
    bk_set_num_threads(nt);
    return 1;
}

static const char *fit_name(bk_asap_fit f) { return f == BK_ASAP_FIT_KL ? "kl" : "ls"; }

/* Q [B,H,N,d], K [B,H,M,d] (and V [B,H,M,dv] when v != NULL) with matching
 * leading dims; optional lengths. */
static int load_qkv(const char *q, const char *k, const char *v, const char *ql, const char *kl, bk_npy *Q,
                    bk_npy *K, bk_npy *V, bk_npy *QL, bk_npy *KL)
{
    if (!cli_load_f32("asap", "Q", q, 4, Q) || !cli_load_f32("asap", "K", k, 4, K)) return 0;
    if (K->shape[0] != Q->shape[0] || K->shape[1] != Q->shape[1] || K->shape[3] != Q->shape[3]) {
        fprintf(stderr, "birkhoff asap: K (%s) must be [B,H,M,d] with B, H, d of Q (%s)\n", k, q);
        return 0;
    }
    if (v) {
        if (!cli_load_f32("asap", "V", v, 4, V)) return 0;
        if (V->shape[0] != K->shape[0] || V->shape[1] != K->shape[1] || V->shape[2] != K->shape[2]) {
            fprintf(stderr, "birkhoff asap: V (%s) must be [B,H,M,dv] with B, H, M of K\n", v);
            return 0;
        }
    }
    if (ql && !cli_load_len("asap", "--q-len", ql, Q->shape[0], QL)) return 0;
    if (kl && !cli_load_len("asap", "--k-len", kl, Q->shape[0], KL)) return 0;
    return 1;
}

/* ------------------------------------------------------------------------ */
/* calibrate                                                                */
/* ------------------------------------------------------------------------ */
static int cmd_calibrate(int argc, char **argv)
{
    const char *q = NULL, *k = NULL, *ql = NULL, *kl = NULL, *S = NULL, *eps = NULL, *scale = NULL, *L = NULL,
               *seed = NULL, *theta = NULL, *lambda = NULL, *fit = NULL, *kli = NULL, *klt = NULL, *out = NULL,
               *json = NULL, *threads = NULL;
    const cli_opt opts[] = {
        {"--q", &q, 0},           {"--k", &k, 0},         {"--q-len", &ql, 0},   {"--k-len", &kl, 0},
        {"--teacher-iters", &S, 0}, {"--eps", &eps, 0},   {"--scale", &scale, 0}, {"--slices", &L, 0},
        {"--seed", &seed, 0},     {"--theta", &theta, 0}, {"--lambda", &lambda, 0}, {"--fit", &fit, 0},
        {"--kl-iters", &kli, 0},  {"--kl-tol", &klt, 0},  {"--out", &out, 0},     {"--json", &json, 1},
        {"--threads", &threads, 0},
    };
    int done = 0, rc0 = cli_parse_opts("asap calibrate", argc, argv, opts, (int)(sizeof opts / sizeof opts[0]),
                                       asap_usage, &done);
    if (rc0 != CLI_OK || done) return rc0;
    if (!q || !k || !out) {
        fprintf(stderr, "birkhoff asap calibrate: --q, --k and --out are required\n");
        return CLI_USAGE;
    }
    if (seed && theta) {
        fprintf(stderr, "birkhoff asap calibrate: give either --seed or --theta, not both\n");
        return CLI_USAGE;
    }
    bk_asap_config cfg = bk_asap_config_default(1);
    bk_asap_kl_config ko = bk_asap_kl_config_default();
    bk_asap_fit ft = BK_ASAP_FIT_LS;
    float lam = 1e-3f;
    if ((S && (!cli_parse_int(S, &cfg.teacher_iters) || cfg.teacher_iters < 2)) ||
        (eps && (!cli_parse_float(eps, &cfg.eps) || !(cfg.eps > 0))) ||
        (scale && (!cli_parse_float(scale, &cfg.scale) || !(cfg.scale > 0))) ||
        (L && (!cli_parse_int(L, &cfg.slices) || cfg.slices < 1)) ||
        (lambda && (!cli_parse_float(lambda, &lam) || !(lam >= 0))) ||
        (kli && (!cli_parse_int(kli, &ko.max_iters) || ko.max_iters < 0))) {
        fprintf(stderr, "birkhoff asap calibrate: bad value: --teacher-iters is an integer >= 2 (S = 1 is softmax, "
                        "nothing to compile), --eps and --scale > 0, --slices >= 1, --lambda >= 0, --kl-iters >= 0\n");
        return CLI_USAGE;
    }
    cfg.lambda = lambda ? strtod(lambda, NULL) : 1e-3;
    if (klt) {
        float t;
        if (!cli_parse_float(klt, &t) || !(t >= 0)) {
            fprintf(stderr, "birkhoff asap calibrate: --kl-tol must be a number >= 0\n");
            return CLI_USAGE;
        }
        ko.tol = strtod(klt, NULL);
    }
    if (seed) {
        int sd;
        if (!cli_parse_int(seed, &sd) || sd < 0) {
            fprintf(stderr, "birkhoff asap calibrate: --seed must be an integer >= 0\n");
            return CLI_USAGE;
        }
        cfg.seed = (uint64_t)sd;
    }
    if (fit) {
        if (!strcmp(fit, "kl")) ft = BK_ASAP_FIT_KL;
        else if (strcmp(fit, "ls")) {
            fprintf(stderr, "birkhoff asap calibrate: --fit must be ls or kl, got '%s'\n", fit);
            return CLI_USAGE;
        }
    }
    if (!parse_threads(threads)) return CLI_USAGE;
    strlist qs = {0}, ks = {0}, qls = {0}, kls = {0};
    bk_npy TH = {0};
    bk_asap_calib *cal = NULL;
    bk_asap_layer layer;
    memset(&layer, 0, sizeof layer);
    int rc = CLI_FAIL;
    if (!expand_list("--q", q, &qs) || !expand_list("--k", k, &ks) || (ql && !expand_list("--q-len", ql, &qls)) ||
        (kl && !expand_list("--k-len", kl, &kls)))
        goto done;
    if (ks.n != qs.n || (ql && qls.n != qs.n) || (kl && kls.n != qs.n)) {
        fprintf(stderr, "birkhoff asap calibrate: --q names %d files but --k %d%s; they must match in order\n", qs.n,
                ks.n, (ql || kl) ? " (and the length lists likewise)" : "");
        goto done;
    }
    if (theta) {
        if (bk_npy_read(theta, &TH) != BK_OK) {
            fprintf(stderr, "birkhoff asap calibrate: %s\n", bk_last_error());
            goto done;
        }
        if (TH.dtype != BK_F32 || TH.ndim != 2 || TH.shape[0] < 1 || TH.shape[0] > 65536) {
            fprintf(stderr, "birkhoff asap calibrate: --theta (%s) must be a float32 array [L, d]\n", theta);
            goto done;
        }
        if (L && TH.shape[0] != cfg.slices) {
            fprintf(stderr, "birkhoff asap calibrate: --slices %d but --theta has %lld rows\n", cfg.slices,
                    (long long)TH.shape[0]);
            goto done;
        }
        cfg.slices = (int)TH.shape[0];
        cfg.theta = TH.data;
    }
    double t0 = cli_now();
    for (int f = 0; f < qs.n; f++) {
        bk_npy Q = {0}, K = {0}, QL = {0}, KL = {0};
        int ok = load_qkv(qs.v[f], ks.v[f], NULL, ql ? qls.v[f] : NULL, kl ? kls.v[f] : NULL, &Q, &K, NULL, &QL, &KL);
        const int B = ok ? (int)Q.shape[0] : 0, H = ok ? (int)Q.shape[1] : 0, d = ok ? (int)Q.shape[3] : 0;
        if (ok && !cal) {
            cfg.d = d;
            if (theta && TH.shape[1] != d) {
                fprintf(stderr, "birkhoff asap calibrate: --theta has %lld columns, Q has d = %d\n",
                        (long long)TH.shape[1], d);
                ok = 0;
            } else if (bk_asap_calib_create(&cfg, ft == BK_ASAP_FIT_KL, &cal) != BK_OK) {
                fprintf(stderr, "birkhoff asap calibrate: %s\n", bk_last_error());
                ok = 0;
            }
        }
        if (ok && d != cfg.d) {
            fprintf(stderr, "birkhoff asap calibrate: %s has d = %d, the first file has %d\n", qs.v[f], d, cfg.d);
            ok = 0;
        }
        if (ok) {
            bk_attn_desc desc = {B, H, (int)Q.shape[2], (int)K.shape[2], d, 1, QL.data, KL.data};
            bk_tensor tq = bk_tensor_bhnd(Q.data, H, (int)Q.shape[2], d), tk = bk_tensor_bhnd(K.data, H, (int)K.shape[2], d);
            if (bk_asap_calib_add(cal, &desc, &tq, &tk) != BK_OK) {
                fprintf(stderr, "birkhoff asap calibrate: %s: %s\n", qs.v[f], bk_last_error());
                ok = 0;
            }
        }
        bk_npy_free(&Q);
        bk_npy_free(&K);
        bk_npy_free(&QL);
        bk_npy_free(&KL);
        if (!ok) goto done;
    }
    double t1 = cli_now();
    bk_asap_fit_report rep;
    if (bk_asap_calib_fit(cal, ft, &ko, &layer, &rep) != BK_OK) {
        fprintf(stderr, "birkhoff asap calibrate: fit failed: %s\n", bk_last_error());
        goto done;
    }
    double t2 = cli_now();
    if (bk_asap_save(out, &layer) != BK_OK) {
        fprintf(stderr, "birkhoff asap calibrate: %s\n", bk_last_error());
        goto done;
    }
    if (json) {
        printf("{\"fit\": \"%s\", \"files\": %d, \"problems\": %lld, \"rows\": %lld, \"slices\": %d, \"d\": %d, "
               "\"teacher_iters\": %d, \"eps\": %.9g, \"scale\": %.9g, \"lambda\": %.9g, \"ls_rmse\": %.9g, "
               "\"ls_r2\": %.9g, \"kl_j0\": %.12g, \"kl_j\": %.12g, \"kl_grad\": %.6g, \"kl_iters\": %d, "
               "\"kl_converged\": %d, \"teacher_s\": %.6f, \"fit_s\": %.6f, \"out\": \"%s\"}\n",
               fit_name(ft), qs.n, (long long)rep.problems, (long long)rep.rows, layer.slices, layer.d,
               layer.teacher_iters, (double)layer.eps, (double)layer.scale, layer.lambda, rep.ls_rmse, rep.ls_r2,
               rep.kl_j0, rep.kl_j, rep.kl_grad, rep.kl_iters, rep.kl_converged, t1 - t0, t2 - t1, out);
    } else {
        printf("asap calibrate: %d file(s), %lld problems, %lld rows; teacher S = %d, eps = %g, scale = %g; L = %d\n",
               qs.n, (long long)rep.problems, (long long)rep.rows, layer.teacher_iters, (double)layer.eps,
               (double)layer.scale, layer.slices);
        printf("  LS: rmse %.4g (cost units), R^2 %.5f (lambda %g)\n", rep.ls_rmse, rep.ls_r2, layer.lambda);
        if (ft == BK_ASAP_FIT_KL)
            printf("  KL: J %.10g -> %.10g in %d Newton steps, max |grad| %.3g, %s\n", rep.kl_j0, rep.kl_j,
                   rep.kl_iters, rep.kl_grad, rep.kl_converged ? "converged" : "NOT converged (iteration limit)");
        printf("  teacher + features %.2f s, fit %.3f s; wrote %s\n", t1 - t0, t2 - t1, out);
    }
    rc = CLI_OK;
done:
    strlist_free(&qs);
    strlist_free(&ks);
    strlist_free(&qls);
    strlist_free(&kls);
    bk_npy_free(&TH);
    bk_asap_calib_free(cal);
    bk_asap_layer_free(&layer);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* show                                                                     */
/* ------------------------------------------------------------------------ */
static int cmd_show(int argc, char **argv)
{
    const char *layer_p = NULL, *tout = NULL, *wout = NULL;
    const cli_opt opts[] = {{"--layer", &layer_p, 0}, {"--theta-out", &tout, 0}, {"--omega-out", &wout, 0}};
    int done = 0, rc0 = cli_parse_opts("asap show", argc, argv, opts, 3, asap_usage, &done);
    if (rc0 != CLI_OK || done) return rc0;
    if (!layer_p) {
        fprintf(stderr, "birkhoff asap show: --layer is required\n");
        return CLI_USAGE;
    }
    bk_asap_layer ly;
    if (bk_asap_load(layer_p, &ly) != BK_OK) {
        fprintf(stderr, "birkhoff asap show: %s\n", bk_last_error());
        return CLI_FAIL;
    }
    float *w = malloc(sizeof(float) * (size_t)ly.slices);
    if (!w) {
        bk_asap_layer_free(&ly);
        return CLI_FAIL;
    }
    double wn = 0;
    for (int l = 0; l < ly.slices; l++) {
        w[l] = (float)ly.omega[l];
        wn += ly.omega[l] * ly.omega[l];
    }
    int64_t st[2] = {ly.slices, ly.d}, sw[1] = {ly.slices};
    const cli_output outs[2] = {{tout, 2, st, ly.theta}, {wout, 1, sw, w}};
    int ok = cli_write_outputs("asap show", 2, outs);
    if (ok)
        printf("{\"version\": %d, \"d\": %d, \"slices\": %d, \"scale\": %.9g, \"eps\": %.9g, \"teacher_iters\": %d, "
               "\"ending\": \"%s\", \"fit\": \"%s\", \"lambda\": %.9g, \"seed\": %llu, \"theta_given\": %d, "
               "\"calib_problems\": %lld, \"calib_rows\": %lld, \"omega_norm\": %.9g}\n",
               BK_ASAP_FILE_VERSION, ly.d, ly.slices, (double)ly.scale, (double)ly.eps, ly.teacher_iters,
               ly.teacher_iters % 2 == 0 ? "column" : "row", fit_name(ly.fit), ly.lambda,
               (unsigned long long)ly.seed, ly.theta_given, (long long)ly.calib_problems, (long long)ly.calib_rows,
               sqrt(wn));
    free(w);
    bk_asap_layer_free(&ly);
    return ok ? CLI_OK : CLI_FAIL;
}

/* ------------------------------------------------------------------------ */
/* report                                                                   */
/* ------------------------------------------------------------------------ */
static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int cmd_report(int argc, char **argv)
{
    const char *layer_p = NULL, *q = NULL, *k = NULL, *v = NULL, *ql = NULL, *kl = NULL, *bl = NULL, *reps_s = NULL,
               *json = NULL, *threads = NULL;
    const cli_opt opts[] = {{"--layer", &layer_p, 0}, {"--q", &q, 0},         {"--k", &k, 0},
                            {"--v", &v, 0},           {"--q-len", &ql, 0},    {"--k-len", &kl, 0},
                            {"--baselines", &bl, 0},  {"--reps", &reps_s, 0}, {"--json", &json, 1},
                            {"--threads", &threads, 0}};
    int done = 0, rc0 = cli_parse_opts("asap report", argc, argv, opts, 10, asap_usage, &done);
    if (rc0 != CLI_OK || done) return rc0;
    if (!layer_p || !q || !k || !v) {
        fprintf(stderr, "birkhoff asap report: --layer, --q, --k and --v are required\n");
        return CLI_USAGE;
    }
    int reps = 3, base[8], nb = 0;
    if (reps_s && (!cli_parse_int(reps_s, &reps) || reps < 1 || reps > 1000)) {
        fprintf(stderr, "birkhoff asap report: --reps must be an integer in [1, 1000]\n");
        return CLI_USAGE;
    }
    {
        const char *p = bl ? bl : "3,5";
        while (*p) {
            char *end;
            long x = strtol(p, &end, 10);
            if (end == p || x < 1 || x > 1000000 || nb == 8 || (*end && *end != ',')) {
                fprintf(stderr, "birkhoff asap report: --baselines is a comma list of up to 8 half-step counts >= 1\n");
                return CLI_USAGE;
            }
            base[nb++] = (int)x;
            p = *end ? end + 1 : end;
        }
    }
    if (!parse_threads(threads)) return CLI_USAGE;
    bk_asap_layer ly;
    memset(&ly, 0, sizeof ly);
    bk_npy Q = {0}, K = {0}, V = {0}, QL = {0}, KL = {0};
    float *buf = NULL;
    int rc = CLI_FAIL;
    if (bk_asap_load(layer_p, &ly) != BK_OK) {
        fprintf(stderr, "birkhoff asap report: %s\n", bk_last_error());
        goto done;
    }
    if (!load_qkv(q, k, v, ql, kl, &Q, &K, &V, &QL, &KL)) goto done;
    const int B = (int)Q.shape[0], H = (int)Q.shape[1], Nq = (int)Q.shape[2], Nk = (int)K.shape[2];
    const int d = (int)Q.shape[3], dv = (int)V.shape[3];
    if (d != ly.d) {
        fprintf(stderr, "birkhoff asap report: the layer was compiled for d = %d, Q has d = %d\n", ly.d, d);
        goto done;
    }
    const size_t no = (size_t)B * H * Nq * dv, na = (size_t)B * H * Nq * Nk;
    buf = malloc(sizeof(float) * 2 * (no + na));
    if (!buf) {
        fprintf(stderr, "birkhoff asap report: out of memory (two outputs and attentions)\n");
        goto done;
    }
    float *Ot = buf, *At = Ot + no, *O = At + na, *A = O + no;
    bk_attn_desc desc = {B, H, Nq, Nk, d, dv, QL.data, KL.data};
    bk_tensor tq = bk_tensor_bhnd(Q.data, H, Nq, d), tk = bk_tensor_bhnd(K.data, H, Nk, d);
    bk_tensor tv = bk_tensor_bhnd(V.data, H, Nk, dv);
    bk_tensor tot = bk_tensor_bhnd(Ot, H, Nq, dv), tat = bk_tensor_bhnd(At, H, Nq, Nk);
    bk_tensor to = bk_tensor_bhnd(O, H, Nq, dv), ta = bk_tensor_bhnd(A, H, Nq, Nk);
    /* methods: 0 teacher, 1 ASAP (teacher's ending), 2 ASAP-0, 3.. Sinkhorn baselines */
    const int nm = 3 + nb;
    double teacher_ms = 0;
    if (!json)
        printf("ASAP fidelity vs the Sinkhorn teacher (S = %d, eps = %g, L = %d, %s fit), %d problems of %dx%d\n",
               ly.teacher_iters, (double)ly.eps, ly.slices, fit_name(ly.fit), B * H, Nq, Nk);
    if (!json)
        printf("%-16s %5s %10s %8s | %10s %9s %9s %9s %9s\n", "method", "steps", "time ms", "speedup", "out RMSE",
               "rel RMSE", "attn rl2", "row err", "col err");
    for (int m = 0; m < nm; m++) {
        double ts[1000];
        bk_status s = BK_OK;
        const float *O_ = m == 0 ? Ot : O;
        bk_tensor *to_ = m == 0 ? &tot : &to, *ta_ = m == 0 ? &tat : &ta;
        char name[32];
        int steps;
        for (int r = 0; r < reps && s == BK_OK; r++) {
            double t = cli_now();
            if (m == 0 || m >= 3) {
                bk_sinkhorn_config sp = bk_sinkhorn_config_default();
                sp.iters = m == 0 ? ly.teacher_iters : base[m - 3];
                sp.eps = ly.eps;
                sp.scale = ly.scale;
                bk_sinkhorn_extras ex = {*ta_, NULL, NULL, NULL};
                s = bk_sinkhorn_forward(&desc, &sp, &tq, &tk, &tv, to_, NULL, &ex, NULL, 0);
            } else {
                bk_asap_extras ex = {*ta_, NULL, NULL};
                s = bk_asap_forward(&desc, &ly, m == 1 ? BK_ASAP_AUTO : BK_ASAP_ZERO, &tq, &tk, &tv, to_, &ex, NULL, 0);
            }
            ts[r] = (cli_now() - t) * 1e3;
        }
        if (s != BK_OK) {
            fprintf(stderr, "birkhoff asap report: %s\n", bk_last_error());
            goto done;
        }
        qsort(ts, (size_t)reps, sizeof(double), cmp_double);
        double ms = ts[reps / 2];
        if (m == 0) {
            teacher_ms = ms;
            snprintf(name, sizeof name, "teacher S=%d", ly.teacher_iters);
            steps = ly.teacher_iters;
        } else if (m == 1) {
            snprintf(name, sizeof name, "asap (%s)", ly.teacher_iters % 2 == 0 ? "column" : "row");
            steps = ly.teacher_iters % 2 == 0 ? 3 : 2;
        } else if (m == 2) {
            snprintf(name, sizeof name, "asap0");
            steps = 1;
        } else {
            snprintf(name, sizeof name, "sinkhorn S=%d", base[m - 3]);
            steps = base[m - 3];
        }
        bk_attn_fidelity fd;
        if (bk_attn_compare(&desc, to_, &tot, ta_, &tat, &fd) != BK_OK) {
            fprintf(stderr, "birkhoff asap report: %s\n", bk_last_error());
            goto done;
        }
        (void)O_;
        double rel = fd.out_rms > 0 ? fd.out_rmse / fd.out_rms : fd.out_rmse;
        if (json)
            printf("{\"method\": \"%s\", \"half_steps\": %d, \"ms\": %.6f, \"speedup\": %.6f, \"out_rmse\": %.9g, "
                   "\"out_rms\": %.9g, \"out_rel_rmse\": %.9g, \"attn_rel_l2\": %.9g, \"row_err\": %.9g, "
                   "\"col_err\": %.9g, \"problems\": %d}\n",
                   name, steps, ms, teacher_ms / ms, fd.out_rmse, fd.out_rms, rel, fd.attn_rel_l2, fd.row_err,
                   fd.col_err, fd.problems);
        else
            printf("%-16s %5d %10.3f %7.2fx | %10.3g %9.3g %9.3g %9.3g %9.3g\n", name, steps, ms, teacher_ms / ms,
                   fd.out_rmse, rel, fd.attn_rel_l2, fd.row_err, fd.col_err);
    }
    if (!json)
        printf("rel RMSE = out RMSE / RMS of the teacher output; attn rl2 = |A - A_T|_F / |A_T|_F; row/col err =\n"
               "mean |row sum - 1|, mean |(Lk/Lq) col sum - 1| (averaged over problems).\n");
    rc = CLI_OK;
done:
    bk_asap_layer_free(&ly);
    bk_npy_free(&Q);
    bk_npy_free(&K);
    bk_npy_free(&V);
    bk_npy_free(&QL);
    bk_npy_free(&KL);
    free(buf);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* generate                                                                 */
/* ------------------------------------------------------------------------ */
static int cmd_generate(int argc, char **argv)
{
    const char *bs = NULL, *hs = NULL, *ns = NULL, *ds = NULL, *seed_s = NULL, *temp_s = NULL, *oq = NULL, *ok_ = NULL,
               *ov = NULL;
    const cli_opt opts[] = {{"--b", &bs, 0},     {"--h", &hs, 0},        {"--n", &ns, 0},
                            {"--d", &ds, 0},     {"--seed", &seed_s, 0}, {"--temp", &temp_s, 0},
                            {"--out-q", &oq, 0}, {"--out-k", &ok_, 0},   {"--out-v", &ov, 0}};
    int done = 0, rc0 = cli_parse_opts("asap generate", argc, argv, opts, 9, asap_usage, &done);
    if (rc0 != CLI_OK || done) return rc0;
    int B = 4, H = 2, N = 128, d = 32, seed = 1;
    float temp = 1.0f;
    if (!oq || !ok_ || !ov) {
        fprintf(stderr, "birkhoff asap generate: --out-q, --out-k and --out-v are required\n");
        return CLI_USAGE;
    }
    if ((bs && (!cli_parse_int(bs, &B) || B < 1)) || (hs && (!cli_parse_int(hs, &H) || H < 1)) ||
        (ns && (!cli_parse_int(ns, &N) || N < 1)) || (ds && (!cli_parse_int(ds, &d) || d < 1 || d > 4096)) ||
        (seed_s && (!cli_parse_int(seed_s, &seed) || seed < 0)) ||
        (temp_s && (!cli_parse_float(temp_s, &temp) || !(temp > 0))) || (int64_t)B * H * N * d > ((int64_t)1 << 31)) {
        fprintf(stderr, "birkhoff asap generate: sizes must be integers >= 1 (d <= 4096, B*H*N*d < 2^31), "
                        "--seed >= 0, --temp > 0\n");
        return CLI_USAGE;
    }
    size_t n = (size_t)B * H * N * d;
    float *Q = malloc(sizeof(float) * n), *K = malloc(sizeof(float) * n), *V = malloc(sizeof(float) * n);
    int rc = CLI_FAIL;
    if (Q && K && V && asap_synth(B, H, N, d, (uint64_t)seed, temp, Q, K, V)) {
        int64_t sh[4] = {B, H, N, d};
        const cli_output outs[3] = {{oq, 4, sh, Q}, {ok_, 4, sh, K}, {ov, 4, sh, V}};
        if (cli_write_outputs("asap generate", 3, outs)) rc = CLI_OK;
    } else {
        fprintf(stderr, "birkhoff asap generate: out of memory\n");
    }
    free(Q);
    free(K);
    free(V);
    return rc;
}

int cmd_asap(int argc, char **argv)
{
    if (argc < 2) {
        asap_usage(stderr);
        return CLI_USAGE;
    }
    const char *sub = argv[1];
    if (!strcmp(sub, "compile")) return asap_compile(argc - 1, argv + 1);
    if (!strcmp(sub, "calibrate")) return cmd_calibrate(argc - 1, argv + 1);
    if (!strcmp(sub, "report")) return cmd_report(argc - 1, argv + 1);
    if (!strcmp(sub, "show")) return cmd_show(argc - 1, argv + 1);
    if (!strcmp(sub, "generate")) return cmd_generate(argc - 1, argv + 1);
    if (!strcmp(sub, "--help") || !strcmp(sub, "-h") || !strcmp(sub, "help")) {
        asap_usage(stdout);
        return CLI_OK;
    }
    fprintf(stderr, "birkhoff asap: unknown subcommand '%s' (calibrate, report, show, generate)\n\n", sub);
    asap_usage(stderr);
    return CLI_USAGE;
}
