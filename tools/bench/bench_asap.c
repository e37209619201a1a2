/* bench_asap.c -- `birkhoff bench --op asap`: the paper's frozen-layer
 * benchmark in our setting. Per case, a Sinkhorn teacher (S half-steps) is
 * compiled by ASAP-LS on calibration inputs, then on the same held-out Q, K, V
 * the teacher, ASAP (the teacher's ending), ASAP-0 and Sinkhorn S = 3 and 5
 * are timed and compared with the teacher (fidelity); the PyTorch peer
 * (torch_peer.py --op asap) times the same methods in PyTorch on the same
 * threads. Inputs are the structured synthetic generator of `asap generate`. */
#include "../cli.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    int H, N, d;
} acase;

static void asap_bench_usage(FILE *f)
{
    fprintf(f,
            "usage: birkhoff bench --op asap [--cases H:N:d,...] [--teacher-iters S] [--slices L]\n"
            "                      [--calib C] [--temp t] [--threads N] [--reps R] [--warmup W]\n"
            "                      [--no-peer] [--json] [--python PATH] [--peer-script PATH]\n"
            "B = 1, H heads of N tokens, head dim d (dv = d), structured synthetic inputs (`birkhoff asap\n"
            "generate`; --temp scales the scores, default 1). The teacher (default S = 20, eps = 1) is\n"
            "compiled with ASAP-LS (default L = 32, lambda 1e-3) on C calibration batches of the same\n"
            "shape (default: 8 at N <= 1024, 2 above); then teacher, ASAP, ASAP-0 and Sinkhorn S = 3, 5\n"
            "are timed (median of R forwards, no attention output) and compared with the teacher.\n"
            "Default cases: 8:512:64, 2:1024:64, 2:2048:64, 1:4096:64, 1:8192:64.\n");
}

enum { M_TEACHER, M_ASAP, M_ASAP0, M_S3, M_S5, NMETH };
static const char *mname[NMETH] = {"teacher", "asap", "asap0", "sinkhorn3", "sinkhorn5"};

/* one forward of method m; attn (nullable data) for the fidelity run */
static bk_status run_method(int m, const bk_attn_desc *d, const bk_asap_layer *ly, const bk_tensor *q,
                            const bk_tensor *k, const bk_tensor *v, const bk_tensor *o, bk_tensor attn, void *ws,
                            size_t wsb)
{
    if (m == M_ASAP || m == M_ASAP0) {
        bk_asap_extras ex = {attn, NULL, NULL};
        return bk_asap_forward(d, ly, m == M_ASAP ? BK_ASAP_AUTO : BK_ASAP_ZERO, q, k, v, o, attn.data ? &ex : NULL,
                               ws, wsb);
    }
    bk_sinkhorn_config sp = bk_sinkhorn_config_default();
    sp.iters = m == M_TEACHER ? ly->teacher_iters : m == M_S3 ? 3 : 5;
    sp.eps = ly->eps;
    sp.scale = ly->scale;
    bk_sinkhorn_extras ex = {attn, NULL, NULL, NULL};
    return bk_sinkhorn_forward(d, &sp, q, k, v, o, NULL, attn.data ? &ex : NULL, ws, wsb);
}

int bench_asap(int argc, char **argv)
{
    const char *cases = "8:512:64,2:1024:64,2:2048:64,1:4096:64,1:8192:64", *py = "/usr/bin/python3";
    const char *script = "bench/peers/torch_peer.py";
    int nt = 2, reps = 5, warmup = 1, json = 0, peer = 1, S = 20, L = 32, calib = 0;
    float temp = 1.0f;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { asap_bench_usage(stdout); return CLI_OK; }
        else if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "--no-peer")) peer = 0;
        else if (val && !strcmp(a, "--op")) i++;
        else if (val && !strcmp(a, "--cases")) { cases = val; i++; }
        else if (val && !strcmp(a, "--python")) { py = val; i++; }
        else if (val && !strcmp(a, "--peer-script")) { script = val; i++; }
        else if (val && !strcmp(a, "--teacher-iters") && cli_parse_int(val, &S) && S >= 2) i++;
        else if (val && !strcmp(a, "--slices") && cli_parse_int(val, &L) && L >= 1) i++;
        else if (val && !strcmp(a, "--calib") && cli_parse_int(val, &calib) && calib >= 1) i++;
        else if (val && !strcmp(a, "--temp") && cli_parse_float(val, &temp) && temp > 0) i++;
        else if (val && !strcmp(a, "--threads") && cli_parse_int(val, &nt) && nt >= 1 && nt <= 4096) i++;
        else if (val && !strcmp(a, "--reps") && cli_parse_int(val, &reps) && reps >= 1) i++;
        else if (val && !strcmp(a, "--warmup") && cli_parse_int(val, &warmup) && warmup >= 0) i++;
        else {
            fprintf(stderr, "birkhoff bench --op asap: bad option or value '%s'\n", a);
            asap_bench_usage(stderr);
            return CLI_USAGE;
        }
    }
    acase cs[32];
    int cv[32 * 3];
    const int nc = cli_parse_tuples("bench --op asap", cases, 3, cv, 32, "H:N:d");
    if (nc < 0) return CLI_USAGE;
    for (int i = 0; i < nc; i++) {
        cs[i] = (acase){cv[3 * i], cv[3 * i + 1], cv[3 * i + 2]};
        if (cs[i].d > 4096) {
            fprintf(stderr, "birkhoff bench --op asap: d must be <= 4096\n");
            return CLI_USAGE;
        }
    }
    bk_set_num_threads(nt);
    double gf, ge;
    cli_peak(nt, &gf, &ge);
    if (!json)
        printf("# ASAP frozen-layer benchmark: teacher S = %d, eps 1, L = %d (LS, lambda 1e-3), %d threads, "
               "structured synthetic inputs (temp %g); machine peak %.0f GFLOP/s, %.1f Gexp/s\n", S, L, nt,
               (double)temp, gf, ge);
    for (int ci = 0; ci < nc; ci++) {
        const acase c = cs[ci];
        const int H = c.H, N = c.N, d = c.d, C = calib ? calib : (N <= 1024 ? 8 : 2);
        char what[64];
        snprintf(what, sizeof what, "case %d:%d:%d", H, N, d);
        if (!cli_fits_memory("bench --op asap", what, 20.0 * H * N * d + 8.0 * H * N * N)) /* (before size_t wraps) */
            return CLI_FAIL;
        const size_t n = (size_t)H * N * d, na = (size_t)H * N * N;
        float *Q = malloc(n * 4), *K = malloc(n * 4), *V = malloc(n * 4), *O = malloc(n * 4), *Ot = malloc(n * 4);
        float *A = malloc(na * 4), *At = malloc(na * 4);
        if (!Q || !K || !V || !O || !Ot || !A || !At) {
            fprintf(stderr, "bench asap: out of memory at N = %d\n", N);
            return CLI_FAIL;
        }
        /* calibration: C batches from other seeds, streamed one at a time */
        bk_asap_config cfg = bk_asap_config_default(d);
        cfg.slices = L;
        cfg.teacher_iters = S;
        bk_asap_calib *cal = NULL;
        bk_asap_layer ly;
        bk_asap_fit_report rep;
        bk_attn_desc desc = {1, H, N, N, d, d, NULL, NULL};
        bk_tensor tq = bk_tensor_bhnd(Q, H, N, d), tk = bk_tensor_bhnd(K, H, N, d), tv = bk_tensor_bhnd(V, H, N, d);
        double t0 = cli_now();
        if (bk_asap_calib_create(&cfg, 0, &cal) != BK_OK) {
            fprintf(stderr, "bench asap: %s\n", bk_last_error());
            return CLI_FAIL;
        }
        for (int b = 0; b < C; b++) {
            asap_synth(1, H, N, d, 1000 + (uint64_t)b, temp, Q, K, V);
            if (bk_asap_calib_add(cal, &desc, &tq, &tk) != BK_OK) {
                fprintf(stderr, "bench asap: %s\n", bk_last_error());
                return CLI_FAIL;
            }
        }
        if (bk_asap_calib_fit(cal, BK_ASAP_FIT_LS, NULL, &ly, &rep) != BK_OK) {
            fprintf(stderr, "bench asap: %s\n", bk_last_error());
            return CLI_FAIL;
        }
        bk_asap_calib_free(cal);
        const double compile_s = cli_now() - t0;
        /* held-out inputs */
        asap_synth(1, H, N, d, 1, temp, Q, K, V);
        size_t wsb = bk_asap_workspace_size(&desc, &ly);
        bk_sinkhorn_config spw = bk_sinkhorn_config_default();
        spw.iters = S;
        size_t w2 = bk_sinkhorn_workspace_size(&desc, &spw);
        if (w2 > wsb) wsb = w2;
        void *ws = malloc(wsb);
        double *ts = malloc(sizeof(double) * (size_t)reps);
        double med[NMETH], q25[NMETH], q75[NMETH];
        bk_attn_fidelity fd[NMETH];
        bk_tensor tO = bk_tensor_bhnd(O, H, N, d), tOt = bk_tensor_bhnd(Ot, H, N, d);
        bk_tensor tA = bk_tensor_bhnd(A, H, N, N), tAt = bk_tensor_bhnd(At, H, N, N), none = {0};
        if (!ws || !ts) return CLI_FAIL;
        for (int m = 0; m < NMETH; m++) {
            bk_status s = BK_OK;
            for (int r = -warmup; r < reps && !s; r++) {
                double t = cli_now();
                s = run_method(m, &desc, &ly, &tq, &tk, &tv, m == M_TEACHER ? &tOt : &tO, none, ws, wsb);
                if (r >= 0) ts[r] = cli_now() - t;
            }
            /* fidelity run (with the attention) */
            if (!s) s = run_method(m, &desc, &ly, &tq, &tk, &tv, m == M_TEACHER ? &tOt : &tO, m == M_TEACHER ? tAt : tA, ws, wsb);
            if (!s && m != M_TEACHER) s = bk_attn_compare(&desc, &tO, &tOt, &tA, &tAt, &fd[m]);
            if (s) {
                fprintf(stderr, "bench asap: %s\n", bk_last_error());
                return CLI_FAIL;
            }
            cli_stats(ts, reps, &med[m], &q25[m], &q75[m]);
        }
        /* fraction of the machine's limit: GEMM flops at FMA peak + exps at exp
         * peak (the engine does one exp per entry per pass, a pass being a row
         * step fused with the next column step) */
        double frac[NMETH];
        {
            const double nn = (double)N * N, g = H * 2.0 * nn * (2.0 * d), fe = H * 4.0 * L * N * d;
            const double passes[NMETH] = {(S + 1) / 2, S % 2 == 0 ? 2 : 1, 1, 2, 3};
            for (int m = 0; m < NMETH; m++) {
                double fl = g + (m == M_ASAP || m == M_ASAP0 ? fe : 0), ex = H * passes[m] * nn;
                frac[m] = (fl / (gf * 1e9) + ex / (ge * 1e9)) / med[m];
            }
        }
        /* the PyTorch peer: the same methods in PyTorch */
        double pm[NMETH];
        for (int m = 0; m < NMETH; m++) pm[m] = NAN;
        if (peer && access(script, R_OK) == 0) {
            char cmd[2048];
            snprintf(cmd, sizeof cmd,
                     "OMP_NUM_THREADS=%d OPENBLAS_NUM_THREADS=%d '%s' '%s' --op asap --cases %d:%d:%d:%d --asap-slices %d --threads %d "
                     "--reps %d --warmup %d --json",
                     nt, nt, py, script, H, N, d, S, L, nt, reps < 3 ? reps : 3, warmup < 1 ? warmup : 1);
            FILE *pp = popen(cmd, "r");
            char line[16384];
            while (pp && fgets(line, sizeof line, pp))
                if (line[0] == '{') {
                    char key[64];
                    for (int m = 0; m < NMETH; m++) {
                        snprintf(key, sizeof key, "%s_median_s", mname[m]);
                        pm[m] = cli_json_num(line, key);
                    }
                }
            if (!pp || pclose(pp) != 0) fprintf(stderr, "bench asap: the peer failed (is python3-torch installed?)\n");
        } else if (peer) {
            fprintf(stderr, "bench asap: peer script %s not found\n", script);
        }
        if (json) {
            for (int m = 0; m < NMETH; m++) {
                printf("{\"op\": \"asap\", \"method\": \"%s\", \"H\": %d, \"N\": %d, \"d\": %d, \"S\": %d, \"L\": %d, "
                       "\"threads\": %d, \"calib_batches\": %d, \"compile_s\": %.4f, \"ls_r2\": %.6f, "
                       "\"median_s\": %.6g, \"q25_s\": %.6g, \"q75_s\": %.6g, \"speedup_vs_teacher\": %.4f, "
                       "\"frac_peak\": %.4f",
                       mname[m], H, N, d, S, L, nt, C, compile_s, rep.ls_r2, med[m], q25[m], q75[m],
                       med[M_TEACHER] / med[m], frac[m]);
                if (m != M_TEACHER)
                    printf(", \"out_rmse\": %.6g, \"out_rel_rmse\": %.6g, \"attn_rel_l2\": %.6g, \"row_err\": %.6g, "
                           "\"col_err\": %.6g",
                           fd[m].out_rmse, fd[m].out_rmse / fd[m].out_rms, fd[m].attn_rel_l2, fd[m].row_err,
                           fd[m].col_err);
                if (isfinite(pm[m]))
                    printf(", \"peer_median_s\": %.6g, \"peer_teacher_median_s\": %.6g", pm[m], pm[M_TEACHER]);
                printf("}\n");
            }
        } else {
            printf("\ncase H=%d N=%d d=%d: compile (teacher + features + LS on %d batches) %.2f s, LS R^2 %.4f\n", H,
                   N, d, C, compile_s, rep.ls_r2);
            printf("  %-10s %10s %8s %6s %10s %8s | %9s %9s %9s %9s\n", "method", "ms", "speedup", "%peak", "peer ms",
                   "peer x", "rel RMSE", "attn rl2", "row err", "col err");
            for (int m = 0; m < NMETH; m++) {
                printf("  %-10s %10.3f %7.2fx %5.1f%% %10.2f %7.2fx", mname[m], med[m] * 1e3, med[M_TEACHER] / med[m],
                       100 * frac[m], pm[m] * 1e3, pm[M_TEACHER] / med[m]);
                if (m == M_TEACHER) printf(" | %9s %9s %9s %9s\n", "-", "-", "-", "-");
                else
                    printf(" | %9.3g %9.3g %9.3g %9.3g\n", fd[m].out_rmse / fd[m].out_rms, fd[m].attn_rel_l2,
                           fd[m].row_err, fd[m].col_err);
            }
        }
        fflush(stdout);
        bk_asap_layer_free(&ly);
        free(Q); free(K); free(V); free(O); free(Ot); free(A); free(At); free(ws); free(ts);
    }
    if (!json)
        printf("\nspeedup = our teacher time / method time; peer ms = the same method in PyTorch (same threads);\n"
               "peer x = the PyTorch teacher's time / our method's time. rel RMSE = output RMSE / RMS of the\n"
               "teacher output; attn rl2 = |A - A_T|_F / |A_T|_F; row/col err = mean |sum - 1|.\n"
               "%%peak = (GEMM flops / FMA peak + exps / exp peak) / time, with the work our kernels do.\n");
    return CLI_OK;
}
