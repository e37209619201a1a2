/* sort1d.c -- the one sort / 1-D transport engine: stable argsort of float
 * keys and the exact 1-D optimal transport plan between uniform measures
 * (north-west-corner rule). Used by ESP (per-slice matchings) and, later, by
 * ASAP's sliced potentials. */
#include "internal.h"

#include <string.h>

/* Order-preserving map float -> uint32 (-0 and +0 map to the same key). */
static inline uint32_t key_of(float x)
{
    x += 0.0f; /* -0 -> +0 */
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

size_t bki_argsort_scratch(int n) { return 2 * (size_t)n * sizeof(uint32_t) * 2; }

/* Stable ascending argsort: idx[r] = index of the r-th smallest key (ties by
 * index). LSD radix sort, 4 passes of 8 bits (insertion sort below 32).
 * scratch: bki_argsort_scratch(n) bytes. Keys must not be NaN. */
void bki_argsort(int n, const float *x, ptrdiff_t stride, int32_t *idx, void *scratch)
{
    if (n <= 32) {
        for (int i = 0; i < n; i++) {
            uint32_t k = key_of(x[(ptrdiff_t)i * stride]);
            int j = i;
            while (j > 0 && key_of(x[(ptrdiff_t)idx[j - 1] * stride]) > k) {
                idx[j] = idx[j - 1];
                j--;
            }
            idx[j] = i;
        }
        return;
    }
    uint32_t *k0 = scratch, *k1 = k0 + n;
    uint32_t *i0 = k1 + n, *i1 = i0 + n;
    for (int i = 0; i < n; i++) {
        k0[i] = key_of(x[(ptrdiff_t)i * stride]);
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
