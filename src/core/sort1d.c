/* sort1d.c -- the one sort / 1-D transport engine: stable argsort of float
 * keys, the exact 1-D optimal transport plan between uniform measures
 * (north-west-corner rule) and its Kantorovich potential, and the random
 * slice directions. Used by ESP (per-slice matchings) and ASAP (sliced
 * potentials). */
#include "internal.h"

#include <math.h>
#include <string.h>

size_t bki_argsort_scratch(int n) { return 2 * (size_t)n * sizeof(uint32_t) * 2; }

/* Stable ascending argsort: idx[r] = index of the r-th smallest key (ties by
 * index). Up to the instruction set's small_sort_max keys (AVX-512 128, AVX2
 * 96) without branches on the data (bki_kernels.small_argsort: ranks in
 * vector lanes, a bitonic network in registers on AVX-512). Merges of
 * insertion-sorted runs, used here before, spent most of their time in
 * mispredicted branches: ASAP at N = 32-128 (two sorts per slice) ran
 * 1.3-2.9x faster (docs/PERFORMANCE.md). Above that an LSD radix sort, 4
 * passes of 8 bits. All give the one stable order.
 * scratch: bki_argsort_scratch(n) bytes. Keys must not be NaN. */
void bki_argsort(int n, const float *x, ptrdiff_t stride, int32_t *idx, void *scratch)
{
    if (n <= bki_kern()->small_sort_max) {
        bki_kern()->small_argsort(n, x, stride, idx);
        return;
    }
    uint32_t *k0 = scratch, *k1 = k0 + n;
    uint32_t *i0 = k1 + n, *i1 = i0 + n;
    for (int i = 0; i < n; i++) {
        k0[i] = bki_sort_key(x[(ptrdiff_t)i * stride]);
        i0[i] = (uint32_t)i;
    }
    for (int shift = 0; shift < 32; shift += 8) {
        size_t cnt[257];
        memset(cnt, 0, sizeof cnt);
        for (int i = 0; i < n; i++) cnt[((k0[i] >> shift) & 0xffu) + 1]++;
        if (cnt[((k0[0] >> shift) & 0xffu) + 1] == (size_t)n) continue; /* all equal digits */
        for (int b = 0; b < 256; b++) cnt[b + 1] += cnt[b];
        for (int i = 0; i < n; i++) {
            size_t pos = cnt[(k0[i] >> shift) & 0xffu]++;
            k1[pos] = k0[i];
            i1[pos] = i0[i];
        }
        uint32_t *t = k0; k0 = k1; k1 = t;
        t = i0; i0 = i1; i1 = t;
    }
    for (int i = 0; i < n; i++) idx[i] = (int32_t)i0[i];
}

/* The same stable argsort by a team (every member calls it with the same
 * arguments; internal.h's parallel model): for a few large sorts, where
 * sharing whole sorts over the members would leave some idle. LSD radix,
 * 4 passes of 8 bits, over fixed blocks of keys (a function of n only): per
 * block digit counts, each block scattered (by whichever member claims it,
 * internal.h's "Blocks claimed at run time") at offsets summed in digit then
 * block order, found by the block itself. The stable order is unique, so
 * idx is bitwise bki_argsort's for any team. Up to 2 TS_BLOCK keys member 0
 * sorts alone. scratch: bki_argsort_scratch(n) bytes, counts:
 * bki_argsort_team_counts(n) bytes, both shared by the team. Ends synced. */
#define TS_BLOCK 4096
static int ts_blocks(int n)
{
    int nb = (n + TS_BLOCK - 1) / TS_BLOCK;
    return nb > 64 ? 64 : (nb < 1 ? 1 : nb);
}

size_t bki_argsort_team_counts(int n) { return (size_t)ts_blocks(n) * 256 * sizeof(uint32_t); }

void bki_argsort_team(const bki_team *tm, int n, const float *x, ptrdiff_t stride, int32_t *idx, void *scratch,
                      void *counts)
{
    if (tm->nt == 1 || n <= 2 * TS_BLOCK) {
        if (tm->tid == 0) bki_argsort(n, x, stride, idx, scratch);
        bki_team_sync(tm);
        return;
    }
    const int nb = ts_blocks(n);
    uint32_t *k0 = scratch, *k1 = k0 + n, *i0 = k1 + n, *i1 = i0 + n;
    uint32_t *cnt = counts; /* nb x 256 */
    /* the blocks are claimed at run time (internal.h): a block's keys, counts
     * and scatter depend on its index only */
#define TS_BEGIN(b) ((int)((int64_t)n * (b) / nb))
    bki_claims cl = bki_claims_open(tm, nb);
    for (int64_t b; bki_claims_next(&cl, &b);)
        for (int i = TS_BEGIN(b); i < TS_BEGIN(b + 1); i++) {
            k0[i] = bki_sort_key(x[(ptrdiff_t)i * stride]);
            i0[i] = (uint32_t)i;
        }
    bki_team_sync(tm);
    for (int shift = 0; shift < 32; shift += 8) {
        cl = bki_claims_open(tm, nb);
        for (int64_t b; bki_claims_next(&cl, &b);) {
            uint32_t *c = cnt + (size_t)b * 256;
            memset(c, 0, 256 * sizeof(uint32_t));
            for (int i = TS_BEGIN(b); i < TS_BEGIN(b + 1); i++) c[(k0[i] >> shift) & 0xffu]++;
        }
        bki_team_sync(tm);
        /* every member: the digit totals (the same for all) and their starts */
        size_t tot[256];
        uint32_t start[256]; /* positions < n < 2^31 */
        memset(tot, 0, sizeof tot);
        for (int b = 0; b < nb; b++)
            for (int dg = 0; dg < 256; dg++) tot[dg] += cnt[(size_t)b * 256 + dg];
        if (tot[(k0[0] >> shift) & 0xffu] != (size_t)n) { /* else all digits equal: the pass keeps the order */
            size_t run = 0;
            for (int dg = 0; dg < 256; dg++) {
                start[dg] = (uint32_t)run;
                run += tot[dg];
            }
            cl = bki_claims_open(tm, nb);
            for (int64_t b; bki_claims_next(&cl, &b);) {
                /* block b's offsets: the digit's start and the blocks before b */
                uint32_t off[256];
                memcpy(off, start, sizeof off);
                for (int64_t bb = 0; bb < b; bb++)
                    for (int dg = 0; dg < 256; dg++) off[dg] += cnt[(size_t)bb * 256 + dg];
                for (int i = TS_BEGIN(b); i < TS_BEGIN(b + 1); i++) {
                    const size_t pos = off[(k0[i] >> shift) & 0xffu]++;
                    k1[pos] = k0[i];
                    i1[pos] = i0[i];
                }
            }
            uint32_t *t = k0; k0 = k1; k1 = t;
            t = i0; i0 = i1; i1 = t;
        }
        bki_team_sync(tm); /* the scatter is complete and the counts are free */
    }
    cl = bki_claims_open(tm, nb);
    for (int64_t b; bki_claims_next(&cl, &b);)
        for (int i = TS_BEGIN(b); i < TS_BEGIN(b + 1); i++) idx[i] = (int32_t)i0[i];
#undef TS_BEGIN
    bki_team_sync(tm);
}

/* Batcher's odd-even merge sort, iteratively: merges of runs of p, each
 * by comparators k apart (k = p, p/2, .., 1) between elements of the same
 * 2p-run. Positions past n would hold keys no smaller than any other, and
 * a comparator (i, j), i < j, never moves such a key from j, so those with
 * j >= n are dropped: the network sorts n keys. The count for the next power
 * of two 2^q, (q^2 - q + 4) 2^(q-2) - 1, bounds it. */
int bki_sort_net_bound(int n)
{
    int q = 0;
    while ((1 << q) < n) q++;
    return q < 2 ? 1 : (q * q - q + 4) * (1 << (q - 2)) - 1;
}

int bki_sort_net(int n, uint16_t *pairs)
{
    int c = 0;
    for (int lp = 0; (1 << lp) < n; lp++) { /* p = 2^lp: runs of p merged into runs of 2p */
        const int p = 1 << lp;
        for (int k = p; k >= 1; k >>= 1)
            for (int j = k & (p - 1); j + k < n; j += 2 * k)
                for (int i = 0; i < k && i + j + k < n; i++)
                    if (((i + j) >> (lp + 1)) == ((i + j + k) >> (lp + 1))) { /* the same 2p-run */
                        pairs[2 * c] = (uint16_t)(i + j);
                        pairs[2 * c + 1] = (uint16_t)(i + j + k);
                        c++;
                    }
    }
    return c;
}

size_t bki_lanes_bytes(int n, int m)
{
    const size_t nn = (size_t)(n > m ? n : m), lane = sizeof(float) * BKI_LANES;
    return 2 * bki_round_up(lane * nn) + bki_round_up(lane * (size_t)m) + bki_round_up(4 * (size_t)bki_sort_net_bound(n)) +
           bki_round_up(4 * (size_t)bki_sort_net_bound(m));
}

bki_lanes bki_lanes_init(void *scr, int n, int m)
{
    const size_t nn = (size_t)(n > m ? n : m), lane = sizeof(float) * BKI_LANES;
    char *p = scr;
    bki_lanes z;
    z.ka = (float *)p;
    p += bki_round_up(lane * nn);
    z.ix = (int32_t *)p;
    p += bki_round_up(lane * nn);
    z.kb = (float *)p;
    p += bki_round_up(lane * (size_t)m);
    uint16_t *net = (uint16_t *)p;
    z.cmp_n = bki_sort_net(n, net);
    z.net_n = net;
    if (m == n) {
        z.net_m = net;
        z.cmp_m = z.cmp_n;
    } else {
        net = (uint16_t *)(p + bki_round_up(4 * (size_t)bki_sort_net_bound(n)));
        z.cmp_m = bki_sort_net(m, net);
        z.net_m = net;
    }
    return z;
}

void bki_lanes_load(int len, int nl, const float *x, size_t ldr, size_t ldl, float *key, int32_t *idx)
{
    if (ldl == 1) {
        for (int r = 0; r < len; r++) {
            float *kr = key + (size_t)r * BKI_LANES;
            memcpy(kr, x + (size_t)r * ldr, sizeof(float) * (size_t)nl);
            for (int l = nl; l < BKI_LANES; l++) kr[l] = 0.0f;
        }
    } else {
        for (int l = 0; l < BKI_LANES; l++)
            for (int r = 0; r < len; r++) key[(size_t)r * BKI_LANES + l] = l < nl ? x[(size_t)r * ldr + (size_t)l * ldl] : 0.0f;
    }
    if (idx)
        for (int r = 0; r < len; r++)
            for (int l = 0; l < BKI_LANES; l++) idx[(size_t)r * BKI_LANES + l] = r;
}

/* The 1-D OT plan between uniform measures on n and m sorted atoms: pairs
 * (r, s) of ranks with mass |[r/n, (r+1)/n) ∩ [s/m, (s+1)/m)|, walked in
 * order (at most n + m - 1 pairs; (r, r) when n == m). The mass is returned
 * exactly as a count of cells of the common grid of n*m cells: mass =
 * cells / (n m); row r holds m cells, column s holds n cells. */
int bki_nw_pairs(int n, int m, int32_t *pr, int32_t *ps, double *cells)
{
    int cnt = 0;
    if (n == m) {
        for (int r = 0; r < n; r++) {
            pr[r] = ps[r] = r;
            cells[r] = (double)n;
        }
        return n;
    }
    /* row r covers cells [r*m, (r+1)*m), column s covers [s*n, (s+1)*n) */
    int r = 0, s = 0;
    int64_t pos = 0;
    while (r < n && s < m) {
        int64_t rend = (int64_t)(r + 1) * m, send = (int64_t)(s + 1) * n;
        int64_t end = rend < send ? rend : send;
        pr[cnt] = r;
        ps[cnt] = s;
        cells[cnt] = (double)(end - pos);
        cnt++;
        pos = end;
        if (end == rend) r++;
        if (end == send) s++;
    }
    return cnt;
}

/* The query-side Kantorovich potential of the 1-D problem between uniform
 * measures on n atoms a and m atoms b (cost (a - b)^2 / 2), given both sort
 * orders: with a_(r), b_(t) the sorted values and sigma(r) = floor(((r+1) m
 * - 1) / n) the last key rank the monotone plan sends query rank r to,
 *     phi_0 = 0,  phi_r = phi_{r-1} + b_(sigma(r-1)) (a_(r) - a_(r-1)),
 *     f_(r) = a_(r)^2 / 2 - phi_r,
 * written to f in token order (f[ia[r]] = f_(r)), accumulated in double.
 * Tied a's get equal values (a zero gap leaves phi unchanged). Returns the
 * mean of f over the n atoms (callers centre with it). */
double bki_potential1d(int n, int m, const float *a, ptrdiff_t sa, const int32_t *ia, const float *b,
                       ptrdiff_t sb, const int32_t *ib, double *f)
{
    double phi = 0.0, prev = 0.0, sum = 0.0;
    for (int r = 0; r < n; r++) {
        double ar = (double)a[(ptrdiff_t)ia[r] * sa];
        if (r > 0) {
            int64_t t = ((int64_t)r * m - 1) / n; /* sigma(r - 1) */
            phi += (double)b[(ptrdiff_t)ib[t] * sb] * (ar - prev);
        }
        double v = 0.5 * ar * ar - phi;
        f[ia[r]] = v;
        sum += v;
        prev = ar;
    }
    return sum / n;
}

/* L random unit directions in R^d (normalised Gaussians by Box-Muller on the
 * splitmix64 stream from seed): ESP's and ASAP's slice banks. */
void bki_unit_directions(uint64_t seed, int L, int d, float *theta)
{
    uint64_t st = seed;
    for (int l = 0; l < L; l++) {
        double nrm = 0.0;
        for (int x = 0; x < d; x++) {
            const double g = bki_gauss(&st);
            theta[(size_t)l * d + x] = (float)g;
            nrm += g * g;
        }
        float inv = (float)(1.0 / sqrt(nrm > 0 ? nrm : 1.0));
        for (int x = 0; x < d; x++) theta[(size_t)l * d + x] *= inv;
    }
}
