/* bench.c -- `birkhoff bench`: operators over a shape grid, forward and
 * forward+backward, median and quartiles of many repetitions, memory, the
 * fraction of the machine's measured peak, and the ratio to the PyTorch peer
 * (bench/peers/torch_peer.py) measured in the same run on the same threads. */
#include "../cli.h"

#include <cblas.h>
#include <errno.h>
#include <pthread.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The cases are the registry's (every operator's bench cases, bk_op_bench_info):
 * an operator registered in src/ops/registry.c with bench cases is benched with
 * no edit here. A case's label is the operator's name, or "NAME-TAG" for a
 * tagged variant ("esp-hard"). What this file knows of particular labels is
 * the bench's own model of them: the PyTorch peer that runs each
 * (bench/peers/torch_peer.py), and the work counts of docs/PERFORMANCE.md. */
typedef struct {
    const bk_op *op;
    char label[48];
    char params[256];   /* key=value,... over the operator's defaults */
    int BH, N, d, S;    /* S: the case's half-steps (its iters), 1 without */
} bcase;

/* the peer script's operators, by label */
static const char *peer_of(const char *label)
{
    static const char *const map[][2] = {{"softmax", "softmax"}, {"sinkhorn", "sinkhorn"}, {"esp", "esp"},
                                         {"esp-sq", "esp"},         {"esp-hard", "esp"},          {"lot", "lot"}};
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (!strcmp(map[i][0], label)) return map[i][1];
    return "";
}

static int is_label(const bcase *c, const char *label) { return !strcmp(c->label, label); }
#define LOT_R 32 /* the bench's LOT (its registry cases): r = 32 pivots, T = 5, eps = 1, temp = 0.5 */

typedef struct {
    double fwd[3], fb[3];   /* median, p25, p75 (s) */
    double base[3];         /* softmax: 2 GEMMs + one exp pass */
    size_t ws_bytes, tape_bytes;
    double peer_fwd, peer_fb, peer_saved, peer_rss;
    int have_peer;
    double flops_f, flops_b, exps_f, exps_b; /* work per head; 0 = not counted */
    double bytes_f, bytes_b;                 /* memory traffic per head (model); 0 = none */
} bresult;

static void labels_text(char *buf, size_t cap);

static void bench_usage(FILE *f)
{
    char labels[512];
    labels_text(labels, sizeof labels);
    fprintf(f,
            "usage: birkhoff bench [options]\n"
            "\n"
            "Times the registered attention operators (B=1, H=BH, [B,H,N,d], d=dv) and, where one exists,\n"
            "the PyTorch port of the reference code on the same threads, in the same run. Prints per case:\n"
            "median and quartiles of forward and forward+backward, our/peer time ratios, memory (our\n"
            "workspace + tape vs the tensors the peer's autograd saves), and the fraction of the machine's\n"
            "measured peak.\n"
            "\n"
            "options:\n"
            "  --op LABEL|all              the registered operators' bench cases (default all):\n"
            "                              %s\n"
            "  --op otk                    the OTK embedding (its own options: bench --op otk --help)\n"
            "  --op asap                   ASAP's frozen-layer benchmark (bench --op asap --help)\n"
            "                              lot: r = 32 pivots, T = 5, eps = 1, temp = 0.5 (the peer's\n"
            "                              settings; its peer runs for N <= 4096)\n"
            "                              esp: soft sort with the reference's semantics (Euclidean cost,\n"
            "                              t = 1e-3, tau = 10 N); esp-sq: soft sort, squared cost (paper);\n"
            "                              esp-hard: exact sort (inference). Their peer is the reference's\n"
            "                              soft-sort ESP (run for N <= 1024).\n"
            "  --cases BH:N:d:S,...        (default: the targets of docs/PERFORMANCE.md)\n"
            "  --threads T                 (default 2)\n"
            "  --load N                    run beside N busy single-threaded processes of its own\n"
            "  --load-job N                run beside N multi-threaded birkhoff jobs of its own (Sinkhorn\n"
            "                              f+b, B*H = 4, N = 1024, all cores); both work with every --op\n"
            "  --reps R --warmup W         (default 21 and 3)\n"
            "  --json                      one JSON object per case\n"
            "  --no-peer                   skip the PyTorch peer\n"
            "  --python PATH               interpreter for the peer (default /usr/bin/python3)\n"
            "  --peer-script PATH          (default bench/peers/torch_peer.py)\n"
            "  --peer-max-n N              largest N the ESP peer runs at (default 512: at N = 1024 the\n"
            "                              reference needs ~15 GB and minutes per call)\n",
            labels);
}

/* a case's half-steps: its iters, 1 without */
static int case_iters(const bcase *c)
{
    int S = 1;
    for (const char *p = strstr(c->params, "iters="); p; p = strstr(p + 1, "iters="))
        if (p == c->params || p[-1] == ',') S = atoi(p + 6); /* the last one counts */
    return S;
}

/* --cases "BH:N:d[:S],..." over a template case of the label (its
 * parameters; S sets iters where the operator has it) */
static int parse_cases(const char *s, const bcase *tmpl, bcase *out, int max)
{
    int n = 0;
    const char *p = s;
    while (*p && n < max) {
        bcase c = *tmpl;
        /* BH:N:d[:S], each in [1, 2^31) (strtol: sscanf's %d overflows silently) */
        int f[4] = {0, 0, 0, 0}, k = 0;
        for (; k < 4; k++) {
            char *end;
            errno = 0;
            long v = strtol(p, &end, 10);
            if (end == p || errno || v < 1 || v > 2147483647L || *p == ' ' || *p == '+') return -1;
            f[k] = (int)v;
            p = end;
            if (*p != ':') break;
            p++;
        }
        if (k < 2 || k > 3) return -1;
        c.BH = f[0]; c.N = f[1]; c.d = f[2];
        if (k == 3 && bk_op_param_find(c.op, "iters") >= 0) {
            size_t len = strlen(c.params);
            snprintf(c.params + len, sizeof c.params - len, "%siters=%d", len ? "," : "", f[3]);
        }
        c.S = case_iters(&c);
        out[n++] = c;
        if (*p == ',') p++;
        else if (*p) return -1;
    }
    return n;
}

static void fill(float *x, size_t n, unsigned seed) { cli_fill(x, n, seed, 1.0f); }

/* The baselines' own threads: nt - 1 threads started for the call and
 * joined (plain pthreads, so that no runtime's threads spin after a
 * baseline into the next timed run of ours); fn(arg, t, nt) on each. */
typedef struct {
    void (*fn)(void *arg, int t, int nt);
    void *arg;
    int t, nt;
} fj_member;

static void *fj_main(void *p)
{
    fj_member *m = p;
    m->fn(m->arg, m->t, m->nt);
    return NULL;
}

static void fork_join(int nt, void (*fn)(void *arg, int t, int nt), void *arg)
{
    enum { MAXT = 256 };
    nt = nt < 1 ? 1 : nt > MAXT ? MAXT : nt;
    pthread_t th[MAXT];
    fj_member m[MAXT];
    int started[MAXT] = {0};
    for (int t = 1; t < nt; t++) {
        m[t] = (fj_member){fn, arg, t, nt};
        started[t] = pthread_create(&th[t], NULL, fj_main, &m[t]) == 0;
        if (!started[t]) fn(arg, t, nt); /* no thread: this member's share here */
    }
    fn(arg, 0, nt);
    for (int t = 1; t < nt; t++)
        if (started[t]) pthread_join(th[t], NULL);
}

typedef struct {
    const bcase *c;
    const float *q, *k, *v;
    float *o, *C;
} softmax_base;

/* heads t, t + nt, ... on member t, its own N x N scratch */
static void softmax_base_member(void *arg, int t, int nt)
{
    const softmax_base *a = arg;
    const int N = a->c->N, d = a->c->d;
    float *Ch = a->C + (size_t)t * N * N;
    for (int h = t; h < a->c->BH; h += nt) {
        const size_t off = (size_t)h * N * d;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, N, d, 0.125f, a->q + off, d, a->k + off, d, 0.0f, Ch, N);
        bk_vexp(Ch, (size_t)N * N);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, d, N, 1.0f, Ch, N, a->v + off, d, 0.0f, a->o + off, d);
    }
}

static double time_softmax_baseline(const bcase *c, const float *q, const float *k, const float *v, float *o,
                                    float *C, int nt)
{
    softmax_base a = {c, q, k, v, o, C};
    double t0 = cli_now();
    fork_join(nt, softmax_base_member, &a);
    return cli_now() - t0;
}

/* work per head our kernels do (docs/PERFORMANCE.md): GEMM flops, exps */
static void work_counts(const bcase *c, bresult *r)
{
    double N = c->N, N2 = N * N, d = c->d, L = c->d, S = c->S;
    r->flops_f = r->flops_b = r->exps_f = r->exps_b = 0;
    if (is_label(c, "softmax") || is_label(c, "sinkhorn")) {
        r->flops_f = 4 * N2 * d; r->exps_f = N2 * ((c->S + 1) / 2);
        r->flops_b = 10 * N2 * d; r->exps_b = N2 * (1 + c->S / 2);
        (void)S;
    } else if (is_label(c, "esp-sq")) { /* per slice: fwd 4 GEMMs, bwd 13, each 2 N^2 d */
        r->flops_f = L * 4 * 2 * N2 * d; r->exps_f = L * 2 * N2;
        r->flops_b = L * 13 * 2 * N2 * d; r->exps_b = L * 4 * N2;
    } else if (is_label(c, "esp")) { /* per slice: fwd U (2 N^3) + O (2 N^2 d); bwd U twice, dP, dM (2 N^3 each) + dV */
        r->flops_f = L * (2 * N2 * N + 2 * N2 * d); r->exps_f = L * 2 * N2;
        r->flops_b = L * (4 * 2 * N2 * N + 2 * N2 * d); r->exps_b = L * 4 * N2;
    } else if (is_label(c, "lot")) { /* per head: GEMMs of N x r x d, two inner problems of N x r */
        double R = LOT_R;
        r->flops_f = 4 * N * R * (d + d); r->exps_f = 2 * 3 * N * R;
        r->flops_b = 2 * N * R * (6 * d + 5 * d); r->exps_b = 2 * 3 * N * R;
        /* floats each pass reads and writes (docs/PERFORMANCE.md, "Memory traffic"):
         * forward 4 N d (q, k, v read by the GEMMs, O written; LOT checks their
         * values in its products, not by a scan) + 12 N r (the logits written, 3 row
         * passes and a plan write per inner problem, the plans read by the products);
         * backward 11 N d + 41 N r */
        r->bytes_f = 4 * (4 * N * d + 12 * N * R);
        r->bytes_b = 4 * (11 * N * d + 41 * N * R);
    } else if (is_label(c, "esp-hard")) { /* sorting and row gathers, not flops (d = dv, L = d slices) */
        /* forward: one gathered partner row per slice and query in each of the cost and
         * output passes, 2 L radix sorts of ~23 N words, 4 N words of orders per slice,
         * 11 N d of input scans, projections and the copy of V gathered from; backward:
         * 3 gather passes (dO, K, Q rows), 6 N words of orders per slice, 14 N d of
         * streams (the copy of dO included) */
        r->bytes_f = 4 * (L * N * (2 * d + 2) + 2 * L * 23 * N + 4 * L * N + 11 * N * d);
        r->bytes_b = 4 * (L * N * (3 * d + 3) + 6 * L * N + 14 * N * d);
    }
}

typedef struct {
    float *a, *b, *c;
    size_t n;
    float sc;
    int init;
} triad;

static void triad_member(void *arg, int t, int nt)
{
    const triad *r = arg;
    const size_t i0 = r->n * (size_t)t / (size_t)nt, i1 = r->n * (size_t)(t + 1) / (size_t)nt;
    if (r->init)
        for (size_t i = i0; i < i1; i++) r->a[i] = r->b[i] = r->c[i] = (float)(i & 255);
    else
        for (size_t i = i0; i < i1; i++) r->a[i] = r->b[i] + r->sc * r->c[i];
}

/* Memory bandwidth of nt threads: the best of several passes of a[i] = b[i] +
 * s c[i] over three 256 MiB arrays (beyond the last-level caches: the VMs here
 * report up to 480 MiB of L3), counted as STREAM counts it (12 bytes per
 * element). Bytes/s. */
static double mem_bandwidth(int nt)
{
    const size_t n = (size_t)64 << 20;
    float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float)), *c = malloc(n * sizeof(float));
    double best = 0.0;
    if (a && b && c) {
        triad r = {a, b, c, n, 1.0f, 1};
        fork_join(nt, triad_member, &r); /* each thread first-touches its own part */
        r.init = 0;
        for (int rep = 0; rep < 6; rep++) {
            r.sc = 1.0f + 1e-3f * (float)rep;
            const double t0 = cli_now();
            fork_join(nt, triad_member, &r);
            const double t = cli_now() - t0, bw = 12.0 * (double)n / t;
            best = bw > best ? bw : best;
        }
    }
    free(a), free(b), free(c);
    return best;
}

/* The memory of a case beyond the operator's workspace and tape (its eight
 * [BH, N, d] tensors, the softmax baseline's nt N x N scores), in double (no
 * size_t product wraps), and whether it and `more` bytes fit in this
 * machine's physical memory; if not, says so (the case would be killed by
 * the kernel, or wrap its sizes, long before it ran). */
static int case_fits(const bcase *c, int nt, double more)
{
    char what[96];
    snprintf(what, sizeof what, "case %s %d:%d:%d", c->label, c->BH, c->N, c->d);
    return cli_fits_memory("bench", what,
                           32.0 * c->BH * c->N * c->d + (is_label(c, "softmax") ? 4.0 * nt * c->N * c->N : 0.0) + more);
}

/* The case's parameters over the operator's defaults, and its input arrays
 * (required inputs filled with reproducible values of std 1/sqrt(d), as the
 * LOT peer draws its pivots; *in holds them). 0 after a message. */
static int case_params(const bcase *c, const bk_attn_desc *desc, void *par, float **in)
{
    bk_op_config_default(c->op, par);
    if (bk_op_config_parse(c->op, par, c->params) != BK_OK) {
        fprintf(stderr, "birkhoff bench: case %s: %s\n", c->label, bk_last_error());
        return 0;
    }
    for (int i = 0; i < bk_op_array_count(c->op); i++) {
        bk_op_array a;
        int64_t dims[4];
        if (bk_op_array_info(c->op, i, &a) || !(a.kind & BK_OP_ARRAY_REQUIRED)) continue;
        const int rank = bk_op_array_shape(c->op, i, desc, par, dims);
        size_t n = 1;
        for (int j = 0; j < rank; j++) n *= (size_t)dims[j];
        if (rank < 1 || !(in[i] = malloc(sizeof(float) * n))) {
            fprintf(stderr, "birkhoff bench: case %s: cannot make its input %s\n", c->label, a.name);
            return 0;
        }
        fill(in[i], n, 5u + (unsigned)i);
        for (size_t j = 0; j < n; j++) in[i][j] /= sqrtf((float)desc->d);
        if (bk_op_config_set_array(c->op, par, desc, i, in[i], rank, dims) != BK_OK) {
            fprintf(stderr, "birkhoff bench: case %s: %s\n", c->label, bk_last_error());
            return 0;
        }
    }
    return 1;
}

typedef struct {
    const bcase *c;
    const bk_attn_desc *desc;
    const void *par;
    bk_tensor q, k, v, o, dout, dq, dk, dv;
    void *ws, *tape;
    size_t ws_bytes;
} brun;

/* the forward without a tape, then the forward with one and the backward */
static bk_status time_once(const brun *x, double *tf, double *tb)
{
    double t0 = cli_now();
    bk_status s = bk_op_forward(x->c->op, x->desc, x->par, &x->q, &x->k, &x->v, &x->o, NULL, NULL, x->ws, x->ws_bytes);
    double t1 = cli_now();
    if (s) return s;
    s = bk_op_forward(x->c->op, x->desc, x->par, &x->q, &x->k, &x->v, &x->o, x->tape, NULL, x->ws, x->ws_bytes);
    if (!s && bk_op_has_backward(x->c->op))
        s = bk_op_backward(x->c->op, x->desc, x->par, &x->q, &x->k, &x->v, &x->dout, x->tape, &x->dq, &x->dk, &x->dv,
                           x->ws, x->ws_bytes);
    *tf = t1 - t0;
    *tb = cli_now() - t1;
    return s;
}

static int run_ours(const bcase *c, int reps, int warmup, int nt, bresult *r)
{
    const int BH = c->BH, N = c->N, d = c->d;
    if (!case_fits(c, nt, 0.0)) return 0;
    const size_t n = (size_t)BH * N * d;
    /* the tensors as docs/PERFORMANCE.md recommends too (bk_alloc: 64-byte
     * aligned, huge pages advised for large ones) */
    float *q = bk_alloc(n * 4), *k = bk_alloc(n * 4), *v = bk_alloc(n * 4), *o = bk_alloc(n * 4),
          *dout = bk_alloc(n * 4);
    float *dq = bk_alloc(n * 4), *dk = bk_alloc(n * 4), *dv = bk_alloc(n * 4);
    if (q && k && v && dout) {
        fill(q, n, 1); fill(k, n, 2); fill(v, n, 3); fill(dout, n, 4);
    }
    bk_attn_desc desc = {1, BH, N, N, d, d, NULL, NULL};
    void *par = calloc(1, bk_op_config_size(c->op) + 1);
    float *in[16] = {NULL};
    int ok = par && bk_op_array_count(c->op) <= 16 && case_params(c, &desc, par, in);
    r->ws_bytes = ok ? bk_op_workspace_size(c->op, &desc, par) : 0;
    r->tape_bytes = ok ? bk_op_tape_size(c->op, &desc, par) : 0;
    work_counts(c, r);
    const int fits = ok && case_fits(c, nt, (double)r->ws_bytes + (double)r->tape_bytes);
    void *ws = fits ? bk_alloc(r->ws_bytes) : NULL, *tape = fits ? bk_alloc(r->tape_bytes) : NULL;
    float *C = is_label(c, "softmax") ? malloc(sizeof(float) * (size_t)nt * N * N) : NULL;
    const brun x = {c, &desc, par, bk_tensor_bhnd(q, BH, N, d), bk_tensor_bhnd(k, BH, N, d),
                    bk_tensor_bhnd(v, BH, N, d), bk_tensor_bhnd(o, BH, N, d), bk_tensor_bhnd(dout, BH, N, d),
                    bk_tensor_bhnd(dq, BH, N, d), bk_tensor_bhnd(dk, BH, N, d), bk_tensor_bhnd(dv, BH, N, d),
                    ws, tape, r->ws_bytes};
    double *tf = malloc(sizeof(double) * reps), *tb = malloc(sizeof(double) * reps), *tbase = malloc(sizeof(double) * reps);
    ok = ok && q && k && v && o && dout && dq && dk && dv && ws && tape && (C || !is_label(c, "softmax")) && tf && tb &&
         tbase;
    bk_status s = BK_OK;
    for (int rep = -warmup; ok && rep < reps; rep++) {
        double t_f, t_b;
        if ((s = time_once(&x, &t_f, &t_b))) break;
        double base = is_label(c, "softmax") ? time_softmax_baseline(c, q, k, v, o, C, nt) : 0.0;
        if (rep >= 0) {
            tf[rep] = t_f;
            tb[rep] = t_b;
            tbase[rep] = base;
        }
    }
    if (ok && s == BK_OK) {
        cli_stats(tf, reps, &r->fwd[0], &r->fwd[1], &r->fwd[2]);
        cli_stats(tb, reps, &r->fb[0], &r->fb[1], &r->fb[2]);
        cli_stats(tbase, reps, &r->base[0], &r->base[1], &r->base[2]);
    } else if (s) {
        fprintf(stderr, "bench: %s\n", bk_last_error());
    } else if (fits) {
        fprintf(stderr, "birkhoff bench: case %s %d:%d:%d: out of memory\n", c->label, BH, N, d);
    }
    bk_free(q); bk_free(k); bk_free(v); bk_free(o); bk_free(dout); bk_free(dq); bk_free(dk); bk_free(dv);
    bk_free(ws); bk_free(tape); free(C);
    free(tf); free(tb); free(tbase); free(par);
    for (int i = 0; i < 16; i++) free(in[i]);
    return ok && s == BK_OK;
}


/* Runs the peer once for every case whose peer is `peer` (same threads);
 * fills their results in order. Peer ESP runs only up to N = max_n. */
static void run_peer(const char *py, const char *script, const bcase *cs, int n, const char *peer, int max_n, int nt,
                     int reps, int warmup, bresult *res)
{
    if (access(script, R_OK) != 0) {
        fprintf(stderr, "bench: peer script %s not found (run from the source tree or pass --peer-script)\n", script);
        return;
    }
    char cases[4096] = "";
    size_t len = 0;
    int cnt = 0, idx[128];
    for (int i = 0; i < n; i++) {
        if (strcmp(peer_of(cs[i].label), peer) || cs[i].N > max_n) continue;
        len += (size_t)snprintf(cases + len, sizeof cases - len, "%s%d:%d:%d:%d", cnt ? "," : "", cs[i].BH, cs[i].N,
                                cs[i].d, cs[i].S);
        idx[cnt++] = i;
    }
    if (!cnt) return;
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "OMP_NUM_THREADS=%d OPENBLAS_NUM_THREADS=%d '%s' '%s' --op %s --cases %s --threads %d --reps %d --warmup %d --json",
             nt, nt, py, script, peer, cases, nt, reps, warmup);
    FILE *pp = popen(cmd, "r");
    if (!pp) {
        fprintf(stderr, "bench: cannot run the peer (%s)\n", cmd);
        return;
    }
    char line[8192];
    int k = 0;
    while (k < cnt && fgets(line, sizeof line, pp)) {
        if (line[0] != '{') continue;
        bresult *r = &res[idx[k++]];
        r->peer_fwd = cli_json_num(line, "fwd_median_s");
        r->peer_fb = cli_json_num(line, "fwdbwd_median_s");
        r->peer_saved = cli_json_num(line, "saved_bytes");
        r->peer_rss = cli_json_num(line, "peak_rss_delta_bytes");
        if (!isfinite(r->peer_rss)) r->peer_rss = cli_json_num(line, "peak_rss_bytes");
        r->have_peer = isfinite(r->peer_fwd) && isfinite(r->peer_fb);
    }
    int st = pclose(pp);
    if (st != 0) fprintf(stderr, "bench: the peer exited with status %d (is python3-torch installed?)\n", st);
}

/* one case's line(s): the table or a JSON object */
static void print_case(const bcase *c, const bresult *r, int json, int nt, int reps, double gf, double ge, double bw,
                       long our_rss)
{
    double peakF = gf * 1e9 * nt, peakE = ge * 1e9 * nt;
    double ideal_f = c->BH * (r->flops_f / peakF + r->exps_f / peakE);
    double ideal_fb = c->BH * ((r->flops_f + r->flops_b) / peakF + (r->exps_f + r->exps_b) / peakE);
    double frac_f = ideal_f / r->fwd[0], frac_fb = ideal_fb / r->fb[0];
    /* the fwd column times a forward without a tape; f+b, a forward with one and the backward */
    double bw_f = c->BH * r->bytes_f / bw / r->fwd[0], bw_fb = c->BH * (r->bytes_f + r->bytes_b) / bw / r->fb[0];
    double ours_mem = (double)(r->ws_bytes + r->tape_bytes) / (1 << 20);
    double peer_mem = r->have_peer ? r->peer_rss / (1 << 20) : NAN;
    double rf = r->have_peer ? r->fwd[0] / r->peer_fwd : NAN, rfb = r->have_peer ? r->fb[0] / r->peer_fb : NAN;
    if (json) {
        printf("{\"op\": \"%s\", \"BH\": %d, \"N\": %d, \"d\": %d, \"S\": %d, \"threads\": %d, \"reps\": %d, "
               "\"isa\": \"%s\", \"fma_gflops_core\": %.2f, \"exp_g_core\": %.3f, "
               "\"fwd_median_s\": %.6g, \"fwd_p25_s\": %.6g, \"fwd_p75_s\": %.6g, "
               "\"fwdbwd_median_s\": %.6g, \"fwdbwd_p25_s\": %.6g, \"fwdbwd_p75_s\": %.6g, "
               "\"workspace_bytes\": %zu, \"tape_bytes\": %zu, \"peak_rss_bytes\": %ld",
               c->label, c->BH, c->N, c->d, c->S, nt, reps, bk_isa(), gf, ge, r->fwd[0], r->fwd[1],
               r->fwd[2], r->fb[0], r->fb[1], r->fb[2], r->ws_bytes, r->tape_bytes, our_rss);
        if (r->flops_f > 0) printf(", \"frac_peak_fwd\": %.4f, \"frac_peak_fwdbwd\": %.4f", frac_f, frac_fb);
        if (r->bytes_f > 0)
            printf(", \"mem_bandwidth_bytes_s\": %.4g, \"bytes_fwd\": %.4g, \"bytes_bwd\": %.4g, \"frac_bw_fwd\": %.4f, "
                   "\"frac_bw_fwdbwd\": %.4f",
                   bw, c->BH * r->bytes_f, c->BH * r->bytes_b, bw_f, bw_fb);
        if (is_label(c, "softmax"))
            printf(", \"gemm_exp_baseline_s\": %.6g, \"fwd_over_baseline\": %.4f", r->base[0], r->fwd[0] / r->base[0]);
        if (r->have_peer)
            printf(", \"peer\": \"%s\", \"peer_fwd_median_s\": %.6g, \"peer_fwdbwd_median_s\": %.6g, "
                   "\"peer_saved_bytes\": %.0f, \"peer_peak_rss_delta_bytes\": %.0f, \"ratio_fwd\": %.4f, "
                   "\"ratio_fwdbwd\": %.4f",
                   peer_of(c->label), r->peer_fwd, r->peer_fb, r->peer_saved, r->peer_rss, rf, rfb);
        printf("}\n");
    } else {
        char pf[16] = "-", pr[16] = "-", pb[16] = "-", prb[16] = "-", pm[16] = "-", ff[16] = "-", fb[16] = "-";
        char mf[16] = "-", mb[16] = "-";
        if (r->bytes_f > 0) {
            snprintf(mf, sizeof mf, "%.0f%%", 100 * bw_f);
            snprintf(mb, sizeof mb, "%.0f%%", 100 * bw_fb);
        }
        if (r->have_peer) {
            snprintf(pf, sizeof pf, "%.3f", r->peer_fwd * 1e3);
            snprintf(pr, sizeof pr, "%.4f", rf);
            snprintf(pb, sizeof pb, "%.3f", r->peer_fb * 1e3);
            snprintf(prb, sizeof prb, "%.4f", rfb);
            snprintf(pm, sizeof pm, "%.1f", peer_mem);
        }
        if (r->flops_f > 0) {
            snprintf(ff, sizeof ff, "%.1f%%", 100 * frac_f);
            snprintf(fb, sizeof fb, "%.1f%%", 100 * frac_fb);
        }
        printf("%-9s %4d %6d %4d %2d | %9.3f %9s %7s | %9.3f %9s %7s | %8.2f %8s | %6s %6s | %5s %5s\n",
               c->label, c->BH, c->N, c->d, c->S, r->fwd[0] * 1e3, pf, pr, r->fb[0] * 1e3, pb, prb, ours_mem,
               pm, ff, fb, mf, mb);
        printf("%-9s %29s fwd [%.3f, %.3f] f+b [%.3f, %.3f] ms", "", "quartiles:", r->fwd[1] * 1e3,
               r->fwd[2] * 1e3, r->fb[1] * 1e3, r->fb[2] * 1e3);
        if (is_label(c, "softmax"))
            printf("; 2 GEMMs + 1 exp pass: %.3f ms, softmax fwd / that = %.2f", r->base[0] * 1e3,
                   r->fwd[0] / r->base[0]);
        printf("\n");
    }
}

/* the registry's bench case i of op as a bcase */
static void case_of(const bk_op *op, const bk_op_bench_case *bc, bcase *c)
{
    memset(c, 0, sizeof *c);
    c->op = op;
    snprintf(c->label, sizeof c->label, "%s%s%s", bk_op_name(op), bc->name[0] ? "-" : "", bc->name);
    snprintf(c->params, sizeof c->params, "%s", bc->params);
    c->BH = bc->B * bc->H;
    c->N = bc->Nq;
    c->d = bc->d;
    c->S = case_iters(c);
}

/* the labels of the registry's cases, each once, in order: "a, b, c" */
static void labels_text(char *buf, size_t cap)
{
    bcase seen[128];
    int ns = 0;
    buf[0] = 0;
    for (int i = 0; i < bk_op_count(); i++)
        for (int j = 0; j < bk_op_bench_count(bk_op_at(i)); j++) {
            bk_op_bench_case bc;
            bcase c;
            if (bk_op_bench_info(bk_op_at(i), j, &bc)) continue;
            case_of(bk_op_at(i), &bc, &c);
            int dup = 0;
            for (int k = 0; k < ns; k++) dup |= !strcmp(seen[k].label, c.label);
            if (dup || ns == 128) continue;
            seen[ns++] = c;
            if (buf[0]) strncat(buf, ", ", cap - strlen(buf) - 1);
            strncat(buf, c.label, cap - strlen(buf) - 1);
        }
}

/* The cases of --op LABEL|all: the registry's, or --cases over the first
 * registry case of each label asked for. -1 after a message. */
static int collect_cases(const char *opname, const char *cases, bcase *cs, int max)
{
    int n = 0;
    const int all = !strcmp(opname, "all");
    for (int i = 0; i < bk_op_count(); i++)
        for (int j = 0; j < bk_op_bench_count(bk_op_at(i)); j++) {
            bk_op_bench_case bc;
            bcase c;
            if (bk_op_bench_info(bk_op_at(i), j, &bc)) continue;
            case_of(bk_op_at(i), &bc, &c);
            if (!all && strcmp(c.label, opname)) continue;
            if (!cases) {
                if (n < max) cs[n++] = c;
                continue;
            }
            int first = 1;
            for (int k = 0; k < n; k++) first &= strcmp(cs[k].label, c.label) != 0;
            if (!first) continue;
            int k = parse_cases(cases, &c, cs + n, max - n);
            if (k < 0) {
                fprintf(stderr, "birkhoff bench: --cases must be a comma list of BH:N:d[:S], got '%s'\n", cases);
                return -1;
            }
            n += k;
        }
    if (!n) {
        char labels[512];
        labels_text(labels, sizeof labels);
        fprintf(stderr, "birkhoff bench: --op must be %s or all\n", labels);
        return -1;
    }
    return n;
}

static int bench_dispatch(int argc, char **argv);

/* the loads (--load, --load-job) run beside whichever bench is asked for */
int cmd_bench(int argc, char **argv)
{
    int busy, jobs;
    if (bench_load_args(&argc, argv, &busy, &jobs)) return CLI_USAGE;
    bench_load ld;
    if (bench_load_start(&ld, busy, jobs)) return CLI_FAIL;
    if (busy || jobs)
        fprintf(stderr, "bench: beside %d busy process%s and %d birkhoff job%s of its own\n", busy, busy == 1 ? "" : "es",
                jobs, jobs == 1 ? "" : "s");
    const int rc = bench_dispatch(argc, argv);
    bench_load_stop(&ld);
    return rc;
}

static int bench_dispatch(int argc, char **argv)
{
    const char *opname = "all", *cases = NULL, *py = "/usr/bin/python3", *script = "bench/peers/torch_peer.py";
    int nt = 2, reps = 21, warmup = 3, json = 0, peer = 1, peer_max_n = 512;
    for (int i = 1; i + 1 < argc; i++) /* the OTK bench has its own options */
        if (!strcmp(argv[i], "--op") && !strcmp(argv[i + 1], "otk")) return bench_otk(argc, argv);
        else if (!strcmp(argv[i], "--op") && !strcmp(argv[i + 1], "asap")) return bench_asap(argc, argv);
        else if (!strcmp(argv[i], "--op") && !strcmp(argv[i + 1], "train")) return bench_train(argc, argv);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { bench_usage(stdout); return CLI_OK; }
        else if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "--no-peer")) peer = 0;
        else if (val && !strcmp(a, "--op")) { opname = val; i++; }
        else if (val && !strcmp(a, "--cases")) { cases = val; i++; }
        else if (val && !strcmp(a, "--python")) { py = val; i++; }
        else if (val && !strcmp(a, "--peer-script")) { script = val; i++; }
        else if (val && !strcmp(a, "--threads") && cli_parse_int(val, &nt) && nt >= 1 && nt <= 4096) i++;
        else if (val && !strcmp(a, "--reps") && cli_parse_int(val, &reps) && reps >= 1) i++;
        else if (val && !strcmp(a, "--warmup") && cli_parse_int(val, &warmup) && warmup >= 0) i++;
        else if (val && !strcmp(a, "--peer-max-n") && cli_parse_int(val, &peer_max_n) && peer_max_n >= 1) i++;
        else {
            fprintf(stderr, "birkhoff bench: bad option or value '%s'\n", a);
            bench_usage(stderr);
            return CLI_USAGE;
        }
    }
    bcase cs[128];
    const int n = collect_cases(opname, cases, cs, 128);
    if (n < 0) return CLI_USAGE;
    for (int i = 0; i < n; i++) /* (before the machine's measurements: a case too large fails at once) */
        if (!case_fits(&cs[i], nt, 0.0)) return CLI_FAIL;
    bk_set_num_threads(nt);
    double gf, ge;
    bk_machine_peak(0.5, &gf, &ge);
    const double bw = mem_bandwidth(nt);
    if (!json)
        printf("machine: kernels %s, %d threads; measured per core: FMA %.1f GFLOP/s, exp %.2f G/s; memory %.1f GB/s "
               "(%d threads)\n",
               bk_isa(), nt, gf, ge, bw * 1e-9, nt);
    bresult *res = calloc((size_t)(n > 0 ? n : 1), sizeof *res);
    if (!res) {
        fprintf(stderr, "birkhoff bench: out of memory\n");
        return CLI_FAIL;
    }
    for (int i = 0; i < n; i++) {
        /* large problems: fewer repetitions (the quartiles say how noisy) */
        int rr = reps, ww = warmup;
        double work = (double)cs[i].BH * cs[i].N * cs[i].N * cs[i].d *
                      (is_label(&cs[i], "esp") || is_label(&cs[i], "esp-sq") ? cs[i].d : 1);
        if (work > 4e9) { rr = reps < 5 ? reps : 5; ww = warmup < 1 ? warmup : 1; }
        if (!run_ours(&cs[i], rr, ww, nt, &res[i])) {
            free(res);
            return CLI_FAIL;
        }
    }
    long our_rss = cli_peak_rss();
    if (peer) {
        run_peer(py, script, cs, n, "softmax", 1 << 30, nt, reps, warmup, res);
        run_peer(py, script, cs, n, "sinkhorn", 1 << 30, nt, reps, warmup, res);
        run_peer(py, script, cs, n, "lot", 4096, nt, reps < 5 ? reps : 5, 1, res);
        /* the ESP peer takes seconds to minutes per call: one repetition, no warm-up */
        run_peer(py, script, cs, n, "esp", peer_max_n, nt, 1, 0, res);
    }
    if (!json)
        printf("%-9s %4s %6s %4s %2s | %9s %9s %7s | %9s %9s %7s | %8s %8s | %6s %6s | %5s %5s%s\n", "op", "BH", "N",
               "d", "S", "fwd ms", "peer ms", "ratio", "f+b ms", "peer ms", "ratio", "ours MiB", "peer MiB", "%peak",
               "%peak", "%bw", "%bw", " (fwd, f+b)");
    for (int i = 0; i < n; i++) print_case(&cs[i], &res[i], json, nt, reps, gf, ge, bw, our_rss);
    if (!json)
        printf("ratio = ours / peer (lower is better); the esp ops' peer is the reference soft-sort ESP.\n"
               "ours MiB = workspace + tape; peer MiB = peak RSS growth of the peer's forward+backward.\n"
               "%%peak = (GEMM flops / FMA peak + exps / exp peak) / time, with the work our kernels do.\n"
               "%%bw = modelled memory traffic / time / the measured memory bandwidth (LOT, ESP hard: the\n"
               "arrays each pass reads and writes, counted from the code; docs/PERFORMANCE.md).\n"
               "peak RSS: ours %.1f MiB (whole bench process)\n",
               our_rss / 1048576.0);
    free(res);
    return CLI_OK;
}
