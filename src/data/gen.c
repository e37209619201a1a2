/* gen.c -- procedural data sets: ListOps and point-cloud shapes.
 * See birkhoff/data.h ("Generated datasets") for the definitions. */
#include "../core/internal.h"

#include <math.h>

/* Bit-identical output needs unfused multiply-adds. GCC fuses none in ISO
 * mode (-std=c11). Clang fuses by default, so switch that off here. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

/* ------------------------------------------------------------------------
 * counter-based random numbers: a splitmix64 stream keyed by
 * (seed, index, data set)
 * --------------------------------------------------------------------- */
#define GEN_DOM_LISTOPS 0x4C6973744F707321ull /* "ListOps!" */
#define GEN_DOM_SHAPES 0x5368617065733344ull  /* "Shapes3D" */
#define GEN_DOM_LABELS 0x4C6162656C733132ull  /* "Labels12" */

typedef struct {
    uint64_t s;
} gen_rng;

static uint64_t gen_key(uint64_t seed, uint64_t index, uint64_t domain)
{
    uint64_t k = bki_mix64_fin(seed + domain);
    return bki_mix64_fin(k ^ bki_mix64_fin(index + 0x632BE59BD9B4E019ull));
}

static uint64_t gen_next(gen_rng *r) { return bki_mix64(&r->s); }

/* uniform integer in [0, n), 1 <= n < 2^32; the bias is below n / 2^32 */
static int gen_below(gen_rng *r, int n)
{
    return (int)(((gen_next(r) >> 32) * (uint64_t)n) >> 32);
}

/* uniform double in [0, 1) with 53 random bits */
static double gen_unif(gen_rng *r)
{
    return (double)(gen_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

/* ========================================================================
 * ListOps
 * ===================================================================== */
#define GEN_LO_MAXDEPTH 10
#define GEN_LO_MAXARGS 10
#define GEN_LO_LCAP (1 << 20) /* lengths beyond this are never needed */

typedef struct {
    gen_rng rng;
    int A;                        /* max_args */
    int L[GEN_LO_MAXDEPTH + 1];   /* L[d]: longest expression of depth <= d (L[0] = 1: a digit) */
    int32_t *tok;
    int pos, cap;
    int broken; /* an internal invariant failed (never expected) */
} gen_lctx;

static void gen_lo_init_lengths(gen_lctx *c, int max_depth)
{
    c->L[0] = 1;
    for (int d = 1; d <= GEN_LO_MAXDEPTH; d++) {
        long long v = (long long)c->A * c->L[d - 1] + 2;
        c->L[d] = (d <= max_depth && v < GEN_LO_LCAP) ? (int)v : GEN_LO_LCAP;
        if (d > max_depth) c->L[d] = c->L[max_depth];
    }
}

/* Can r expressions of depth <= dd (digits or operations) have exactly
 * R tokens in total? Expression lengths are {1} u F(dd), where F(dd), the
 * possible operation lengths, is [4, L(dd)] (minus 6 when A == 3, or only
 * the lengths = 1 mod 3 when A == 2). The sets of sums follow from that:
 *   A >= 4: R == r, or r+3 <= R <= r*L
 *   A == 3: the same, but R != r+5
 *   A == 2: r <= R <= r*L and R = r mod 3
 * tests/data/test_gen.c checks this against a dynamic program. */
static int gen_lo_fill_ok(const gen_lctx *c, int R, int r, int dd)
{
    if (r == 0) return R == 0;
    if (dd == 0) return R == r;
    if (R < r || (long long)R > (long long)r * c->L[dd]) return 0;
    if (c->A == 2) return (R - r) % 3 == 0;
    if (R != r && R < r + 3) return 0;
    if (c->A == 3 && R == r + 5) return 0;
    return 1;
}

/* can an operation of depth <= d (d >= 1) have exactly n tokens? */
static int gen_lo_op_ok(const gen_lctx *c, int n, int d)
{
    if (d < 1 || n < 4) return 0;
    for (int k = 2; k <= c->A; k++)
        if (gen_lo_fill_ok(c, n - 2, k, d - 1)) return 1;
    return 0;
}

static int gen_lo_expr_ok(const gen_lctx *c, int n, int dd)
{
    return n == 1 || gen_lo_op_ok(c, n, dd);
}

/* The size of the next argument: R tokens are left for r >= 2 arguments of
 * depth <= dd. The proposal is the first part of a uniform random
 * composition of R into r parts: 1 + the smallest of r-1 uniform cut
 * points. It is then moved to the nearest size that works. */
static int gen_lo_share(gen_lctx *c, int R, int r, int dd)
{
    int Ld = c->L[dd];
    long long lo_ll = (long long)R - (long long)(r - 1) * Ld;
    int lo = lo_ll > 1 ? (int)lo_ll : 1;
    int hi = R - (r - 1) < Ld ? R - (r - 1) : Ld;
    int span = R - r + 1; /* cut points 0..R-r */
    if (span < 1 || lo > hi) {
        c->broken = 1;
        return 1;
    }
    int p = span;
    for (int j = 0; j < r - 1; j++) {
        int u = gen_below(&c->rng, span);
        if (u < p) p = u;
    }
    p += 1;
    if (p < lo) p = lo;
    if (p > hi) p = hi;
    int up_first = gen_below(&c->rng, 2);
    for (int delta = 0; p - delta >= lo || p + delta <= hi; delta++) {
        for (int side = 0; side < 2; side++) {
            int s = ((side == 0) == (up_first != 0)) ? p + delta : p - delta;
            if (s < lo || s > hi) continue;
            if (gen_lo_expr_ok(c, s, dd) && gen_lo_fill_ok(c, R - s, r - 1, dd)) return s;
            if (delta == 0) break;
        }
    }
    c->broken = 1;
    return 1;
}

/* The value of an operation, from its argument values (each 0..9). The
 * median uses counts. */
static int gen_lo_apply(int op, const int *v, int k)
{
    int acc, cnt[10] = {0};
    switch (op) {
    case BK_LISTOPS_TOK_MIN:
        acc = 9;
        for (int i = 0; i < k; i++) acc = v[i] < acc ? v[i] : acc;
        return acc;
    case BK_LISTOPS_TOK_MAX:
        acc = 0;
        for (int i = 0; i < k; i++) acc = v[i] > acc ? v[i] : acc;
        return acc;
    case BK_LISTOPS_TOK_SM:
        acc = 0;
        for (int i = 0; i < k; i++) acc += v[i];
        return acc % 10;
    default: { /* MED: the value(s) at rank (k-1)/2 and k/2 */
        for (int i = 0; i < k; i++) cnt[v[i]]++;
        int ra = (k - 1) / 2, rb = k / 2, a = -1, b = -1, seen = 0;
        for (int x = 0; x < 10; x++) {
            if (a < 0 && seen + cnt[x] > ra) a = x;
            if (b < 0 && seen + cnt[x] > rb) b = x;
            seen += cnt[x];
        }
        return (a + b) / 2;
    }
    }
}

static void gen_lo_put(gen_lctx *c, int32_t t)
{
    if (c->pos < c->cap) c->tok[c->pos] = t;
    else c->broken = 1;
    c->pos++;
}

/* Writes an operation of exactly n tokens and depth <= d (n must work,
 * i.e. gen_lo_op_ok(n, d)). Returns its value. */
static int gen_lo_build(gen_lctx *c, int n, int d)
{
    int ks[GEN_LO_MAXARGS], nk = 0;
    for (int k = 2; k <= c->A; k++)
        if (gen_lo_fill_ok(c, n - 2, k, d - 1)) ks[nk++] = k;
    if (nk == 0) {
        c->broken = 1;
        return 0;
    }
    int k = ks[gen_below(&c->rng, nk)];
    int op = BK_LISTOPS_TOK_MIN + gen_below(&c->rng, 4);
    int vals[GEN_LO_MAXARGS];
    gen_lo_put(c, op);
    int R = n - 2;
    for (int i = 0; i < k; i++) {
        int r = k - i;
        int s = r == 1 ? R : gen_lo_share(c, R, r, d - 1);
        if (s == 1) {
            vals[i] = gen_below(&c->rng, 10);
            gen_lo_put(c, vals[i]);
        } else {
            vals[i] = gen_lo_build(c, s, d - 1);
        }
        R -= s;
    }
    gen_lo_put(c, BK_LISTOPS_TOK_CLOSE);
    return gen_lo_apply(op, vals, k);
}

bk_listops_config bk_listops_config_default(int max_len)
{
    bk_listops_config o;
    o.max_len = max_len;
    o.min_len = max_len / 4 > 5 ? max_len / 4 : 5;
    o.max_depth = 10;
    o.max_args = 10;
    return o;
}

/* Checks o and sets up c (lengths table). */
static bk_status gen_lo_setup(const bk_listops_config *o, gen_lctx *c)
{
    if (!o) return bki_fail(BK_ERR_NULL, "listops: no options");
    if (o->max_len < 5 || o->max_len > BK_LISTOPS_MAXLEN)
        return bki_fail(BK_ERR_PARAM, "listops: max_len %d out of range [5, %d]", o->max_len, BK_LISTOPS_MAXLEN);
    if (o->min_len < 5 || o->min_len > o->max_len)
        return bki_fail(BK_ERR_PARAM, "listops: min_len %d out of range [5, max_len=%d]", o->min_len, o->max_len);
    if (o->max_depth < 1 || o->max_depth > GEN_LO_MAXDEPTH)
        return bki_fail(BK_ERR_PARAM, "listops: max_depth %d out of range [1, %d]", o->max_depth, GEN_LO_MAXDEPTH);
    if (o->max_args < 2 || o->max_args > GEN_LO_MAXARGS)
        return bki_fail(BK_ERR_PARAM, "listops: max_args %d out of range [2, %d]", o->max_args, GEN_LO_MAXARGS);
    c->A = o->max_args;
    gen_lo_init_lengths(c, o->max_depth);
    int Lmax = c->L[o->max_depth];
    if (o->min_len > Lmax)
        return bki_fail(BK_ERR_PARAM,
                        "listops: min_len %d is longer than any tree with max_depth %d and max_args %d "
                        "(at most %d tokens)",
                        o->min_len, o->max_depth, o->max_args, Lmax);
    /* In [4, Lmax], every 3 consecutive lengths include one that works. */
    int hi = o->max_len < Lmax ? o->max_len : Lmax;
    for (int n = o->min_len; n <= hi && n < o->min_len + 3; n++)
        if (gen_lo_op_ok(c, n, o->max_depth)) return BK_OK;
    return bki_fail(BK_ERR_PARAM,
                    "listops: no tree with max_depth %d and max_args %d has a length in [%d, %d] "
                    "(max_args 2 gives only lengths = 1 mod 3; max_args 3 cannot give 6)",
                    o->max_depth, o->max_args, o->min_len, o->max_len);
}

bk_status bk_listops_check(const bk_listops_config *o)
{
    gen_lctx c;
    bki_clear_error();
    return gen_lo_setup(o, &c);
}

bk_status bk_listops_sample(uint64_t seed, uint64_t index, const bk_listops_config *o, int32_t *tokens, int *len,
                            int *label)
{
    gen_lctx c;
    bki_clear_error();
    bk_status st = gen_lo_setup(o, &c);
    if (st != BK_OK) return st;
    if (!tokens || !len || !label) return bki_fail(BK_ERR_NULL, "listops: null output pointer");
    c.rng.s = gen_key(seed, index, GEN_DOM_LISTOPS);
    c.tok = tokens;
    c.pos = 0;
    c.cap = o->max_len;
    c.broken = 0;

    int D = o->max_depth;
    int lo = o->min_len, hi = o->max_len < c.L[D] ? o->max_len : c.L[D];
    int n = lo + gen_below(&c.rng, hi - lo + 1);
    if (!gen_lo_op_ok(&c, n, D)) {
        /* the nearest length that works (gaps are at most 2 wide) */
        int up_first = gen_below(&c.rng, 2), found = 0;
        for (int delta = 1; !found && (n - delta >= lo || n + delta <= hi); delta++) {
            int a = up_first ? n + delta : n - delta, b = up_first ? n - delta : n + delta;
            if (a >= lo && a <= hi && gen_lo_op_ok(&c, a, D)) n = a, found = 1;
            else if (b >= lo && b <= hi && gen_lo_op_ok(&c, b, D)) n = b, found = 1;
        }
        if (!found) return bki_fail(BK_ERR_NUMERIC, "listops: internal error (no feasible length)");
    }
    int v = gen_lo_build(&c, n, D);
    if (c.broken || c.pos != n) return bki_fail(BK_ERR_NUMERIC, "listops: internal error (tree construction)");
    *len = n;
    *label = v;
    return BK_OK;
}

/* ========================================================================
 * Shapes
 * ===================================================================== */
#define GEN_PI 3.14159265358979323846
#define GEN_SQRT2 1.41421356237309504880

static const char *const gen_shape_names[BK_SHAPES_CLASSES] = {
    "sphere",    "box",     "cylinder", "cone",     "torus", "pyramid",
    "ellipsoid", "capsule", "helix",    "dumbbell", "disc",  "tetrahedron",
};

enum {
    GEN_SH_SPHERE,
    GEN_SH_BOX,
    GEN_SH_CYLINDER,
    GEN_SH_CONE,
    GEN_SH_TORUS,
    GEN_SH_PYRAMID,
    GEN_SH_ELLIPSOID,
    GEN_SH_CAPSULE,
    GEN_SH_HELIX,
    GEN_SH_DUMBBELL,
    GEN_SH_DISC,
    GEN_SH_TETRA
};

const char *bk_shapes_name(int label)
{
    if (label < 0 || label >= BK_SHAPES_CLASSES) return "?";
    return gen_shape_names[label];
}

/* sin and cos of 2*pi*t. We use our own polynomials so the results are the
 * same bits on every machine. Fold into a quadrant, then a Taylor series
 * on [0, pi/2): the truncation error is below 3e-16. */
static void gen_sincos_turn(double t, double *s, double *c)
{
    static const double S[] = {1.0,
                               -1.0 / 6.0,
                               1.0 / 120.0,
                               -1.0 / 5040.0,
                               1.0 / 362880.0,
                               -1.0 / 39916800.0,
                               1.0 / 6227020800.0,
                               -1.0 / 1307674368000.0,
                               1.0 / 355687428096000.0,
                               -1.0 / 121645100408832000.0,
                               1.0 / 51090942171709440000.0};
    static const double C[] = {1.0,
                               -1.0 / 2.0,
                               1.0 / 24.0,
                               -1.0 / 720.0,
                               1.0 / 40320.0,
                               -1.0 / 3628800.0,
                               1.0 / 479001600.0,
                               -1.0 / 87178291200.0,
                               1.0 / 20922789888000.0,
                               -1.0 / 6402373705728000.0,
                               1.0 / 2432902008176640000.0};
    t -= floor(t); /* exact */
    double q4 = t * 4.0;
    int q = (int)q4;
    if (q > 3) q = 3;
    double a = (q4 - q) * (GEN_PI / 2.0), a2 = a * a;
    double ps = S[10], pc = C[10];
    for (int i = 9; i >= 0; i--) {
        ps = ps * a2 + S[i];
        pc = pc * a2 + C[i];
    }
    ps *= a;
    switch (q) {
    case 0: *s = ps, *c = pc; break;
    case 1: *s = pc, *c = -ps; break;
    case 2: *s = -ps, *c = -pc; break;
    default: *s = -pc, *c = ps; break;
    }
}

/* a uniform point on the unit sphere (Archimedes: z is uniform) */
static void gen_sphere_pt(gen_rng *r, double p[3])
{
    double z = 2.0 * gen_unif(r) - 1.0, s, c;
    double rho = sqrt(1.0 - z * z > 0.0 ? 1.0 - z * z : 0.0);
    gen_sincos_turn(gen_unif(r), &s, &c);
    p[0] = rho * c, p[1] = rho * s, p[2] = z;
}

/* a uniform point in the unit disc, in the z = 0 plane */
static void gen_disc_pt(gen_rng *r, double p[3])
{
    double rho = sqrt(gen_unif(r)), s, c;
    gen_sincos_turn(gen_unif(r), &s, &c);
    p[0] = rho * c, p[1] = rho * s, p[2] = 0.0;
}

/* a uniform point in the triangle (a, b, c) */
static void gen_tri_pt(gen_rng *r, const double *a, const double *b, const double *c, double p[3])
{
    double u = gen_unif(r), v = gen_unif(r);
    if (u + v > 1.0) u = 1.0 - u, v = 1.0 - v;
    for (int i = 0; i < 3; i++) p[i] = a[i] + u * (b[i] - a[i]) + v * (c[i] - a[i]);
}

/* a point on the side of a cylinder along z: radius rad, z in [z0, z1] */
static void gen_tube_pt(gen_rng *r, double rad, double z0, double z1, double p[3])
{
    double s, c;
    gen_sincos_turn(gen_unif(r), &s, &c);
    p[0] = rad * c, p[1] = rad * s, p[2] = z0 + (z1 - z0) * gen_unif(r);
}

/* One surface point of class cls in the object frame. par holds the
 * per-sample proportions (3 uniforms in [0, 1)). */
static void gen_shape_pt(int cls, const double *par, gen_rng *r, double p[3])
{
    switch (cls) {
    case GEN_SH_SPHERE:
        gen_sphere_pt(r, p);
        return;
    case GEN_SH_BOX: { /* a box, half-sides (1, b, c); faces by area */
        double e[3] = {1.0, 0.75 + 0.25 * par[0], 0.75 + 0.25 * par[1]};
        double wx = e[1] * e[2], wy = e[2], wz = e[1], u = gen_unif(r) * (wx + wy + wz);
        int ax = u < wx ? 0 : u < wx + wy ? 1 : 2;
        p[ax] = gen_below(r, 2) ? e[ax] : -e[ax];
        p[(ax + 1) % 3] = e[(ax + 1) % 3] * (2.0 * gen_unif(r) - 1.0);
        p[(ax + 2) % 3] = e[(ax + 2) % 3] * (2.0 * gen_unif(r) - 1.0);
        return;
    }
    case GEN_SH_CYLINDER: { /* radius 1, half-height h; side 4*pi*h, caps 2*pi */
        double h = 0.6 + 0.9 * par[0];
        if (gen_unif(r) * (2.0 * h + 1.0) < 2.0 * h) {
            gen_tube_pt(r, 1.0, -h, h, p);
        } else {
            gen_disc_pt(r, p);
            p[2] = gen_below(r, 2) ? h : -h;
        }
        return;
    }
    case GEN_SH_CONE: { /* base radius 1 at z = 0, apex at z = H; lateral pi*sl, base pi */
        double H = 1.5 + 1.0 * par[0], sl = sqrt(1.0 + H * H);
        if (gen_unif(r) * (sl + 1.0) < sl) {
            double f = sqrt(gen_unif(r)), s, c; /* distance from the apex, as a fraction */
            gen_sincos_turn(gen_unif(r), &s, &c);
            p[0] = f * c, p[1] = f * s, p[2] = H * (1.0 - f);
        } else {
            gen_disc_pt(r, p);
        }
        return;
    }
    case GEN_SH_TORUS: { /* major radius 1, tube radius tr; area weight (1 + tr cos th) */
        double tr = 0.2 + 0.2 * par[0], st = 0.0, ct = 1.0, sp, cp;
        for (int tries = 0; tries < 16; tries++) { /* bounded rejection */
            gen_sincos_turn(gen_unif(r), &st, &ct);
            if (gen_unif(r) * (1.0 + tr) < 1.0 + tr * ct) break;
        }
        gen_sincos_turn(gen_unif(r), &sp, &cp);
        double rho = 1.0 + tr * ct;
        p[0] = rho * cp, p[1] = rho * sp, p[2] = tr * st;
        return;
    }
    case GEN_SH_PYRAMID: { /* square base [-1,1]^2 (area 4), apex (0,0,H); each side sqrt(1+H^2) */
        double H = 1.2 + 0.8 * par[0], side = sqrt(1.0 + H * H);
        static const double corner[4][3] = {{-1, -1, 0}, {1, -1, 0}, {1, 1, 0}, {-1, 1, 0}};
        if (gen_unif(r) * (4.0 + 4.0 * side) < 4.0) {
            p[0] = 2.0 * gen_unif(r) - 1.0, p[1] = 2.0 * gen_unif(r) - 1.0, p[2] = 0.0;
        } else {
            int f = gen_below(r, 4);
            const double apex[3] = {0.0, 0.0, H};
            gen_tri_pt(r, corner[f], corner[(f + 1) & 3], apex, p);
        }
        return;
    }
    case GEN_SH_ELLIPSOID: { /* semi-axes 1, b, c (not area-uniform: a scaled sphere) */
        double b = 0.55 + 0.2 * par[0], c = 0.3 + 0.15 * par[1];
        gen_sphere_pt(r, p);
        p[1] *= b, p[2] *= c;
        return;
    }
    case GEN_SH_CAPSULE: { /* radius rc, cylinder part z in [-1, 1]: side 4*pi*rc, balls 4*pi*rc^2 */
        double rc = 0.35 + 0.15 * par[0];
        if (gen_unif(r) * (1.0 + rc) < 1.0) {
            gen_tube_pt(r, rc, -1.0, 1.0, p);
        } else {
            gen_sphere_pt(r, p);
            for (int i = 0; i < 3; i++) p[i] *= rc;
            p[2] += p[2] >= 0.0 ? 1.0 : -1.0;
        }
        return;
    }
    case GEN_SH_HELIX: { /* radius 1, `turns` turns over z in [-hh, hh], a tube of radius 0.12 */
        double turns = 2.5 + 1.5 * par[0], hh = 0.8 + 0.7 * par[1], t = gen_unif(r), s, c, q[3];
        gen_sincos_turn(turns * t, &s, &c);
        gen_sphere_pt(r, q);
        p[0] = c + 0.12 * q[0], p[1] = s + 0.12 * q[1], p[2] = hh * (2.0 * t - 1.0) + 0.12 * q[2];
        return;
    }
    case GEN_SH_DUMBBELL: { /* balls of radius a at x = +-1, a rod of radius 0.08 between them */
        double a = 0.35 + 0.15 * par[0], rod = 0.08, half = 1.0 - a;
        double ball = 8.0 * a * a, bar = 2.0 * rod * 2.0 * half; /* areas / pi */
        if (gen_unif(r) * (ball + bar) < ball) {
            gen_sphere_pt(r, p);
            for (int i = 0; i < 3; i++) p[i] *= a;
            p[0] += gen_below(r, 2) ? 1.0 : -1.0;
        } else {
            double q[3];
            gen_tube_pt(r, rod, -half, half, q);
            p[0] = q[2], p[1] = q[0], p[2] = q[1];
        }
        return;
    }
    case GEN_SH_DISC: { /* outer radius 1, a hole of radius ri in [0, 0.45) (area-uniform) */
        double ri = 0.45 * par[0], rho = sqrt(ri * ri + gen_unif(r) * (1.0 - ri * ri)), s, c;
        gen_sincos_turn(gen_unif(r), &s, &c);
        p[0] = rho * c, p[1] = rho * s, p[2] = 0.0;
        return;
    }
    default: { /* GEN_SH_TETRA: regular, 4 faces of equal area */
        static const double v[4][3] = {{1, 1, 1}, {1, -1, -1}, {-1, 1, -1}, {-1, -1, 1}};
        int f = gen_below(r, 4);
        gen_tri_pt(r, v[(f + 1) & 3], v[(f + 2) & 3], v[(f + 3) & 3], p);
        return;
    }
    }
}

int bk_shapes_label(uint64_t seed, uint64_t index)
{
    gen_rng r;
    int perm[BK_SHAPES_CLASSES];
    r.s = gen_key(seed, index / BK_SHAPES_CLASSES, GEN_DOM_LABELS);
    for (int i = 0; i < BK_SHAPES_CLASSES; i++) perm[i] = i;
    for (int i = BK_SHAPES_CLASSES - 1; i > 0; i--) {
        int j = gen_below(&r, i + 1), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    return perm[index % BK_SHAPES_CLASSES];
}

bk_shapes_config bk_shapes_config_default(int points)
{
    bk_shapes_config o;
    o.points = points;
    o.noise = 0.02f;
    return o;
}

bk_status bk_shapes_check(const bk_shapes_config *o)
{
    bki_clear_error();
    if (!o) return bki_fail(BK_ERR_NULL, "shapes: no options");
    if (o->points < BK_SHAPES_MIN_POINTS || o->points > BK_SHAPES_MAX_POINTS)
        return bki_fail(BK_ERR_PARAM, "shapes: points %d out of range [%d, %d]", o->points, BK_SHAPES_MIN_POINTS,
                        BK_SHAPES_MAX_POINTS);
    if (!(o->noise >= 0.0f && o->noise <= 1.0f)) /* also rejects NaN */
        return bki_fail(BK_ERR_PARAM, "shapes: noise %g out of range [0, 1]", (double)o->noise);
    return BK_OK;
}

/* the object-frame point j, scaled and rotated by M */
static void gen_posed_pt(int cls, const double *par, double M[3][3], uint64_t pkey, int j, double y[3])
{
    gen_rng pr;
    double p[3];
    pr.s = bki_mix64_fin(pkey + (uint64_t)j * 0xD1B54A32D192ED03ull);
    gen_shape_pt(cls, par, &pr, p);
    for (int i = 0; i < 3; i++) y[i] = M[i][0] * p[0] + M[i][1] * p[1] + M[i][2] * p[2];
}

bk_status bk_shapes_sample(uint64_t seed, uint64_t index, const bk_shapes_config *o, float *xyz, int *label)
{
    bk_status st = bk_shapes_check(o);
    if (st != BK_OK) return st;
    if (!xyz || !label) return bki_fail(BK_ERR_NULL, "shapes: null output pointer");
    const int n = o->points;
    const int cls = bk_shapes_label(seed, index);
    gen_rng r;
    r.s = gen_key(seed, index, GEN_DOM_SHAPES);

    double par[3];
    for (int i = 0; i < 3; i++) par[i] = gen_unif(&r);
    double sc[3];
    for (int i = 0; i < 3; i++) sc[i] = 0.9 + 0.2 * gen_unif(&r);
    /* uniform rotation from a random unit quaternion (Shoemake) */
    double u1 = gen_unif(&r), s2, c2, s3, c3;
    gen_sincos_turn(gen_unif(&r), &s2, &c2);
    gen_sincos_turn(gen_unif(&r), &s3, &c3);
    double qa = sqrt(1.0 - u1), qb = sqrt(u1);
    double w = qa * s2, x = qa * c2, y = qb * s3, z = qb * c3;
    const double R[3][3] = {
        {1.0 - 2.0 * (y * y + z * z), 2.0 * (x * y - w * z), 2.0 * (x * z + w * y)},
        {2.0 * (x * y + w * z), 1.0 - 2.0 * (x * x + z * z), 2.0 * (y * z - w * x)},
        {2.0 * (x * z - w * y), 2.0 * (y * z + w * x), 1.0 - 2.0 * (x * x + y * y)},
    };
    double M[3][3]; /* R * diag(sc) */
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 3; k++) M[i][k] = R[i][k] * sc[k];
    const uint64_t pkey = gen_next(&r);

    /* pass 1: the mean. pass 2: the same points again, centred, stored,
     * and the largest radius. */
    double mean[3] = {0.0, 0.0, 0.0}, pt[3];
    for (int j = 0; j < n; j++) {
        gen_posed_pt(cls, par, M, pkey, j, pt);
        for (int i = 0; i < 3; i++) mean[i] += pt[i];
    }
    for (int i = 0; i < 3; i++) mean[i] /= n;
    double r2max = 0.0;
    for (int j = 0; j < n; j++) {
        gen_posed_pt(cls, par, M, pkey, j, pt);
        double r2 = 0.0;
        for (int i = 0; i < 3; i++) {
            pt[i] -= mean[i];
            r2 += pt[i] * pt[i];
            xyz[3 * j + i] = (float)pt[i];
        }
        if (r2 > r2max) r2max = r2;
    }
    const double inv = r2max > 0.0 ? 1.0 / sqrt(r2max) : 1.0;
    const double sd = o->noise;
    for (int k = 0; k < 3 * n; k++) {
        double v = (double)xyz[k] * inv;
        if (sd > 0.0) { /* approximately Gaussian: (sum of 6 uniforms - 3) * sqrt(2) has sd 1 */
            double g = -3.0;
            for (int t = 0; t < 6; t++) g += gen_unif(&r);
            v += sd * GEN_SQRT2 * g;
        }
        xyz[k] = (float)v;
    }
    *label = cls;
    return BK_OK;
}
