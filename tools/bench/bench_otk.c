/* bench_otk.c -- `birkhoff bench --op otk`: the OTK embedding (Nystrom map +
 * q plans + pooling), forward and forward+backward (gradients to x, z and W),
 * against the PyTorch port of the reference code (bench/peers/otk_torch.py
 * through torch_peer.py --op otk) measured in the same run on the same
 * threads. */
#include "../cli.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    int B, n, d, k, p, q, L;
} ocase;

static void otk_bench_usage(FILE *f)
{
    fprintf(f,
            "usage: birkhoff bench --op otk [--cases B:n:d:k:p:q:L,...] [--threads N] [--reps R]\n"
            "                      [--warmup W] [--eps E] [--domain log|scaling] [--no-peer] [--json]\n"
            "                      [--python PATH] [--peer-script PATH]\n"
            "B sets of n elements of dimension d, k Nystrom anchors (sigma 0.5, eta 0.01), q references of\n"
            "p supports, L Sinkhorn iterations (2 L half-steps; the peer's n_iter = L), eps 0.5, no mask.\n"
            "Default cases: the issue's n = 1000,\n"
            "d = 64, k = 128, p = 64, q = 1 and q = 4, B = 32, L = 10. The peer is the reference code's\n"
            "OTKernel + CKN Nystrom layer (scaling domain, autograd through every iteration).\n");
}

int bench_otk(int argc, char **argv)
{
    const char *cases = "32:1000:64:128:64:1:10,32:1000:64:128:64:4:10", *py = "/usr/bin/python3";
    const char *script = "bench/peers/torch_peer.py", *domain = "log";
    int nt = 2, reps = 11, warmup = 2, json = 0, peer = 1;
    float eps = 0.5f;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { otk_bench_usage(stdout); return CLI_OK; }
        else if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "--no-peer")) peer = 0;
        else if (val && !strcmp(a, "--op")) i++;
        else if (val && !strcmp(a, "--cases")) { cases = val; i++; }
        else if (val && !strcmp(a, "--python")) { py = val; i++; }
        else if (val && !strcmp(a, "--peer-script")) { script = val; i++; }
        else if (val && !strcmp(a, "--domain") && (!strcmp(val, "log") || !strcmp(val, "scaling"))) { domain = val; i++; }
        else if (val && !strcmp(a, "--eps") && cli_parse_float(val, &eps) && eps > 0) i++;
        else if (val && !strcmp(a, "--threads") && cli_parse_int(val, &nt) && nt >= 1 && nt <= 4096) i++;
        else if (val && !strcmp(a, "--reps") && cli_parse_int(val, &reps) && reps >= 1) i++;
        else if (val && !strcmp(a, "--warmup") && cli_parse_int(val, &warmup) && warmup >= 0) i++;
        else {
            fprintf(stderr, "birkhoff bench --op otk: bad option or value '%s'\n", a);
            otk_bench_usage(stderr);
            return CLI_USAGE;
        }
    }
    ocase cs[32];
    int tv[32 * 7];
    const int nc = cli_parse_tuples("bench --op otk", cases, 7, tv, 32, "B:n:d:k:p:q:L");
    if (nc < 0) return CLI_USAGE;
    for (int i = 0; i < nc; i++) {
        const int *t = tv + 7 * i;
        cs[i] = (ocase){t[0], t[1], t[2], t[3], t[4], t[5], t[6]};
    }
    bk_set_num_threads(nt);
    double gf, ge;
    cli_peak(nt, &gf, &ge);
    if (!json)
        printf("# OTK embedding, %d threads, eps %g, %s domain; machine peak %.0f GFLOP/s, %.1f Gexp/s (all threads)\n", nt,
               (double)eps, domain, gf, ge);
    if (!json)
        printf("%-28s %9s %9s %6s %9s %9s %6s %9s %9s %7s\n", "case B:n:d:k:p:q:L", "fwd ms", "peer ms", "ratio", "f+b ms",
               "peer ms", "ratio", "ours MiB", "peer MiB", "%peak");
    for (int ci = 0; ci < nc; ci++) {
        const ocase c = cs[ci];
        bk_otk_desc desc = {c.B, c.n, c.d, c.q, c.p, c.k, NULL};
        bk_otk_config p = bk_otk_config_default();
        p.eps = eps;
        p.iters = 2 * c.L; /* the case's L iterations (the peer's n_iter) = 2 L half-steps */
        p.domain = strcmp(domain, "log") ? BK_OTK_SCALING : BK_OTK_LOG;
        char what[96];
        snprintf(what, sizeof what, "case %d:%d:%d:%d:%d:%d:%d", c.B, c.n, c.d, c.k, c.p, c.q, c.L);
        /* (the sizes in double first: no size_t product below wraps) */
        if (!cli_fits_memory("bench --op otk", what,
                             8.0 * ((double)c.B * c.n * c.d + (double)c.q * c.p * c.k + (double)c.k * c.d +
                                    (double)c.B * c.p * c.q * c.k)))
            return CLI_FAIL;
        const size_t nx = (size_t)c.B * c.n * c.d, nz = (size_t)c.q * c.p * c.k, no = (size_t)c.B * c.p * c.q * c.k;
        float *x = malloc(nx * 4), *z = malloc(nz * 4), *W = malloc((size_t)c.k * c.d * 4), *o = malloc(no * 4);
        float *dout = malloc(no * 4), *dx = malloc(nx * 4), *dz = malloc(nz * 4), *dW = malloc((size_t)c.k * c.d * 4);
        if (!x || !z || !W || !o || !dout || !dx || !dz || !dW) {
            fprintf(stderr, "birkhoff bench --op otk: %s: out of memory\n", what);
            free(x); free(z); free(W); free(o); free(dout); free(dx); free(dz); free(dW);
            return CLI_FAIL;
        }
        cli_fill(x, nx, 1, 1.0f / sqrtf((float)c.d));
        cli_fill(z, nz, 2, 1.0f / sqrtf((float)c.p));
        cli_fill(dout, no, 4, 1.0f);
        cli_fill(W, (size_t)c.k * c.d, 3, 1.0f);
        for (int l = 0; l < c.k; l++) {
            double s = 0;
            for (int e = 0; e < c.d; e++) s += (double)W[(size_t)l * c.d + e] * W[(size_t)l * c.d + e];
            for (int e = 0; e < c.d; e++) W[(size_t)l * c.d + e] = (float)(W[(size_t)l * c.d + e] / sqrt(s));
        }
        p.W = W;
        const size_t wsb = bk_otk_workspace_size(&desc, &p), tpb = bk_otk_tape_size(&desc, &p);
        void *ws = malloc(wsb), *tape = malloc(tpb);
        double *tf = malloc(sizeof(double) * (size_t)reps), *tb = malloc(sizeof(double) * (size_t)reps);
        if (!ws || !tape || !tf || !tb) {
            fprintf(stderr, "birkhoff bench --op otk: %s: out of memory (workspace and tape: %zu bytes)\n", what,
                    wsb + tpb);
            free(x); free(z); free(W); free(o); free(dout); free(dx); free(dz); free(dW);
            free(ws); free(tape); free(tf); free(tb);
            return CLI_FAIL;
        }
        bk_tensor tx = bk_tensor_bhnd(x, 1, c.n, c.d), to = bk_tensor_bhnd(o, 1, c.p, c.q * c.k);
        bk_tensor tdo = bk_tensor_bhnd(dout, 1, c.p, c.q * c.k), tdx = bk_tensor_bhnd(dx, 1, c.n, c.d);
        bk_status s = BK_OK;
        for (int r = -warmup; r < reps && !s; r++) {
            double t0 = cli_now();
            s = bk_otk_forward(&desc, &p, &tx, z, &to, NULL, NULL, ws, wsb);
            double t1 = cli_now();
            if (!s) s = bk_otk_forward(&desc, &p, &tx, z, &to, tape, NULL, ws, wsb);
            if (!s) s = bk_otk_backward(&desc, &p, &tx, z, &tdo, tape, &tdx, dz, dW, ws, wsb);
            double t2 = cli_now();
            if (r >= 0) {
                tf[r] = t1 - t0;
                tb[r] = t2 - t1;
            }
        }
        if (s) {
            fprintf(stderr, "bench otk: %s\n", bk_last_error());
            return CLI_FAIL;
        }
        double f[3], fb[3];
        cli_stats(tf, reps, &f[0], &f[1], &f[2]);
        cli_stats(tb, reps, &fb[0], &fb[1], &fb[2]);
        /* work our kernels do (GEMM flops; exps: one per entry per Sinkhorn
         * iteration in the log domain, one per entry in the scaling domain) */
        const double B = c.B, n = c.n, d = c.d, k = c.k, P = c.p, q = c.q;
        const double ny = 2 * n * d * k + 2 * n * k * k, pl = q * 4 * n * P * k;
        const double flops_f = B * (ny + pl), flops_b = B * (ny + 2 * n * k * k * 2 + 4 * n * k * d + q * 10 * n * P * k);
        const double ex_plan = p.domain == BK_OTK_LOG ? c.L : 1;
        const double exps_f = B * (n * k + q * n * P * ex_plan), exps_b = B * (n * k + q * n * P * (2 * ex_plan + 1));
        const double frac = ((flops_f + flops_b) / (gf * 1e9) + (exps_f + exps_b) / (ge * 1e9)) / fb[0];
        double pf = NAN, pfb = NAN, prss = NAN;
        if (peer && access(script, R_OK) == 0) {
            char cmd[2048];
            snprintf(cmd, sizeof cmd,
                     "OMP_NUM_THREADS=%d OPENBLAS_NUM_THREADS=%d '%s' '%s' --op otk --cases %d:%d:%d --otk-k %d --otk-p %d "
                     "--otk-q %d --otk-eps %g --otk-iters %d --otk-sigma 0.5 --threads %d --reps %d --warmup %d --json",
                     nt, nt, py, script, c.B, c.n, c.d, c.k, c.p, c.q, (double)eps, c.L, nt, reps < 5 ? reps : 5,
                     warmup < 1 ? warmup : 1);
            FILE *pp = popen(cmd, "r");
            char line[8192];
            while (pp && fgets(line, sizeof line, pp))
                if (line[0] == '{') {
                    pf = cli_json_num(line, "fwd_median_s");
                    pfb = cli_json_num(line, "fwdbwd_median_s");
                    prss = cli_json_num(line, "peak_rss_delta_bytes");
                    if (!isfinite(prss)) prss = cli_json_num(line, "peak_rss_bytes");
                }
            if (!pp || pclose(pp) != 0) fprintf(stderr, "bench otk: the peer failed (is python3-torch installed?)\n");
        } else if (peer) {
            fprintf(stderr, "bench otk: peer script %s not found\n", script);
        }
        const double mib = (double)(wsb + tpb) / (1 << 20);
        if (json) {
            printf("{\"op\": \"otk\", \"B\": %d, \"n\": %d, \"d\": %d, \"k\": %d, \"p\": %d, \"q\": %d, \"L\": %d, \"eps\": %g, "
                   "\"domain\": \"%s\", \"threads\": %d, \"fwd_median_s\": %.6g, \"fwdbwd_median_s\": %.6g, "
                   "\"ws_tape_bytes\": %zu, \"frac_peak_fwdbwd\": %.4f",
                   c.B, c.n, c.d, c.k, c.p, c.q, c.L, (double)eps, domain, nt, f[0], fb[0], wsb + tpb, frac);
            if (isfinite(pf) && isfinite(pfb))
                printf(", \"peer_fwd_median_s\": %.6g, \"peer_fwdbwd_median_s\": %.6g, \"peer_peak_rss_delta_bytes\": %.0f, "
                       "\"ratio_fwd\": %.4f, \"ratio_fwdbwd\": %.4f",
                       pf, pfb, prss, f[0] / pf, fb[0] / pfb);
            printf("}\n");
        } else {
            char name[64];
            snprintf(name, sizeof name, "%d:%d:%d:%d:%d:%d:%d", c.B, c.n, c.d, c.k, c.p, c.q, c.L);
            printf("%-28s %9.2f %9.2f %6.3f %9.2f %9.2f %6.3f %9.1f %9.1f %6.1f%%\n", name, f[0] * 1e3, pf * 1e3, f[0] / pf,
                   fb[0] * 1e3, pfb * 1e3, fb[0] / pfb, mib, prss / (1 << 20), 100 * frac);
        }
        fflush(stdout);
        free(x); free(z); free(W); free(o); free(dout); free(dx); free(dz); free(dW); free(ws); free(tape); free(tf); free(tb);
    }
    if (!json)
        printf("ratio = ours / peer (lower is better); f+b = forward with tape + backward to x, z, W.\n"
               "ours MiB = workspace + tape (independent of L except O(L (n + p)) potentials per plan);\n"
               "peer MiB = peak RSS growth of the peer's forward+backward (autograd keeps every iteration).\n"
               "%%peak = (GEMM flops / FMA peak + exps / exp peak) / f+b time, with the work our kernels do.\n");
    return CLI_OK;
}
