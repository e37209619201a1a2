/* otk_fit.c -- unsupervised learning for the OTK embedding (Mialon et al.
 * 2021, section 3.4; digest section 5.1): spherical K-means for the Nystrom
 * anchors and the references, Wasserstein K-means over sets for q > 1, and
 * damped barycentric refinement. All randomness comes from one seeded
 * splitmix64 stream; every reduction runs in a fixed order, so results do not
 * depend on the thread count. */
#include "ops.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define KM_BLOCK 1024 /* rows per assignment block (fixed: determinism) */

bk_kmeans_config bk_kmeans_config_default(void)
{
    bk_kmeans_config k = {100, 1e-6f, 0, 0, BK_KMEANS_PLUSPLUS};
    return k;
}

static bk_status check_kp(const bk_kmeans_config *kp)
{
    if (!kp) return bki_fail(BK_ERR_NULL, "K-means parameters are NULL");
    if (kp->iters < 1) return bki_fail(BK_ERR_PARAM, "K-means iterations must be >= 1, got %d", kp->iters);
    if (!(kp->tol >= 0.0f) || !isfinite(kp->tol)) return bki_fail(BK_ERR_PARAM, "K-means tol must be finite and >= 0");
    if (kp->max_samples < 0) return bki_fail(BK_ERR_PARAM, "max_samples must be >= 0");
    if (kp->init != BK_KMEANS_PLUSPLUS && kp->init != BK_KMEANS_RANDOM) return bki_fail(BK_ERR_PARAM, "unknown K-means init %d", (int)kp->init);
    return BK_OK;
}

/* normalise rows in place; returns the number of rows kept (zero rows are
 * dropped, the others compacted in order) */
static int64_t normalise_rows(float *x, int64_t N, int dim)
{
    int64_t m = 0;
    for (int64_t i = 0; i < N; i++) {
        float *r = x + (size_t)i * dim;
        if (!bki_unit_row(r, dim)) continue;
        if (m != i) memcpy(x + (size_t)m * dim, r, sizeof(float) * dim);
        m++;
    }
    return m;
}

/* k-means++: sim[i] = min(sim[i], 1 - cos(x_i, c)) (sim[i] = the distance
 * itself for the first centre, j == 0) */
typedef struct {
    const float *xn;
    int64_t N;
    int dim;
    const float *c;
    int j;
    float *sim;
} km_nearest_args;

static void km_nearest_member(void *arg)
{
    const km_nearest_args *r = arg;
    float *sim = r->sim;
    BKI_FOR(i, r->N)
    {
        const float ip = bki_dotf(r->dim, r->xn + (size_t)i * r->dim, r->c);
        const float dist = fmaxf(1.0f - ip, 0.0f);
        if (r->j == 0 || dist < sim[i]) sim[i] = dist;
    }
}

/* each point's nearest centre and its similarity, in fixed blocks of
 * KM_BLOCK rows (blk: a KM_BLOCK x K scratch per member) */
typedef struct {
    const float *xn;
    int64_t N;
    int dim, K;
    const float *C;
    float *blk;
    int64_t nblk;
    int32_t *assign;
    float *sim;
} km_assign_args;

static void km_assign_member(void *arg)
{
    const km_assign_args *r = arg;
    const int64_t N = r->N;
    const int K = r->K, dim = r->dim;
    float *S = r->blk + (size_t)bki_thread_id() * KM_BLOCK * K;
    BKI_FOR(bI, r->nblk)
    {
        const int64_t i0 = bI * KM_BLOCK;
        const int m = (int)(N - i0 < KM_BLOCK ? N - i0 : KM_BLOCK);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, K, dim, 1.0f, r->xn + (size_t)i0 * dim, dim, r->C, dim,
                    0.0f, S, K);
        for (int i = 0; i < m; i++) {
            int best = 0;
            float bv = S[(size_t)i * K];
            for (int j = 1; j < K; j++)
                if (S[(size_t)i * K + j] > bv) { bv = S[(size_t)i * K + j]; best = j; }
            r->assign[i0 + i] = best;
            r->sim[i0 + i] = bv;
        }
    }
}

/* centre sums acc [K][dim]: blocks of 16 columns claimed by the members,
 * rows added in order */
typedef struct {
    const float *xn;
    int64_t N;
    int dim, ncb;
    const int32_t *assign;
    double *acc;
} km_sums_args;

static void km_sums_member(void *arg)
{
    const km_sums_args *r = arg;
    const int dim = r->dim;
    BKI_FOR(cb, r->ncb)
    {
        const int c0 = (int)cb * 16, c1 = c0 + 16 < dim ? c0 + 16 : dim;
        for (int64_t i = 0; i < r->N; i++) {
            double *a = r->acc + (size_t)r->assign[i] * dim;
            const float *x = r->xn + (size_t)i * dim;
            for (int c = c0; c < c1; c++) a[c] += x[c];
        }
    }
}

/* spherical K-means on unit rows xn [N][dim] (N >= K); centres [K][dim] */
static bk_status kmeans_core(const float *xn, int64_t N, int dim, int K, const bk_kmeans_config *kp, float *C,
                             bk_kmeans_report *rep)
{
    int32_t *assign = malloc(sizeof(int32_t) * (size_t)N);
    float *sim = malloc(sizeof(float) * (size_t)N);
    int64_t *idx = malloc(sizeof(int64_t) * (size_t)(K > 0 ? K : 1));
    double *acc = malloc(sizeof(double) * (size_t)K * dim);
    const int nt = bki_threads();
    float *blk = malloc(sizeof(float) * (size_t)nt * KM_BLOCK * K);
    if (!assign || !sim || !idx || !acc || !blk) {
        free(assign); free(sim); free(idx); free(acc); free(blk);
        return bki_fail(BK_ERR_NOMEM, "out of memory (K-means on %lld points)", (long long)N);
    }
    uint64_t st = kp->seed;
    if (kp->init == BK_KMEANS_RANDOM) {
        /* K distinct initial points: Floyd's sampling, in draw order */
        for (int j = 0; j < K; j++) {
            int64_t t = (int64_t)bki_rand_below(&st, (uint64_t)(N - K + j + 1));
            for (int i = 0; i < j; i++)
                if (idx[i] == t) { t = N - K + j; break; }
            idx[j] = t;
            memcpy(C + (size_t)j * dim, xn + (size_t)t * dim, sizeof(float) * dim);
        }
    } else {
        /* k-means++: each next centre drawn with probability proportional to
         * its distance 1 - cos to the nearest chosen centre (sim holds it) */
        int64_t t = (int64_t)bki_rand_below(&st, (uint64_t)N);
        for (int j = 0; j < K; j++) {
            memcpy(C + (size_t)j * dim, xn + (size_t)t * dim, sizeof(float) * dim);
            const float *c = C + (size_t)j * dim;
            double tot = 0.0;
            km_nearest_args na = {xn, N, dim, c, j, sim};
            bki_parallel_claimed(nt, km_nearest_member, &na);
            for (int64_t i = 0; i < N; i++) tot += sim[i];
            if (j + 1 == K) break;
            if (!(tot > 0.0)) { /* every point is a centre already: any point */
                t = (int64_t)bki_rand_below(&st, (uint64_t)N);
                continue;
            }
            const double u = (double)(bki_mix64(&st) >> 11) * (1.0 / 9007199254740992.0) * tot;
            double cum = 0.0;
            t = N - 1;
            for (int64_t i = 0; i < N; i++) {
                cum += sim[i];
                if (cum > u && sim[i] > 0.0f) { t = i; break; }
            }
        }
    }
    const int64_t nblk = (N + KM_BLOCK - 1) / KM_BLOCK;
    double prev = INFINITY, obj = 0.0;
    int it = 0, conv = 0;
    for (it = 1; it <= kp->iters; it++) {
        km_assign_args aa = {xn, N, dim, K, C, blk, nblk, assign, sim};
        bki_parallel_claimed(nt, km_assign_member, &aa);
        double s = 0.0;
        for (int64_t i = 0; i < N; i++) s += sim[i];
        obj = s / (double)N;
        /* centre sums: columns split over threads, rows in order */
        memset(acc, 0, sizeof(double) * (size_t)K * dim);
        const int ncb = (dim + 15) / 16;
        km_sums_args sa = {xn, N, dim, ncb, assign, acc};
        bki_parallel_claimed(nt < ncb ? nt : ncb, km_sums_member, &sa);
        for (int j = 0; j < K; j++) {
            double nrm = 0.0;
            for (int c = 0; c < dim; c++) nrm += acc[(size_t)j * dim + c] * acc[(size_t)j * dim + c];
            if (nrm > 0.0) {
                const double inv = 1.0 / sqrt(nrm);
                for (int c = 0; c < dim; c++) C[(size_t)j * dim + c] = (float)(acc[(size_t)j * dim + c] * inv);
            } else {
                /* empty (or cancelling) cluster: the worst-fitting point */
                int64_t w = 0;
                for (int64_t i = 1; i < N; i++)
                    if (sim[i] < sim[w]) w = i;
                memcpy(C + (size_t)j * dim, xn + (size_t)w * dim, sizeof(float) * dim);
                sim[w] = 1.0f;
            }
        }
        if (fabs(prev - obj) / (fabs(obj) + 1e-20) < kp->tol) {
            conv = 1;
            break;
        }
        prev = obj;
    }
    if (rep) {
        rep->iters = it > kp->iters ? kp->iters : it;
        rep->converged = conv;
        rep->objective = obj;
    }
    free(assign); free(sim); free(idx); free(acc); free(blk);
    return BK_OK;
}

bk_status bk_spherical_kmeans(const float *x, int64_t N, int dim, int K, const bk_kmeans_config *kp, float *centres,
                              bk_kmeans_report *rep)
{
    bk_status s;
    if (!x || !centres) return bki_fail(BK_ERR_NULL, "K-means data or centres are NULL");
    if (N < 1 || dim < 1 || K < 1) return bki_fail(BK_ERR_SHAPE, "K-means needs N, dim, K >= 1 (N=%lld dim=%d K=%d)", (long long)N, dim, K);
    if ((s = check_kp(kp))) return s;
    for (int64_t i = 0; i < N * dim; i++)
        if (!isfinite(x[i])) return bki_fail(BK_ERR_NONFINITE, "K-means data has a non-finite value at %lld", (long long)i);
    float *xn = malloc(sizeof(float) * (size_t)N * dim);
    if (!xn) return bki_fail(BK_ERR_NOMEM, "out of memory (K-means copy of %lld x %d)", (long long)N, dim);
    memcpy(xn, x, sizeof(float) * (size_t)N * dim);
    const int64_t m = normalise_rows(xn, N, dim);
    if (K > m) {
        free(xn);
        return bki_fail(BK_ERR_PARAM, "K-means: %d clusters but only %lld non-zero samples", K, (long long)m);
    }
    s = kmeans_core(xn, m, dim, K, kp, centres, rep);
    free(xn);
    if (!s) bki_clear_error();
    return s;
}

/* Copies up to max_samples (0 = all) valid rows of the sets [B][n][dim]
 * (rows of set b at base + b*sb + i*sn) into a new dense array, chosen by
 * selection sampling (in order, each with the exact remaining probability). */
static float *gather_rows(const float *base, int64_t sb, int64_t sn, int B, int n, int dim, const int32_t *len,
                          int64_t max_samples, uint64_t seed, int64_t *count)
{
    int64_t total = 0;
    for (int b = 0; b < B; b++) total += bki_len(len, b, n);
    const int64_t want = max_samples > 0 && max_samples < total ? max_samples : total;
    float *out = malloc(sizeof(float) * (size_t)(want > 0 ? want : 1) * dim);
    if (!out) return NULL;
    uint64_t st = seed ^ 0x5851F42D4C957F2Dull;
    int64_t seen = 0, got = 0;
    for (int b = 0; b < B && got < want; b++)
        for (int i = 0; i < bki_len(len, b, n) && got < want; i++, seen++) {
            if (want < total && (int64_t)bki_rand_below(&st, (uint64_t)(total - seen)) >= want - got) continue;
            memcpy(out + (size_t)got * dim, base + b * sb + i * sn, sizeof(float) * dim);
            got++;
        }
    *count = got;
    return out;
}

static bk_status check_sets(const bk_otk_desc *d, const bk_tensor *x)
{
    bk_status s;
    if ((s = bki_otk_check_desc(d))) return s;
    if ((s = bki_check_tensor("x", x, d->B, 1, d->n, d->d))) return s;
    return bki_check_finite("x", x, d->B, 1, d->n, d->d, d->len);
}

bk_status bk_otk_fit_anchors(const bk_otk_desc *d, const bk_tensor *x, const bk_kmeans_config *kp, float *W,
                             bk_kmeans_report *rep)
{
    bk_status s;
    if ((s = check_sets(d, x)) || (s = check_kp(kp))) return s;
    if (!W) return bki_fail(BK_ERR_NULL, "anchors output W is NULL");
    int64_t m = 0;
    float *xs = gather_rows(x->data, x->stride_b, x->stride_n, d->B, d->n, d->d, d->len, kp->max_samples, kp->seed, &m);
    if (!xs) return bki_fail(BK_ERR_NOMEM, "out of memory (anchor samples)");
    m = normalise_rows(xs, m, d->d);
    if (d->k > m) {
        free(xs);
        return bki_fail(BK_ERR_PARAM, "fit-anchors: k = %d anchors but only %lld non-zero sampled elements", d->k, (long long)m);
    }
    s = kmeans_core(xs, m, d->d, d->k, kp, W, rep);
    free(xs);
    if (!s) bki_clear_error();
    return s;
}

/* damped barycentric steps z <- normalise(z/2 + mean_b(p P_b^T F_b)/2) for
 * the references of ref[] (sets with ref[b] = h move z^h) */
static bk_status barycenter(const bk_otk_desc *d, const bk_otk_config *p, const float *F, const int *ref, int steps,
                            float *z)
{
    const size_t pk = (size_t)d->p * d->k;
    float *bs = malloc(sizeof(float) * (size_t)d->q * pk);
    int *cnt = calloc((size_t)d->q, sizeof(int));
    if (!bs || !cnt) {
        free(bs); free(cnt);
        return bki_fail(BK_ERR_NOMEM, "out of memory (barycenter)");
    }
    for (int b = 0; b < d->B; b++) cnt[ref[b]]++;
    bk_status s = BK_OK;
    for (int t = 0; t < steps && !s; t++) {
        memset(bs, 0, sizeof(float) * (size_t)d->q * pk);
        if ((s = bki_otk_transport(d, p, F, z, NULL, ref, bs))) break;
        for (int h = 0; h < d->q; h++) {
            if (!cnt[h]) continue;
            for (int j = 0; j < d->p; j++) {
                float *zj = z + (size_t)h * pk + (size_t)j * d->k;
                const float *bj = bs + (size_t)h * pk + (size_t)j * d->k;
                for (int c = 0; c < d->k; c++) zj[c] = 0.5f * zj[c] + 0.5f * bj[c] / (float)cnt[h];
                bki_unit_row(zj, d->k);
            }
        }
    }
    free(bs); free(cnt);
    return s;
}

bk_status bk_otk_fit_refs(const bk_otk_desc *d, const bk_otk_config *p, const bk_tensor *x, const bk_kmeans_config *kp,
                          int barycenter_steps, float *z, bk_kmeans_report *rep)
{
    bk_status s;
    if ((s = check_sets(d, x)) || (s = check_kp(kp))) return s;
    if (!p) return bki_fail(BK_ERR_NULL, "OTK parameters are NULL");
    if (!z) return bki_fail(BK_ERR_NULL, "references output z is NULL");
    if (barycenter_steps < 0) return bki_fail(BK_ERR_PARAM, "barycenter steps must be >= 0");
    if (p->W == NULL && d->k != d->d) return bki_fail(BK_ERR_SHAPE, "without anchors k (%d) must equal d (%d)", d->k, d->d);
    const int B = d->B, n = d->n, k = d->k, P = d->p, q = d->q;
    /* features of every valid element, normalised (zero rows stay zero) */
    float *F = malloc(sizeof(float) * (size_t)B * n * k);
    if (!F) return bki_fail(BK_ERR_NOMEM, "out of memory (features of %d sets)", B);
    bk_otk_desc fd = *d;
    bk_tensor ft = {F, (int64_t)n * k, (int64_t)n * k, k, BK_DEVICE_HOST, BK_F32};
    if ((s = bk_otk_features(&fd, p, x, &ft))) {
        free(F);
        return s;
    }
    for (int b = 0; b < B; b++) {
        const int nb = bki_len(d->len, b, n);
        for (int i = 0; i < nb; i++) bki_unit_row(F + ((size_t)b * n + i) * k, k);
    }
    int *ref = calloc((size_t)B, sizeof(int));
    double *sim = malloc(sizeof(double) * (size_t)B * q);
    double *best = malloc(sizeof(double) * (size_t)B);
    int *sets = malloc(sizeof(int) * (size_t)B);
    if (!ref || !sim || !best || !sets) {
        s = bki_fail(BK_ERR_NOMEM, "out of memory (Wasserstein K-means)");
        goto done;
    }
    bk_kmeans_report r0 = {0, 0, 0.0};
    if (q == 1) {
        int64_t m = 0;
        float *xs = gather_rows(F, (int64_t)n * k, k, B, n, k, d->len, kp->max_samples, kp->seed, &m);
        if (!xs) {
            s = bki_fail(BK_ERR_NOMEM, "out of memory (reference samples)");
            goto done;
        }
        m = normalise_rows(xs, m, k);
        if (P > m) s = bki_fail(BK_ERR_PARAM, "fit-refs: p = %d supports but only %lld non-zero sampled features", P, (long long)m);
        else s = kmeans_core(xs, m, k, P, kp, z, &r0);
        free(xs);
        if (!s && barycenter_steps) s = barycenter(d, p, F, ref, barycenter_steps, z);
        if (rep) *rep = r0;
        goto done;
    }
    /* q > 1: Wasserstein K-means over sets */
    int ncand = 0;
    for (int b = 0; b < B; b++)
        if (bki_len(d->len, b, n) >= P) sets[ncand++] = b;
    if (ncand < q) {
        s = bki_fail(BK_ERR_PARAM, "fit-refs: q = %d references need %d sets with >= p = %d elements, found %d", q, q, P, ncand);
        goto done;
    }
    uint64_t st = kp->seed;
    for (int h = 0; h < q; h++) { /* partial Fisher-Yates over the candidates */
        const int j = h + (int)bki_rand_below(&st, (uint64_t)(ncand - h));
        const int t = sets[h]; sets[h] = sets[j]; sets[j] = t;
        memcpy(z + (size_t)h * P * k, F + (size_t)sets[h] * n * k, sizeof(float) * (size_t)P * k);
    }
    double prev = INFINITY, obj = 0.0;
    int it, conv = 0;
    float *xs = malloc(sizeof(float) * (size_t)B * n * k);
    if (!xs) {
        s = bki_fail(BK_ERR_NOMEM, "out of memory (Wasserstein K-means)");
        goto done;
    }
    for (it = 1; it <= kp->iters; it++) {
        if ((s = bki_otk_transport(d, p, F, z, sim, NULL, NULL))) break;
        double tot = 0.0;
        for (int b = 0; b < B; b++) {
            int bh = 0;
            for (int h = 1; h < q; h++)
                if (sim[(size_t)b * q + h] > sim[(size_t)b * q + bh]) bh = h;
            ref[b] = bh;
            best[b] = sim[(size_t)b * q + bh];
            tot += best[b];
        }
        obj = tot / B;
        for (int h = 0; h < q && !s; h++) {
            int64_t m = 0;
            for (int b = 0; b < B; b++)
                if (ref[b] == h)
                    for (int i = 0; i < bki_len(d->len, b, n); i++, m++)
                        memcpy(xs + (size_t)m * k, F + ((size_t)b * n + i) * k, sizeof(float) * k);
            m = normalise_rows(xs, m, k);
            float *zh = z + (size_t)h * P * k;
            if (m >= P) {
                bk_kmeans_config ip = *kp;
                ip.seed = kp->seed + BKI_GOLDEN * (uint64_t)(it * q + h + 1);
                s = kmeans_core(xs, m, k, P, &ip, zh, NULL);
            } else {
                /* empty (or too small) cluster: the worst-fitting set's first features */
                int w = 0;
                for (int b = 1; b < B; b++)
                    if (best[b] < best[w]) w = b;
                const int nw = bki_len(d->len, w, n);
                for (int j = 0; j < P; j++)
                    memcpy(zh + (size_t)j * k, F + ((size_t)w * n + (j % nw)) * k, sizeof(float) * k);
                best[w] = INFINITY;
            }
        }
        if (!s && barycenter_steps) s = barycenter(d, p, F, ref, barycenter_steps, z);
        if (s) break;
        if (fabs(prev - obj) / fmax(fabs(obj), 1e-10) < kp->tol) {
            conv = 1;
            break;
        }
        prev = obj;
    }
    free(xs);
    if (rep) {
        rep->iters = it > kp->iters ? kp->iters : it;
        rep->converged = conv;
        rep->objective = obj;
    }
done:
    free(F); free(ref); free(sim); free(best); free(sets);
    if (!s) bki_clear_error();
    return s;
}
