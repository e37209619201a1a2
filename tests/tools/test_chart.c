/* test_chart.c -- standalone checks of tools/plot/chart.c: every chart kind in PNG and SVG, image sizes,
 * content (series colour, heat-map colours and pixelation, transport segments), bad input and I/O
 * errors, non-finite data, atomic output (no temporaries left). The checks are the harness's
 * (tests/harness.h): one line per check and "N passed, N failed"; exits non-zero on failure.
 *
 *   gcc -std=c11 -O2 -Wall -Wextra -Werror -Wshadow -D_POSIX_C_SOURCE=200809L $(pkg-config --cflags cairo) \
 *       -Iinclude -Itools/plot tests/tools/test_chart.c tests/harness.c tools/plot/chart.c build/libbirkhoff.a \
 *       -o /tmp/test_chart $(pkg-config --libs cairo) -lm (and the library's link flags: the Makefile's $(TCHART))
 */
#include "chart.h"
#include "../harness.h"

#include <cairo.h>
#include <dirent.h>
#include <dlfcn.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    char dir[64]; /* the temporary directory */
} tally;

/* one check of the harness (tests/harness.h), its description formatted */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static int check(const tally *t, int cond, const char *fmt, ...)
{
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    (void)t;
    return th_check(cond, "chart", "%s", what);
}

/* ---- file and image helpers ----------------------------------------------------------------- */

static void out_path(const tally *t, char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", t->dir, name);
}

static int file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

static int file_starts(const char *path, const char *prefix)
{
    char buf[16] = {0};
    size_t len = strlen(prefix);
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    size_t got = fread(buf, 1, len, f);
    fclose(f);
    return got == len && memcmp(buf, prefix, len) == 0;
}

/* the files in the test directory that look like temporaries: ".tmp." (the
 * old writers' names) or ".bk-" (the output sets' own, src/core/outfile.c) */
static int leftovers(const tally *t)
{
    DIR *d = opendir(t->dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) n += strstr(e->d_name, ".tmp.") != NULL || strstr(e->d_name, ".bk-") != NULL;
    closedir(d);
    return n;
}

static cairo_surface_t *load_png(const char *path)
{
    cairo_surface_t *s = cairo_image_surface_create_from_png(path);
    if (cairo_surface_status(s) != CAIRO_STATUS_SUCCESS) {
        cairo_surface_destroy(s);
        return NULL;
    }
    cairo_surface_flush(s);
    return s;
}

static uint32_t pixel_at(cairo_surface_t *s, int x, int y)
{
    const unsigned char *row = cairo_image_surface_get_data(s) + (size_t)y * (size_t)cairo_image_surface_get_stride(s);
    uint32_t p;
    memcpy(&p, row + 4 * (size_t)x, 4);
    return p & 0xffffff;
}

static int chan(uint32_t p, int k)
{
    return (int)((p >> (16 - 8 * k)) & 0xff);
}

static int near(uint32_t p, int r, int g, int b, int tol)
{
    return abs(chan(p, 0) - r) <= tol && abs(chan(p, 1) - g) <= tol && abs(chan(p, 2) - b) <= tol;
}

static int greyish(uint32_t p)
{
    int lo = chan(p, 0), hi = lo;
    for (int k = 1; k < 3; k++) {
        lo = chan(p, k) < lo ? chan(p, k) : lo;
        hi = chan(p, k) > hi ? chan(p, k) : hi;
    }
    return hi - lo <= 8;
}

static long count_near(cairo_surface_t *s, int r, int g, int b, int tol)
{
    long n = 0;
    int w = cairo_image_surface_get_width(s), h = cairo_image_surface_get_height(s);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) n += near(pixel_at(s, x, y), r, g, b, tol);
    return n;
}

/* number of distinct colours that are not grey (capped at cap) */
static int colourful(cairo_surface_t *s, int cap)
{
    uint32_t seen[4096];
    int n = 0, w = cairo_image_surface_get_width(s), h = cairo_image_surface_get_height(s);
    for (int y = 0; y < h && n < cap; y++)
        for (int x = 0; x < w && n < cap; x++) {
            uint32_t p = pixel_at(s, x, y);
            if (greyish(p)) continue;
            int k = 0;
            while (k < n && seen[k] != p) k++;
            if (k == n && n < 4096) seen[n++] = p;
        }
    return n;
}

static int rgb255(double v)
{
    return (int)lround(v * 255);
}

/* ok, the PNG signature and size of a written PNG; returns the image (or NULL) for more checks */
static cairo_surface_t *check_png(tally *t, int rc, const char *err, const char *path, int w, int h, const char *what)
{
    check(t, rc == 1, "%s: returns 1%s%s", what, rc ? "" : ": ", rc ? "" : err);
    check(t, file_starts(path, "\x89PNG\r\n\x1a\n"), "%s: %s starts with the PNG signature", what, path);
    cairo_surface_t *s = load_png(path);
    check(t, s != NULL, "%s: PNG decodes", what);
    if (!s) return NULL;
    int gw = cairo_image_surface_get_width(s), gh = cairo_image_surface_get_height(s);
    check(t, gw == w && gh == h, "%s: size %d x %d (expected %d x %d)", what, gw, gh, w, h);
    return s;
}

static void check_svg(tally *t, int rc, const char *err, const char *path, const char *what)
{
    check(t, rc == 1, "%s: returns 1%s%s", what, rc ? "" : ": ", rc ? "" : err);
    check(t, file_starts(path, "<?xml") || file_starts(path, "<svg"), "%s: %s starts like an SVG document", what,
          path);
}

/* ---- line charts ---------------------------------------------------------------------------- */

static void test_lines(tally *t)
{
    enum { N = 100 };
    double x[N], y1[N], y2[N], y3[N];
    for (int i = 0; i < N; i++) {
        x[i] = i;
        y1[i] = exp(-i / 30.0) + 0.1;
        y2[i] = 0.5 + 0.4 * sin(i / 10.0);
        y3[i] = 1 - exp(-i / 20.0);
    }
    y2[40] = NAN; /* breaks the line */
    chart_series loss[2] = {{"train", N, x, y1}, {"valid", N, x, y2}};
    chart_series acc[2] = {{"train", N, x, y3}, {"valid", N, x, y2}};
    chart_panel panels[2] = {{"loss", "step", "loss", 1, 2, loss, 0}, {"accuracy", "step", "accuracy", 0, 2, acc, 0}};
    char path[256], err[256] = "";

    out_path(t, path, sizeof path, "lines.png");
    int rc = chart_lines(path, "training", 2, panels, err, sizeof err);
    cairo_surface_t *s = check_png(t, rc, err, path, 2 * CHART_PANEL_W, CHART_TITLE_H + CHART_PANEL_H, "lines png");
    if (s) cairo_surface_destroy(s);

    out_path(t, path, sizeof path, "lines.svg");
    rc = chart_lines(path, "training", 2, panels, err, sizeof err);
    check_svg(t, rc, err, path, "lines svg");

    /* one series, no figure title: its colour (palette 0, red) is on the image */
    double r, g, b;
    chart_palette(0, &r, &g, &b);
    check(t, r > 0.7 && g < 0.3 && b < 0.3, "palette colour 0 is red (%.2f %.2f %.2f)", r, g, b);
    chart_panel one = {"one series", "x", "y", 0, 1, loss, 0};
    out_path(t, path, sizeof path, "red.png");
    rc = chart_lines(path, NULL, 1, &one, err, sizeof err);
    s = check_png(t, rc, err, path, CHART_PANEL_W, CHART_PANEL_H, "one-series lines png");
    if (s) {
        long n = count_near(s, rgb255(r), rgb255(g), rgb255(b), 24);
        check(t, n >= 300, "one-series lines: %ld pixels of the series colour (>= 300)", n);
        chart_palette(1, &r, &g, &b);
        n = count_near(s, rgb255(r), rgb255(g), rgb255(b), 24);
        check(t, n == 0, "one-series lines: no pixel of the second series colour (%ld)", n);
        cairo_surface_destroy(s);
    }

    /* awkward data: all NaN, infinities, a constant, a single point, zeros and negatives on a log
     * axis, an empty series, a panel without series */
    double nan[3] = {NAN, NAN, NAN}, inf[3] = {INFINITY, -INFINITY, 1}, cst[3] = {2, 2, 2}, neg[3] = {-1, 0, 1e-300};
    double big[3] = {1e300, -1e300, 1e-300};
    chart_series odd[6] = {{"nan", 3, x, nan}, {"inf", 3, inf, inf},   {"constant", 3, x, cst},
                           {"point", 1, x, y1}, {"empty", 0, NULL, NULL}, {NULL, 3, big, big}};
    chart_panel oddp[4] = {{"odd", "x", "y", 0, 6, odd, 0},
                           {"odd log", "x", "y", 1, 6, odd, 1},
                           {"negative log", NULL, NULL, 1, 1, (chart_series[]){{"neg", 3, x, neg}}, 0},
                           {NULL, NULL, NULL, 0, 0, NULL, 0}};
    const char *names[2] = {"odd.png", "odd.svg"};
    for (int k = 0; k < 2; k++) {
        out_path(t, path, sizeof path, names[k]);
        rc = chart_lines(path, "non-finite and degenerate data", 4, oddp, err, sizeof err);
        check(t, rc == 1 && file_exists(path), "lines with NaN/Inf/degenerate data succeed (%s)%s%s", names[k],
              rc ? "" : ": ", rc ? "" : err);
    }
    rc = chart_lines(path, NULL, 0, panels, err, sizeof err);
    check(t, rc == 0 && err[0], "lines: no panels -> 0 (%s)", err);

    /* a line along the top and one along the bottom, both across the whole panel: every corner has
     * data, so the legend must make room above them instead of covering one (each line's row of its
     * colour runs unbroken between its first and last pixel); 3 epochs on an integer x axis: vertical
     * grid lines at 1, 2, 3 only (not at 1.5, 2.5), counted along the empty middle row */
    double ep[3] = {1, 2, 3}, top[3] = {0.9, 0.9, 0.9}, bottom[3] = {0.1, 0.1, 0.1};
    chart_series tb[2] = {{"along the top", 3, ep, top}, {"along the bottom", 3, ep, bottom}};
    for (int xint = 0; xint < 2; xint++) {
        chart_panel tbp = {"legend room", "epoch", "y", 0, 2, tb, xint};
        out_path(t, path, sizeof path, xint ? "legend-int.png" : "legend.png");
        rc = chart_lines(path, NULL, 1, &tbp, err, sizeof err);
        s = check_png(t, rc, err, path, CHART_PANEL_W, CHART_PANEL_H, "top/bottom lines png");
        if (!s) continue;
        const int W = cairo_image_surface_get_width(s), H = cairo_image_surface_get_height(s);
        int ytop = -1, ybot = -1;
        for (int c = 0; c < 2; c++) {
            chart_palette(c, &r, &g, &b);
            int best = -1, bestn = 0, gap = 0;
            for (int y = 0; y < H; y++) {
                int n = 0;
                for (int x0 = 0; x0 < W; x0++) n += near(pixel_at(s, x0, y), rgb255(r), rgb255(g), rgb255(b), 24);
                if (n > bestn) {
                    bestn = n;
                    best = y;
                }
            }
            int first = -1, last = -1;
            for (int x0 = 0; x0 < W; x0++)
                if (near(pixel_at(s, x0, best), rgb255(r), rgb255(g), rgb255(b), 24)) {
                    if (first < 0) first = x0;
                    last = x0;
                }
            for (int x0 = first; x0 >= 0 && x0 <= last; x0++)
                gap += !near(pixel_at(s, x0, best), rgb255(r), rgb255(g), rgb255(b), 60);
            check(t, best >= 0 && last - first > W / 2 && gap <= 8,
                  "legend: series %d's line (row %d, %d px wide) is not covered (%d px not of its colour: the "
                  "markers' rims, <= 8; a legend over it hides > 100)", c, best, last - first, gap);
            if (c == 0) ytop = best;
            else ybot = best;
        }
        if (xint && ytop >= 0 && ybot > ytop) {
            const int ymid = (ytop + ybot) / 2;
            int lines = 0, prev = 0;
            for (int x0 = 0; x0 < W; x0++) {
                const int gr = near(pixel_at(s, x0, ymid), 230, 230, 230, 6);
                lines += gr && !prev;
                prev = gr;
            }
            check(t, lines == 3, "integer x axis over epochs 1..3: %d vertical grid lines (3: no 1.5, 2.5)", lines);
        }
        cairo_surface_destroy(s);
    }
    chart_series bad = {"bad", 3, NULL, y1};
    chart_panel badp = {NULL, NULL, NULL, 0, 1, &bad, 0};
    rc = chart_lines(path, NULL, 1, &badp, err, sizeof err);
    check(t, rc == 0 && err[0], "lines: NULL x with n > 0 -> 0 (%s)", err);
}

/* ---- histograms ----------------------------------------------------------------------------- */

static void test_histograms(tally *t)
{
    enum { N = 2000 };
    static double a[N], c[N], d[N];
    unsigned seed = 7;
    for (int i = 0; i < N; i++) {
        seed = seed * 1664525u + 1013904223u;
        double u = (seed >> 8) / 16777216.0;
        a[i] = 0.2 + 2 * u * u;
        c[i] = 1 + 0.05 * (u - 0.5);
        d[i] = i % 5 == 0 ? NAN : i % 7 == 0 ? INFINITY : 1.0;
    }
    chart_hist h[3] = {{"softmax", N, a}, {"sinkhorn", N, c}, {"with NaN and Inf", N, d}};
    char path[256], err[256] = "";

    out_path(t, path, sizeof path, "hist.png");
    int rc = chart_histograms(path, "column sums", 3, 2, h, 40, 0, 0, 1.0, "column sum", err, sizeof err);
    cairo_surface_t *s =
        check_png(t, rc, err, path, 2 * CHART_PANEL_W, CHART_TITLE_H + 2 * CHART_PANEL_H, "histograms png");
    if (s) {
        double r, g, b;
        chart_palette(1, &r, &g, &b); /* bars: palette 1 at 85% opacity on white */
        long n = count_near(s, rgb255(0.85 * r + 0.15), rgb255(0.85 * g + 0.15), rgb255(0.85 * b + 0.15), 6);
        check(t, n >= 1000, "histograms: %ld bar pixels (>= 1000)", n);
        chart_palette(0, &r, &g, &b);
        n = count_near(s, rgb255(r), rgb255(g), rgb255(b), 30);
        check(t, n >= 50, "histograms: reference line pixels (%ld)", n);
        cairo_surface_destroy(s);
    }
    out_path(t, path, sizeof path, "hist.svg");
    rc = chart_histograms(path, "column sums", 3, 2, h, 40, 0, 0, 1.0, "column sum", err, sizeof err);
    check_svg(t, rc, err, path, "histograms svg");

    /* explicit range with values outside it, one column, no reference, a constant panel, an empty one */
    double cst[4] = {3, 3, 3, 3};
    chart_hist h2[4] = {{"clamped", N, a}, {"constant", 4, cst}, {"empty", 0, NULL}, {"all NaN", 1, d}};
    out_path(t, path, sizeof path, "hist2.png");
    rc = chart_histograms(path, NULL, 4, 1, h2, 10, 0.5, 1.5, NAN, NULL, err, sizeof err);
    s = check_png(t, rc, err, path, CHART_PANEL_W, 4 * CHART_PANEL_H, "clamped histograms png");
    if (s) cairo_surface_destroy(s);
    out_path(t, path, sizeof path, "hist3.png");
    rc = chart_histograms(path, NULL, 1, 3, &h2[1], 1, 0, 0, 3, "x", err, sizeof err);
    s = check_png(t, rc, err, path, CHART_PANEL_W, CHART_PANEL_H, "constant-data histogram (widened range)");
    if (s) cairo_surface_destroy(s);

    rc = chart_histograms(path, NULL, 1, 1, h, 0, 0, 0, 1, NULL, err, sizeof err);
    check(t, rc == 0 && err[0], "histograms: bins = 0 -> 0 (%s)", err);
    rc = chart_histograms(path, NULL, 1, 1, h, 10, 2, 1, 1, NULL, err, sizeof err);
    check(t, rc == 0 && err[0], "histograms: lo > hi -> 0 (%s)", err);
    rc = chart_histograms(path, NULL, 1, 1, h, 10, 0, NAN, 1, NULL, err, sizeof err);
    check(t, rc == 0 && err[0], "histograms: NaN range -> 0 (%s)", err);
}

/* ---- heat-maps ------------------------------------------------------------------------------ */

static void test_heatmaps(tally *t)
{
    enum { W = 16 };
    static float att[4][W * W], pic[28 * 28];
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < W; i++)
            for (int j = 0; j < W; j++) att[k][i * W + j] = (float)exp(-fabs((double)(i - j - k)) / (1 + k));
    att[3][5] = NAN;
    for (int i = 0; i < 28 * 28; i++) pic[i] = (float)((i % 28) / 27.0 * 1.2 - 0.1); /* clamped to [0, 1] */
    chart_map maps[6] = {{"head 0", W, W, att[0], 0}, {"head 1", W, W, att[1], 0}, {"head 2", W, W, att[2], 0},
                         {"head 0", W, 8, att[3], 0}, {"blank", W, W, NULL, 0},    {"picture", 28, 28, pic, 1}};
    const char *labels[2] = {"softmax", "a very long row label for sinkhorn"};
    char path[256], err[256] = "";

    out_path(t, path, sizeof path, "heat.png");
    int rc = chart_heatmaps(path, "attention", 2, 3, labels, maps, err, sizeof err);
    cairo_surface_t *s = check_png(t, rc, err, path, CHART_LABEL_W + 3 * CHART_MAP_W,
                                   CHART_TITLE_H + 2 * CHART_MAP_H, "heat-maps png");
    if (s) {
        int n = colourful(s, 100);
        check(t, n >= 2, "heat-maps: %d distinct colours in the panels (>= 2)", n);
        cairo_surface_destroy(s);
    }
    out_path(t, path, sizeof path, "heat.svg");
    rc = chart_heatmaps(path, "attention", 2, 3, labels, maps, err, sizeof err);
    check_svg(t, rc, err, path, "heat-maps svg");

    /* a 2 x 2 checkerboard fills the box with 128-pixel cells: every pixel of a low cell has exactly
     * the low colour (no smoothing across cell edges) */
    float checker[4] = {0, 1, 1, 0};
    chart_map cm = {NULL, 2, 2, checker, 0};
    out_path(t, path, sizeof path, "checker.png");
    rc = chart_heatmaps(path, NULL, 1, 1, NULL, &cm, err, sizeof err);
    s = check_png(t, rc, err, path, CHART_MAP_W, CHART_MAP_H, "checkerboard heat-map png");
    if (s) {
        int c = CHART_MAP_BOX / 2;
        long lo = count_near(s, 68, 1, 84, 0), hi = count_near(s, 253, 231, 37, 0);
        check(t, lo >= 2L * c * c && lo <= 2L * c * c + 200, "checkerboard: %ld pixels of the low colour (2 cells of %d^2)",
              lo, c);
        check(t, hi >= 2L * c * c && hi <= 2L * c * c + 200, "checkerboard: %ld pixels of the high colour", hi);
        cairo_surface_destroy(s);
    }

    /* all panels blank: no colour at all */
    chart_map blank[2] = {{"a", 4, 4, NULL, 0}, {"b", 0, 0, NULL, 0}};
    out_path(t, path, sizeof path, "blank.png");
    rc = chart_heatmaps(path, "blank", 1, 2, NULL, blank, err, sizeof err);
    s = check_png(t, rc, err, path, 2 * CHART_MAP_W, CHART_TITLE_H + CHART_MAP_H, "blank heat-maps png");
    if (s) {
        check(t, colourful(s, 10) == 0, "blank heat-maps: no coloured pixel");
        cairo_surface_destroy(s);
    }

    /* constant and all-NaN maps, a large map (scaled down) */
    static float cst[9] = {5, 5, 5, 5, 5, 5, 5, 5, 5}, nan[4] = {NAN, NAN, NAN, NAN};
    float *large = calloc(600 * 300, sizeof *large);
    if (large)
        for (int i = 0; i < 600 * 300; i++) large[i] = (float)(i % 600);
    chart_map odd[3] = {{"constant", 3, 3, cst, 0}, {"NaN", 2, 2, nan, 0}, {"large", 600, 300, large, 0}};
    out_path(t, path, sizeof path, "odd_heat.png");
    rc = chart_heatmaps(path, NULL, 1, 3, NULL, odd, err, sizeof err);
    check(t, rc == 1 && file_exists(path), "heat-maps with constant, NaN and large maps succeed%s%s", rc ? "" : ": ",
          rc ? "" : err);
    free(large);

    chart_map bad = {"bad", 0, 4, cst, 0};
    rc = chart_heatmaps(path, NULL, 1, 1, NULL, &bad, err, sizeof err);
    check(t, rc == 0 && err[0], "heat-maps: width 0 with data -> 0 (%s)", err);
}

/* ---- transport plans ------------------------------------------------------------------------ */

static void test_transport(tally *t)
{
    /* x on the left, y on the right; the identity plan joins them with two horizontal segments */
    float x[4] = {0, 0, 0, 1}, y[4] = {1, 0, 1, 1};
    float eye[4] = {0.5f, 0, 0, 0.5f}, zero[4] = {0, 0, 0, 0};
    chart_plan with = {"identity", eye}, without = {"identity", zero};
    char path[256], path0[256], err[256] = "";

    out_path(t, path, sizeof path, "plan.png");
    out_path(t, path0, sizeof path0, "plan0.png");
    int rc = chart_transport(path, NULL, 2, x, 2, y, 1, &with, err, sizeof err);
    cairo_surface_t *s = check_png(t, rc, err, path, CHART_PLAN_W, CHART_PLAN_H, "transport png");
    rc = chart_transport(path0, NULL, 2, x, 2, y, 1, &without, err, sizeof err);
    cairo_surface_t *s0 = check_png(t, rc, err, path0, CHART_PLAN_W, CHART_PLAN_H, "transport png, zero plan");
    if (s && s0) {
        /* the segments are the difference of the two pictures: dark slate at 80% opacity */
        long diff = 0, ink = 0;
        int xmin = CHART_PLAN_W, xmax = -1;
        for (int py = 0; py < CHART_PLAN_H; py++)
            for (int px = 0; px < CHART_PLAN_W; px++) {
                uint32_t p = pixel_at(s, px, py);
                if (p == pixel_at(s0, px, py)) continue;
                diff++;
                if (!near(p, 84, 92, 117, 12)) continue;
                ink++;
                xmin = px < xmin ? px : xmin;
                xmax = px > xmax ? px : xmax;
            }
        check(t, ink >= 600, "transport: %ld segment-coloured pixels (>= 600, of %ld changed)", ink, diff);
        check(t, xmax - xmin >= CHART_PLAN_W / 2, "transport: the segments span %d px between the points", xmax - xmin);
    }
    if (s) cairo_surface_destroy(s);
    if (s0) cairo_surface_destroy(s0);

    /* several plans, SVG, random-ish points with NaN points and NaN/negative plan entries */
    enum { N = 12, M = 9 };
    float xs[2 * N], ys[2 * M], p1[N * M], p2[N * M];
    for (int i = 0; i < N; i++) {
        xs[2 * i] = (float)cos(i);
        xs[2 * i + 1] = (float)sin(2.0 * i);
    }
    for (int j = 0; j < M; j++) {
        ys[2 * j] = (float)(3 + cos(3.0 * j));
        ys[2 * j + 1] = (float)sin(j);
    }
    for (int k = 0; k < N * M; k++) {
        p1[k] = (float)(1 + sin(k * 0.37)) / (N * M);
        p2[k] = k % M == (k / M) % M ? 1.0f / N : 0;
    }
    xs[3] = NAN;
    p1[5] = NAN;
    p1[6] = -1;
    chart_plan plans[3] = {{"Sinkhorn eps=0.1", p1}, {"ESP", p2}, {"points only", NULL}};
    out_path(t, path, sizeof path, "plans.svg");
    rc = chart_transport(path, "plans", N, xs, M, ys, 3, plans, err, sizeof err);
    check_svg(t, rc, err, path, "transport svg, 3 plans, NaN data");
    out_path(t, path, sizeof path, "plans.png");
    rc = chart_transport(path, "plans", N, xs, M, ys, 3, plans, err, sizeof err);
    s = check_png(t, rc, err, path, 3 * CHART_PLAN_W, CHART_TITLE_H + CHART_PLAN_H, "transport png, 3 plans");
    if (s) cairo_surface_destroy(s);

    float same[2] = {1, 1}, nanp[2] = {NAN, NAN}, w1 = 1;
    chart_plan single = {"degenerate", &w1};
    out_path(t, path, sizeof path, "degenerate.png");
    rc = chart_transport(path, NULL, 1, same, 1, same, 1, &single, err, sizeof err);
    check(t, rc == 1, "transport: coincident points succeed%s%s", rc ? "" : ": ", rc ? "" : err);
    rc = chart_transport(path, NULL, 1, nanp, 1, same, 1, &single, err, sizeof err);
    check(t, rc == 1, "transport: a NaN point succeeds%s%s", rc ? "" : ": ", rc ? "" : err);
    rc = chart_transport(path, NULL, 0, same, 1, same, 1, &single, err, sizeof err);
    check(t, rc == 0 && err[0], "transport: n = 0 -> 0 (%s)", err);
}

/* ---- output errors -------------------------------------------------------------------------- */

static void test_errors(tally *t)
{
    double xs[2] = {0, 1};
    chart_series se = {"s", 2, xs, xs};
    chart_panel p = {"p", "x", "y", 0, 1, &se, 0};
    char path[256], err[256] = "";

    out_path(t, path, sizeof path, "x.jpg");
    int rc = chart_lines(path, NULL, 1, &p, err, sizeof err);
    check(t, rc == 0 && strstr(err, ".jpg") != NULL, "'.jpg' -> 0 with a message (%s)", err);
    check(t, !file_exists(path), "'.jpg': no file written");

    out_path(t, path, sizeof path, "noext");
    rc = chart_lines(path, NULL, 1, &p, err, sizeof err);
    check(t, rc == 0 && err[0], "no extension -> 0 (%s)", err);
    rc = chart_lines(path, NULL, 1, &p, NULL, 0);
    check(t, rc == 0, "err == NULL is allowed");

    rc = chart_lines("/nonexistent/dir/x.png", NULL, 1, &p, err, sizeof err);
    check(t, rc == 0 && strstr(err, "/nonexistent/dir/x.png") != NULL, "missing directory -> 0 (%s)", err);
    check(t, !file_exists("/nonexistent/dir/x.png"), "missing directory: no file");

    /* a read-only directory (meaningless as root, who may write anyway) */
    char ro[128];
    out_path(t, ro, sizeof ro, "readonly");
    if (mkdir(ro, 0555) == 0) {
        snprintf(path, sizeof path, "%s/x.svg", ro);
        rc = chart_lines(path, NULL, 1, &p, err, sizeof err);
        if (geteuid() != 0)
            check(t, rc == 0 && strstr(err, "Permission denied") != NULL, "read-only directory -> 0 (%s)", err);
        else
            printf("ok - read-only directory # SKIP running as root\n");
        remove(path);
        rmdir(ro);
    }

    /* upper-case extension; a second write replaces the first; a failed call keeps the old file */
    out_path(t, path, sizeof path, "UPPER.PNG");
    rc = chart_lines(path, NULL, 1, &p, err, sizeof err);
    check(t, rc == 1 && file_starts(path, "\x89PNG"), "'.PNG' writes a PNG%s%s", rc ? "" : ": ", rc ? "" : err);
    rc = chart_lines(path, "again", 1, &p, err, sizeof err);
    cairo_surface_t *s = load_png(path);
    check(t, rc == 1 && s && cairo_image_surface_get_height(s) == CHART_TITLE_H + CHART_PANEL_H,
          "a second write replaces the file");
    if (s) cairo_surface_destroy(s);
    rc = chart_lines(path, NULL, 0, &p, err, sizeof err);
    s = load_png(path);
    check(t, rc == 0 && s && cairo_image_surface_get_height(s) == CHART_TITLE_H + CHART_PANEL_H,
          "a failed call leaves the existing file untouched");
    if (s) cairo_surface_destroy(s);
    out_path(t, path, sizeof path, "huge.png");
    rc = chart_histograms(path, NULL, 1000, 1000, (chart_hist[1000]){{0}}, 10, 0, 1, NAN, NULL, err, sizeof err);
    check(t, rc == 0 && err[0] && !file_exists(path), "too large a figure -> 0, no file (%s)", err);
}

/* removes the test directory and the files in it */
static void cleanup(const tally *t)
{
    DIR *d = opendir(t->dir);
    if (!d) return;
    struct dirent *e;
    char path[512];
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(path, sizeof path, "%s/%s", t->dir, e->d_name);
        remove(path);
    }
    closedir(d);
    rmdir(t->dir);
}

/* Frees fontconfig's configuration (loaded by cairo on first text), so that LeakSanitizer reports only
 * real leaks. Found at run time: the test links cairo only. */
static void release_fontconfig(void)
{
    void *self = dlopen(NULL, RTLD_LAZY);
    if (!self) return;
    void *sym = dlsym(self, "FcFini");
    if (sym) {
        void (*fini)(void);
        memcpy(&fini, &sym, sizeof fini);
        fini();
    }
    dlclose(self);
}

int main(int argc, char **argv)
{
    int keep = argc > 1 && strcmp(argv[1], "--keep") == 0; /* keep the pictures for a look */
    tally t = {"/tmp/test_chart.XXXXXX"};
    TH.verbose = 1; /* one line per check, as before */
    if (!mkdtemp(t.dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_lines(&t);
    test_histograms(&t);
    test_heatmaps(&t);
    test_transport(&t);
    test_errors(&t);
    check(&t, leftovers(&t) == 0, "no temporary files left in %s", t.dir);
    if (keep)
        printf("pictures kept in %s\n", t.dir);
    else
        cleanup(&t);
    cairo_debug_reset_static_data(); /* cairo's caches, then fontconfig's */
    release_fontconfig();
    return th_summary();
}
