/* chart.c -- static charts over cairo (see chart.h).
 *
 * Structure: a canvas (output format, temporary file, atomic rename), text and colour helpers, one
 * axis/tick/frame implementation shared by line charts and histograms, one legend shared by all chart
 * kinds, then the four figure kinds. */
#include "chart.h"
#include "birkhoff.h"

#include <cairo-svg.h>
#include <cairo.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#define CHART_PI 3.14159265358979323846

/* ---- errors --------------------------------------------------------------------------------- */

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static void set_err(char *err, size_t errcap, const char *fmt, ...)
{
    if (!err || errcap == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errcap, fmt, ap);
    va_end(ap);
}

/* ---- colours -------------------------------------------------------------------------------- */

typedef struct {
    double r, g, b;
} rgb;

static const rgb PALETTE[10] = {
    {0.839, 0.153, 0.157}, /* red    */
    {0.122, 0.467, 0.706}, /* blue   */
    {0.173, 0.627, 0.173}, /* green  */
    {1.000, 0.498, 0.055}, /* orange */
    {0.580, 0.404, 0.741}, /* purple */
    {0.549, 0.337, 0.294}, /* brown  */
    {0.890, 0.467, 0.761}, /* pink   */
    {0.498, 0.498, 0.498}, /* grey   */
    {0.737, 0.741, 0.133}, /* olive  */
    {0.090, 0.745, 0.812}, /* cyan   */
};

static const rgb INK = {0.10, 0.10, 0.10};      /* text */
static const rgb AXIS_INK = {0.30, 0.30, 0.30}; /* frames and tick marks */
static const rgb GRID = {0.90, 0.90, 0.90};
static const rgb PLAN_INK = {0.16, 0.20, 0.32}; /* transport segments */
static const rgb MISSING = {1.00, 0.55, 0.75};  /* non-finite heat-map cells */

static rgb palette(int i)
{
    int k = i % 10;
    return PALETTE[k < 0 ? k + 10 : k];
}

void chart_palette(int i, double *r, double *g, double *b)
{
    rgb c = palette(i);
    if (r) *r = c.r;
    if (g) *g = c.g;
    if (b) *b = c.b;
}

static rgb darker(rgb c, double f)
{
    rgb d = {c.r * f, c.g * f, c.b * f};
    return d;
}

static void set_rgb(cairo_t *cr, rgb c)
{
    cairo_set_source_rgb(cr, c.r, c.g, c.b);
}

/* Viridis-like sequential map: anchors of the perceptually uniform purple-blue-green-yellow ramp,
 * linearly interpolated. t in [0, 1]. */
static rgb colormap(double t)
{
    static const struct {
        double t;
        unsigned char r, g, b;
    } stops[] = {
        {0.000, 68, 1, 84},    {0.125, 72, 40, 120},  {0.250, 62, 73, 137},  {0.375, 49, 104, 142},
        {0.500, 38, 130, 142}, {0.625, 31, 158, 137}, {0.750, 53, 183, 121}, {0.875, 110, 206, 88},
        {0.9375, 181, 222, 43}, {1.000, 253, 231, 37},
    };
    const int ns = (int)(sizeof stops / sizeof stops[0]);
    if (!(t > 0)) t = 0; /* also NaN */
    if (t > 1) t = 1;
    int k = 0;
    while (k < ns - 2 && t > stops[k + 1].t) k++;
    double u = (t - stops[k].t) / (stops[k + 1].t - stops[k].t);
    rgb c = {(stops[k].r + u * (stops[k + 1].r - stops[k].r)) / 255.0,
             (stops[k].g + u * (stops[k + 1].g - stops[k].g)) / 255.0,
             (stops[k].b + u * (stops[k + 1].b - stops[k].b)) / 255.0};
    return c;
}

static uint32_t pixel24(rgb c)
{
    uint32_t r = (uint32_t)lround(c.r * 255), g = (uint32_t)lround(c.g * 255), b = (uint32_t)lround(c.b * 255);
    return (r << 16) | (g << 8) | b;
}

/* ---- canvas: output format and atomic write -------------------------------------------------- */

typedef struct {
    unsigned char *p; /* the encoded figure, kept in memory until it is whole */
    size_t n, cap;
    int err; /* set by the first failed allocation */
} sink;

typedef struct {
    const char *path;
    int svg;
    sink out;
    cairo_surface_t *surface;
    cairo_t *cr;
} canvas;

static cairo_status_t sink_write(void *closure, const unsigned char *data, unsigned int length)
{
    sink *s = closure;
    if (s->err) return CAIRO_STATUS_WRITE_ERROR;
    if (s->n + length > s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 65536;
        while (cap < s->n + length) cap *= 2;
        unsigned char *p = realloc(s->p, cap);
        if (!p) {
            s->err = ENOMEM;
            return CAIRO_STATUS_WRITE_ERROR;
        }
        s->p = p;
        s->cap = cap;
    }
    memcpy(s->p + s->n, data, length);
    s->n += length;
    return CAIRO_STATUS_SUCCESS;
}

/* 1 and *svg when the extension of path's last component is .png or .svg */
static int output_format(const char *path, int *svg, char *err, size_t errcap)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    const char *dot = strrchr(base, '.');
    if (!dot || dot == base) {
        set_err(err, errcap, "%s: no file extension (use .png or .svg)", path);
        return 0;
    }
    if (strcasecmp(dot, ".png") == 0 || strcasecmp(dot, ".svg") == 0) {
        *svg = strcasecmp(dot, ".svg") == 0;
        return 1;
    }
    set_err(err, errcap, "unsupported extension '%s' (use .png or .svg)", dot);
    return 0;
}

/* Releases everything (a failed or abandoned figure: nothing was written). */
static void canvas_abort(canvas *cv)
{
    if (cv->cr) cairo_destroy(cv->cr);
    if (cv->surface) cairo_surface_destroy(cv->surface);
    free(cv->out.p);
    memset(cv, 0, sizeof *cv);
}

static int canvas_open(canvas *cv, const char *path, int w, int h, char *err, size_t errcap)
{
    memset(cv, 0, sizeof *cv);
    if (!path || !*path) {
        set_err(err, errcap, "no output path");
        return 0;
    }
    if (!output_format(path, &cv->svg, err, errcap)) return 0;
    if (w < 1 || h < 1 || w > CHART_MAX_DIM || h > CHART_MAX_DIM) {
        set_err(err, errcap, "%s: a figure of %d x %d pixels is too large (at most %d per side)", path, w, h,
                CHART_MAX_DIM);
        return 0;
    }
    cv->path = path;
    if (cv->svg) {
        cv->surface = cairo_svg_surface_create_for_stream(sink_write, &cv->out, w, h);
#if CAIRO_VERSION >= CAIRO_VERSION_ENCODE(1, 16, 0)
        if (cairo_surface_status(cv->surface) == CAIRO_STATUS_SUCCESS)
            cairo_svg_surface_set_document_unit(cv->surface, CAIRO_SVG_UNIT_PX);
#endif
    } else {
        cv->surface = cairo_image_surface_create(CAIRO_FORMAT_RGB24, w, h);
    }
    cv->cr = cairo_create(cv->surface);
    if (cairo_status(cv->cr) != CAIRO_STATUS_SUCCESS) {
        set_err(err, errcap, "cannot draw %s: %s", path, cairo_status_to_string(cairo_status(cv->cr)));
        canvas_abort(cv);
        return 0;
    }
    cairo_set_source_rgb(cv->cr, 1, 1, 1);
    cairo_paint(cv->cr);
    return 1;
}

/* Finishes the figure and writes it (bk_file_write: a temporary file beside
 * the path, then rename; a device is written into); aborts on any error. */
static int canvas_close(canvas *cv, char *err, size_t errcap)
{
    cairo_status_t st = cairo_status(cv->cr);
    cairo_destroy(cv->cr);
    cv->cr = NULL;
    if (st == CAIRO_STATUS_SUCCESS) {
        if (cv->svg) {
            cairo_surface_finish(cv->surface);
            st = cairo_surface_status(cv->surface);
        } else {
            st = cairo_surface_write_to_png_stream(cv->surface, sink_write, &cv->out);
        }
    }
    cairo_surface_destroy(cv->surface);
    cv->surface = NULL;
    if (cv->out.err || st != CAIRO_STATUS_SUCCESS) {
        if (cv->out.err)
            set_err(err, errcap, "cannot write %s: %s", cv->path, strerror(cv->out.err));
        else
            set_err(err, errcap, "cannot draw %s: %s", cv->path, cairo_status_to_string(st));
        canvas_abort(cv);
        return 0;
    }
    int ok = bk_file_write(cv->path, 0, cv->out.p, cv->out.n) == BK_OK;
    if (!ok) set_err(err, errcap, "%s", bk_last_error());
    canvas_abort(cv);
    return ok;
}

/* Height of the figure title band, and the figure title itself. */
static int title_band(const char *title)
{
    return title && *title ? CHART_TITLE_H : 0;
}

/* ---- text ----------------------------------------------------------------------------------- */

typedef struct {
    double size;
    int bold;
} font;

static const font FONT_TICK = {11, 0};
static const font FONT_LABEL = {12, 0};
static const font FONT_PANEL = {13, 1};
static const font FONT_TITLE = {16, 1};

static void use_font(cairo_t *cr, font f)
{
    cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL,
                           f.bold ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr, f.size);
}

static double text_width(cairo_t *cr, const char *s, font f)
{
    if (!s || !*s) return 0;
    use_font(cr, f);
    cairo_text_extents_t te;
    cairo_text_extents(cr, s, &te);
    return te.x_advance;
}

/* line height (ascent + descent) of a font */
static double text_height(cairo_t *cr, font f)
{
    use_font(cr, f);
    cairo_font_extents_t fe;
    cairo_font_extents(cr, &fe);
    return fe.ascent + fe.descent;
}

/* Draws s anchored at (x, y): ha 0/0.5/1 = left/centre/right, va 0/0.5/1 = top/middle/bottom of the
 * line box; angle in radians (the anchor is in the rotated frame). */
static void draw_text(cairo_t *cr, const char *s, double x, double y, font f, double ha, double va, double angle,
                      rgb colour)
{
    if (!s || !*s) return;
    use_font(cr, f);
    cairo_text_extents_t te;
    cairo_font_extents_t fe;
    cairo_text_extents(cr, s, &te);
    cairo_font_extents(cr, &fe);
    cairo_save(cr);
    cairo_translate(cr, x, y);
    cairo_rotate(cr, angle);
    cairo_move_to(cr, -ha * te.x_advance, -va * (fe.ascent + fe.descent) + fe.ascent);
    set_rgb(cr, colour);
    cairo_show_text(cr, s);
    cairo_new_path(cr);
    cairo_restore(cr);
}

/* Draws s like draw_text (no rotation) within a width: in a smaller font (down to 8.5 px) when it is too
 * wide, cut short with an ellipsis when even that is too wide. */
static void draw_text_fit(cairo_t *cr, const char *s, double x, double y, font f, double width, double ha, double va,
                          rgb colour)
{
    if (!s || !*s) return;
    while (f.size > 8.5 && text_width(cr, s, f) > width) f.size -= 0.5;
    if (text_width(cr, s, f) <= width) {
        draw_text(cr, s, x, y, f, ha, va, 0, colour);
        return;
    }
    char buf[256];
    size_t n = strlen(s);
    if (n > sizeof buf - 4) n = sizeof buf - 4;
    do {
        n--;
        while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80) n--; /* whole UTF-8 characters only */
        memcpy(buf, s, n);
        memcpy(buf + n, "\xE2\x80\xA6", 4); /* ellipsis and NUL */
    } while (n > 0 && text_width(cr, buf, f) > width);
    draw_text(cr, buf, x, y, f, ha, va, 0, colour);
}

static void draw_figure_title(cairo_t *cr, const char *title, double width)
{
    draw_text_fit(cr, title, width / 2, CHART_TITLE_H / 2.0 + 2, FONT_TITLE, width - 20, 0.5, 0.5, INK);
}

/* Removes trailing zeros (and a trailing point) of a decimal number. */
static void strip_zeros(char *s)
{
    if (!strchr(s, '.')) return;
    size_t n = strlen(s);
    while (n > 0 && s[n - 1] == '0') s[--n] = '\0';
    if (n > 0 && s[n - 1] == '.') s[--n] = '\0';
}

/* A value in "m.mmeE" form with `dec` decimals in the mantissa (trailing zeros dropped). */
static void format_sci(char *buf, size_t cap, double v, int dec)
{
    if (v == 0) {
        snprintf(buf, cap, "0");
        return;
    }
    int e = (int)floor(log10(fabs(v)) + 1e-9);
    double mant = v / pow(10, e);
    if (fabs(mant) >= 9.9999999) { /* rounding carried into the next power */
        e++;
        mant /= 10;
    }
    char m[24];
    snprintf(m, sizeof m, "%.*f", dec < 0 ? 0 : dec > 6 ? 6 : dec, mant);
    strip_zeros(m);
    snprintf(buf, cap, "%se%d", m, e);
}

/* A value with about 3 significant digits, short enough for a colour bar. */
static void format_short(char *buf, size_t cap, double v)
{
    if (v == 0 || !isfinite(v)) {
        snprintf(buf, cap, v == 0 ? "0" : "%g", v);
        return;
    }
    int e = (int)floor(log10(fabs(v)));
    if (e >= -2 && e <= 3) {
        snprintf(buf, cap, "%.*f", e >= 2 ? 0 : 2 - e, v);
        strip_zeros(buf);
    } else {
        format_sci(buf, cap, v, 1);
    }
}

/* ---- axes and ticks ------------------------------------------------------------------------- */

typedef struct {
    double x0, y0, x1, y1;
} rect;

/* An axis range in axis units: the value, or log10 of it for a log axis. */
typedef struct {
    double lo, hi;
    int log;
    int integer; /* ticks at whole numbers only (linear axes) */
} axis;

enum { MAX_TICKS = 24 };

typedef struct {
    int n;
    double at[MAX_TICKS]; /* axis units */
    char text[MAX_TICKS][48];
} ticks;

static double axis_map(const axis *a, double v, double p0, double p1)
{
    return p0 + (v - a->lo) / (a->hi - a->lo) * (p1 - p0);
}

/* Makes lo < hi with a span that is not negligible next to the values (equal values: +-5%, or +-half
 * when they are 0; `half` is used for log axes, where it is in decades). */
static void widen_range(double *lo, double *hi, double half)
{
    double big = fmax(fabs(*lo), fabs(*hi));
    if (*hi - *lo > 1e-9 * big && *hi - *lo > 1e-300) return;
    double c = 0.5 * (*lo + *hi);
    double d = half > 0 ? half : (c != 0 ? 0.05 * fabs(c) : 0.5);
    *lo = c - d;
    *hi = c + d;
}

/* 1, 2 or 5 times a power of ten, near raw */
static double nice_step(double raw)
{
    if (!(raw > 0) || !isfinite(raw)) return 1;
    double mag = pow(10, floor(log10(raw)));
    double f = raw / mag;
    return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * mag;
}

static void format_tick(char *buf, size_t cap, double v, double step, double big)
{
    if (fabs(v) < 1e-6 * step) v = 0;
    int e_step = (int)floor(log10(step) + 1e-9);
    if (big >= 1e5 || big < 1e-3) {
        int e_v = v == 0 ? e_step : (int)floor(log10(fabs(v)) + 1e-9);
        format_sci(buf, cap, v, e_v - e_step);
    } else {
        snprintf(buf, cap, "%.*f", e_step < 0 ? -e_step : 0, v);
    }
}

static void add_tick(ticks *t, double at, const char *text)
{
    if (t->n >= MAX_TICKS) return;
    t->at[t->n] = at;
    snprintf(t->text[t->n], sizeof t->text[0], "%s", text);
    t->n++;
}

/* about `target` ticks at multiples of a 1-2-5 step in [lo, hi] (of at least 1 when integer) */
static void linear_ticks(double lo, double hi, int target, int integer, ticks *t)
{
    t->n = 0;
    double step = nice_step((hi - lo) / (target < 2 ? 2 : target));
    if (integer && step < 1) step = 1;
    double big = fmax(fabs(lo), fabs(hi));
    double k0 = ceil(lo / step - 1e-9), k1 = floor(hi / step + 1e-9);
    for (double k = k0; k <= k1 && t->n < MAX_TICKS; k += 1) {
        char s[48];
        format_tick(s, sizeof s, k * step, step, big);
        add_tick(t, k * step, s);
    }
}

static void log_label(char *buf, size_t cap, int mult, int k)
{
    if (k >= -3 && k <= 4)
        snprintf(buf, cap, "%.*f", k < 0 ? -k : 0, mult * pow(10, k));
    else
        snprintf(buf, cap, "%de%d", mult, k);
}

/* [a, b] in log10 units: every s-th decade when at least three are in range; else the sparsest of
 * 1-2-5, 1-2-3-5 or 1..9 times the decades that marks three values; else linear ticks */
static void log_ticks(double a, double b, int target, ticks *t)
{
    static const int mults[3][9] = {{1, 2, 5}, {1, 2, 3, 5}, {1, 2, 3, 4, 5, 6, 7, 8, 9}};
    static const int nmult[3] = {3, 4, 9};
    char buf[48];
    t->n = 0;
    double k0 = ceil(a - 1e-9), k1 = floor(b + 1e-9);
    if (target < 2) target = 2;
    if (k1 - k0 >= 2) {
        double s = fmax(1, ceil((k1 - k0) / target));
        for (double k = ceil(k0 / s) * s; k <= k1 && t->n < MAX_TICKS; k += s) {
            log_label(buf, sizeof buf, 1, (int)k);
            add_tick(t, k, buf);
        }
        return;
    }
    for (int set = 0; set < 3; set++) {
        t->n = 0;
        for (double k = floor(a); k <= k1; k += 1)
            for (int i = 0; i < nmult[set]; i++) {
                double at = k + log10(mults[set][i]);
                if (at < a - 1e-9 || at > b + 1e-9) continue;
                log_label(buf, sizeof buf, mults[set][i], (int)k);
                add_tick(t, at, buf);
            }
        if (t->n >= 3) return;
    }
    ticks lin;
    linear_ticks(pow(10, a), pow(10, b), target, 0, &lin);
    t->n = 0;
    for (int i = 0; i < lin.n; i++)
        if (lin.at[i] > 0) add_tick(t, log10(lin.at[i]), lin.text[i]);
}

static void make_ticks(const axis *a, int target, ticks *t)
{
    if (a->log)
        log_ticks(a->lo, a->hi, target, t);
    else
        linear_ticks(a->lo, a->hi, target, a->integer, t);
}

/* 1 when neighbouring x tick labels are at least a gap apart */
static int xticks_fit(cairo_t *cr, const axis *a, const ticks *t, double x0, double x1)
{
    for (int i = 0; i + 1 < t->n; i++) {
        double d = axis_map(a, t->at[i + 1], x0, x1) - axis_map(a, t->at[i], x0, x1);
        double need = 0.5 * (text_width(cr, t->text[i], FONT_TICK) + text_width(cr, t->text[i + 1], FONT_TICK));
        if (d < need + 12) return 0;
    }
    return 1;
}

/* A plot panel: axes, ticks, labels and title around a plot area. */
typedef struct {
    const char *title, *xlabel, *ylabel;
    axis x, y;
    ticks xt, yt;
    rect area;     /* set by frame_layout */
    double ytick_w; /* room for the y tick labels, set by frame_layout */
} frame;

static double snap(double v)
{
    return floor(v) + 0.5;
}

/* Chooses ticks and the plot area inside box. */
static void frame_layout(cairo_t *cr, frame *f, rect box)
{
    make_ticks(&f->y, (int)((box.y1 - box.y0) / 55), &f->yt);
    double wmax = 30; /* at least: panels of a grid line up unless their labels are long */
    for (int i = 0; i < f->yt.n; i++) wmax = fmax(wmax, text_width(cr, f->yt.text[i], FONT_TICK));
    f->ytick_w = wmax;
    double th = text_height(cr, FONT_TICK);
    rect a;
    a.x0 = round(box.x0 + 12 + (f->ylabel && *f->ylabel ? text_height(cr, FONT_LABEL) + 6 : 0) + wmax + 8);
    a.x1 = round(box.x1 - 22);
    a.y0 = round(box.y0 + 12 + (f->title && *f->title ? text_height(cr, FONT_PANEL) + 6 : 0));
    a.y1 = round(box.y1 - 10 - (f->xlabel && *f->xlabel ? text_height(cr, FONT_LABEL) + 4 : 0) - th - 8);
    f->area = a;
    for (int target = (int)((a.x1 - a.x0) / 70); target >= 1; target--) {
        make_ticks(&f->x, target, &f->xt);
        if (xticks_fit(cr, &f->x, &f->xt, a.x0, a.x1)) break;
    }
}

/* grid, frame, ticks, tick labels, axis labels and title */
static void frame_draw(cairo_t *cr, const frame *f)
{
    const rect a = f->area;
    cairo_save(cr);
    cairo_set_line_width(cr, 1);
    set_rgb(cr, GRID);
    for (int i = 0; i < f->xt.n; i++) {
        double x = snap(axis_map(&f->x, f->xt.at[i], a.x0, a.x1));
        cairo_move_to(cr, x, a.y0);
        cairo_line_to(cr, x, a.y1);
    }
    for (int i = 0; i < f->yt.n; i++) {
        double y = snap(axis_map(&f->y, f->yt.at[i], a.y1, a.y0));
        cairo_move_to(cr, a.x0, y);
        cairo_line_to(cr, a.x1, y);
    }
    cairo_stroke(cr);

    set_rgb(cr, AXIS_INK);
    cairo_rectangle(cr, a.x0 + 0.5, a.y0 + 0.5, a.x1 - a.x0 - 1, a.y1 - a.y0 - 1);
    for (int i = 0; i < f->xt.n; i++) {
        double x = snap(axis_map(&f->x, f->xt.at[i], a.x0, a.x1));
        cairo_move_to(cr, x, a.y1);
        cairo_line_to(cr, x, a.y1 + 4);
    }
    for (int i = 0; i < f->yt.n; i++) {
        double y = snap(axis_map(&f->y, f->yt.at[i], a.y1, a.y0));
        cairo_move_to(cr, a.x0, y);
        cairo_line_to(cr, a.x0 - 4, y);
    }
    cairo_stroke(cr);
    cairo_restore(cr);

    for (int i = 0; i < f->xt.n; i++)
        draw_text(cr, f->xt.text[i], axis_map(&f->x, f->xt.at[i], a.x0, a.x1), a.y1 + 7, FONT_TICK, 0.5, 0, 0,
                  INK);
    for (int i = 0; i < f->yt.n; i++)
        draw_text(cr, f->yt.text[i], a.x0 - 7, axis_map(&f->y, f->yt.at[i], a.y1, a.y0), FONT_TICK, 1, 0.5, 0,
                  INK);
    double cx = 0.5 * (a.x0 + a.x1), cy = 0.5 * (a.y0 + a.y1);
    if (f->xlabel && *f->xlabel)
        draw_text(cr, f->xlabel, cx, a.y1 + 9 + text_height(cr, FONT_TICK), FONT_LABEL, 0.5, 0, 0, INK);
    if (f->ylabel && *f->ylabel)
        draw_text(cr, f->ylabel, a.x0 - 11 - f->ytick_w, cy, FONT_LABEL, 0.5, 1, -CHART_PI / 2, INK);
    if (f->title && *f->title) {
        draw_text_fit(cr, f->title, cx, a.y0 - 6, FONT_PANEL, a.x1 - a.x0 + 30, 0.5, 1, INK);
    }
}

static void clip_to(cairo_t *cr, rect r)
{
    cairo_rectangle(cr, r.x0, r.y0, r.x1 - r.x0, r.y1 - r.y0);
    cairo_clip(cr);
}

static void draw_no_data(cairo_t *cr, rect a)
{
    draw_text(cr, "no data", 0.5 * (a.x0 + a.x1), 0.5 * (a.y0 + a.y1), FONT_LABEL, 0.5, 0.5, 0, AXIS_INK);
}

/* ---- markers and legend --------------------------------------------------------------------- */

typedef enum { KEY_LINE, KEY_DASH, KEY_CIRCLE, KEY_TRIANGLE } key_kind;

typedef struct {
    const char *text;
    rgb colour;
    key_kind kind;
} key;

static void draw_marker(cairo_t *cr, key_kind kind, double x, double y, double r, rgb colour)
{
    if (kind == KEY_TRIANGLE) {
        double s = 1.25 * r;
        cairo_move_to(cr, x, y - s);
        cairo_line_to(cr, x + 0.866 * s, y + 0.5 * s);
        cairo_line_to(cr, x - 0.866 * s, y + 0.5 * s);
        cairo_close_path(cr);
    } else {
        cairo_new_sub_path(cr);
        cairo_arc(cr, x, y, r, 0, 2 * CHART_PI);
    }
    set_rgb(cr, colour);
    cairo_fill_preserve(cr);
    cairo_set_line_width(cr, 0.8);
    set_rgb(cr, darker(colour, 0.6));
    cairo_stroke(cr);
}

static void dashed(cairo_t *cr, int on)
{
    static const double pattern[2] = {5, 3};
    cairo_set_dash(cr, pattern, on ? 2 : 0, 0);
}

enum { KEY_SWATCH = 22, KEY_ROW = 17, KEY_PAD = 6 };

static int key_count(const key *k, int n)
{
    int c = 0;
    for (int i = 0; i < n; i++) c += k[i].text && *k[i].text;
    return c;
}

/* Size of a legend (boxed, one entry per row; or a single row when `row`). */
static void legend_size(cairo_t *cr, const key *k, int n, int row, double *w, double *h)
{
    double tw = 0, sum = 0;
    for (int i = 0; i < n; i++) {
        if (!k[i].text || !*k[i].text) continue;
        double wi = text_width(cr, k[i].text, FONT_TICK);
        tw = fmax(tw, wi);
        sum += KEY_SWATCH + 5 + wi + 14;
    }
    *w = row ? sum : 2 * KEY_PAD + KEY_SWATCH + 5 + tw;
    *h = row ? KEY_ROW : 2 * KEY_PAD + KEY_ROW * key_count(k, n) - 2;
}

static void legend_draw(cairo_t *cr, const key *k, int n, int row, double x, double y)
{
    double w, h;
    legend_size(cr, k, n, row, &w, &h);
    cairo_save(cr);
    if (!row) {
        cairo_rectangle(cr, x + 0.5, y + 0.5, w - 1, h - 1);
        cairo_set_source_rgba(cr, 1, 1, 1, 0.88);
        cairo_fill_preserve(cr);
        cairo_set_line_width(cr, 1);
        set_rgb(cr, (rgb){0.8, 0.8, 0.8});
        cairo_stroke(cr);
        x += KEY_PAD;
        y += KEY_PAD;
    }
    for (int i = 0; i < n; i++) {
        if (!k[i].text || !*k[i].text) continue;
        double cy = y + KEY_ROW / 2.0 - 1;
        if (k[i].kind == KEY_LINE || k[i].kind == KEY_DASH) {
            cairo_set_line_width(cr, 2);
            dashed(cr, k[i].kind == KEY_DASH);
            set_rgb(cr, k[i].colour);
            cairo_move_to(cr, x + 1, cy);
            cairo_line_to(cr, x + KEY_SWATCH - 1, cy);
            cairo_stroke(cr);
            dashed(cr, 0);
        } else {
            draw_marker(cr, k[i].kind, x + KEY_SWATCH / 2.0, cy, 4, k[i].colour);
        }
        draw_text(cr, k[i].text, x + KEY_SWATCH + 5, cy, FONT_TICK, 0, 0.5, 0, INK);
        if (row)
            x += KEY_SWATCH + 5 + text_width(cr, k[i].text, FONT_TICK) + 14;
        else
            y += KEY_ROW;
    }
    cairo_restore(cr);
}

/* How much of a figure's ink lies in a rectangle (for legend placement). */
typedef double (*ink_fn)(const void *ctx, rect r);

/* The corner of area where `ink` finds the least data under a legend of size w x h (ties: top
 * right): its top left at (*bx, *by); returns that least ink. */
static double legend_corner(rect area, double w, double h, ink_fn ink, const void *ctx, double *bx, double *by)
{
    const double m = 8;
    double xs[2] = {area.x1 - m - w, area.x0 + m}, ys[2] = {area.y0 + m, area.y1 - m - h};
    double best = HUGE_VAL;
    *bx = xs[0];
    *by = ys[0];
    for (int iy = 0; iy < 2; iy++)
        for (int ix = 0; ix < 2; ix++) {
            rect r = {xs[ix], ys[iy], xs[ix] + w, ys[iy] + h};
            double c = ink ? ink(ctx, r) : 0;
            if (c < best - 1e-9) {
                best = c;
                *bx = xs[ix];
                *by = ys[iy];
            }
        }
    return best;
}

/* Draws a boxed legend in the corner of area where `ink` finds the least data (ties: top right). */
static void legend_place(cairo_t *cr, const key *k, int n, rect area, ink_fn ink, const void *ctx)
{
    if (key_count(k, n) == 0) return;
    double w, h;
    legend_size(cr, k, n, 0, &w, &h);
    double bx, by;
    legend_corner(area, w, h, ink, ctx, &bx, &by);
    legend_draw(cr, k, n, 0, round(bx), round(by));
}

static int inside(rect r, double x, double y)
{
    return x >= r.x0 && x <= r.x1 && y >= r.y0 && y <= r.y1;
}

/* ---- line charts ---------------------------------------------------------------------------- */

/* a point of a series that is drawn: finite, and positive y on a log axis */
static int point_ok(const chart_series *s, int i, int logy)
{
    return isfinite(s->x[i]) && isfinite(s->y[i]) && (!logy || s->y[i] > 0);
}

static double point_y(const chart_series *s, int i, int logy)
{
    return logy ? log10(s->y[i]) : s->y[i];
}

typedef struct {
    const chart_panel *p;
    const frame *f;
} lines_ctx;

/* points of all series, and samples along their segments, that fall in r */
static double lines_ink(const void *ctx, rect r)
{
    const lines_ctx *c = ctx;
    const frame *f = c->f;
    double count = 0;
    for (int s = 0; s < c->p->nseries; s++) {
        const chart_series *se = &c->p->series[s];
        int logy = c->p->logy;
        double px = 0, py = 0;
        int prev = 0;
        for (int i = 0; i < se->n; i++) {
            if (!point_ok(se, i, logy)) {
                prev = 0;
                continue;
            }
            double x = axis_map(&f->x, se->x[i], f->area.x0, f->area.x1);
            double y = axis_map(&f->y, point_y(se, i, logy), f->area.y1, f->area.y0);
            count += inside(r, x, y);
            if (prev) { /* samples along the segment, about every 6 px */
                int ns = (int)fmin(64, hypot(x - px, y - py) / 6);
                for (int k = 1; k <= ns; k++)
                    count += inside(r, px + (x - px) * k / (ns + 1), py + (y - py) * k / (ns + 1));
            }
            px = x;
            py = y;
            prev = 1;
        }
    }
    return count;
}

static void draw_series(cairo_t *cr, const frame *f, const chart_series *s, int logy, rgb colour)
{
    const rect a = f->area;
    int finite = 0;
    for (int i = 0; i < s->n; i++) finite += point_ok(s, i, logy);
    int markers = finite <= 30;
    cairo_save(cr);
    clip_to(cr, a);
    cairo_set_line_width(cr, 1.8);
    cairo_set_line_join(cr, CAIRO_LINE_JOIN_ROUND);
    cairo_set_line_cap(cr, CAIRO_LINE_CAP_ROUND);
    set_rgb(cr, colour);
    int open = 0;
    for (int i = 0; i < s->n; i++) {
        if (!point_ok(s, i, logy)) {
            open = 0;
            continue;
        }
        double x = axis_map(&f->x, s->x[i], a.x0, a.x1), y = axis_map(&f->y, point_y(s, i, logy), a.y1, a.y0);
        if (open)
            cairo_line_to(cr, x, y);
        else
            cairo_move_to(cr, x, y);
        open = 1;
    }
    cairo_stroke(cr);
    for (int i = 0; i < s->n; i++) {
        if (!point_ok(s, i, logy)) continue;
        int isolated = (i == 0 || !point_ok(s, i - 1, logy)) && (i + 1 == s->n || !point_ok(s, i + 1, logy));
        if (!markers && !isolated) continue;
        double x = axis_map(&f->x, s->x[i], a.x0, a.x1), y = axis_map(&f->y, point_y(s, i, logy), a.y1, a.y0);
        draw_marker(cr, KEY_CIRCLE, x, y, 3, colour);
    }
    cairo_restore(cr);
}

static void draw_lines_panel(cairo_t *cr, const chart_panel *p, rect box)
{
    double xlo = HUGE_VAL, xhi = -HUGE_VAL, ylo = HUGE_VAL, yhi = -HUGE_VAL;
    for (int s = 0; s < p->nseries; s++)
        for (int i = 0; i < p->series[s].n; i++) {
            if (!point_ok(&p->series[s], i, p->logy)) continue;
            double y = point_y(&p->series[s], i, p->logy);
            xlo = fmin(xlo, p->series[s].x[i]);
            xhi = fmax(xhi, p->series[s].x[i]);
            ylo = fmin(ylo, y);
            yhi = fmax(yhi, y);
        }
    int empty = !(xlo <= xhi);
    if (empty) {
        xlo = ylo = 0;
        xhi = yhi = 1;
    }
    widen_range(&xlo, &xhi, 0);
    widen_range(&ylo, &yhi, p->logy ? 0.5 : 0);
    double xpad = 0.02 * (xhi - xlo), ypad = 0.05 * (yhi - ylo);
    frame f = {.title = p->title, .xlabel = p->xlabel, .ylabel = p->ylabel};
    f.x = (axis){xlo - xpad, xhi + xpad, 0, p->xint};
    f.y = (axis){ylo - ypad, yhi + ypad, p->logy, 0};
    frame_layout(cr, &f, box);
    key keys[64];
    int nk = 0;
    for (int s = 0; s < p->nseries && nk < 64; s++) keys[nk++] = (key){p->series[s].name, palette(s), KEY_LINE};
    lines_ctx ctx = {p, &f};
    if (!empty && key_count(keys, nk) > 0) {
        /* every corner has data under the legend: room above the data, the legend's height and
         * two margins of the plot area, then the layout again (new ticks) */
        double w, h, bx, by;
        legend_size(cr, keys, nk, 0, &w, &h);
        const double H = f.area.y1 - f.area.y0, need = h + 16;
        for (int tries = 0; tries < 3 && legend_corner(f.area, w, h, lines_ink, &ctx, &bx, &by) > 0 && H > 2 * need;
             tries++) {
            const double span = f.y.hi - f.y.lo;
            f.y.hi = f.y.lo + span * H / (H - need);
            frame_layout(cr, &f, box);
        }
    }
    frame_draw(cr, &f);
    if (empty) {
        draw_no_data(cr, f.area);
        return;
    }
    for (int s = 0; s < p->nseries; s++) draw_series(cr, &f, &p->series[s], p->logy, palette(s));
    legend_place(cr, keys, nk, f.area, lines_ink, &ctx);
}

int chart_lines(const char *path, const char *title, int npanels, const chart_panel *panels, char *err,
                size_t errcap)
{
    if (npanels < 1 || !panels) {
        set_err(err, errcap, "chart_lines: need at least one panel");
        return 0;
    }
    for (int p = 0; p < npanels; p++) {
        if (panels[p].nseries < 0 || (panels[p].nseries > 0 && !panels[p].series)) {
            set_err(err, errcap, "chart_lines: panel %d: bad series list", p);
            return 0;
        }
        for (int s = 0; s < panels[p].nseries; s++) {
            const chart_series *se = &panels[p].series[s];
            if (se->n < 0 || (se->n > 0 && (!se->x || !se->y))) {
                set_err(err, errcap, "chart_lines: panel %d, series %d: bad points", p, s);
                return 0;
            }
        }
    }
    if (npanels > CHART_MAX_DIM / CHART_PANEL_W) {
        set_err(err, errcap, "chart_lines: too many panels (%d)", npanels);
        return 0;
    }
    int band = title_band(title);
    canvas cv;
    if (!canvas_open(&cv, path, npanels * CHART_PANEL_W, band + CHART_PANEL_H, err, errcap)) return 0;
    draw_figure_title(cv.cr, title, npanels * CHART_PANEL_W);
    for (int p = 0; p < npanels; p++) {
        rect box = {p * CHART_PANEL_W, band, (p + 1) * CHART_PANEL_W, band + CHART_PANEL_H};
        draw_lines_panel(cv.cr, &panels[p], box);
    }
    return canvas_close(&cv, err, errcap);
}

/* ---- histograms ----------------------------------------------------------------------------- */

typedef struct {
    const frame *f;
    const double *frac;
    int bins;
} hist_ctx;

/* overlap of r with the bars */
static double hist_ink(const void *ctx, rect r)
{
    const hist_ctx *c = ctx;
    const rect a = c->f->area;
    double ink = 0;
    for (int b = 0; b < c->bins; b++) {
        double x0 = a.x0 + (a.x1 - a.x0) * b / c->bins, x1 = a.x0 + (a.x1 - a.x0) * (b + 1) / c->bins;
        double top = axis_map(&c->f->y, c->frac[b], a.y1, a.y0);
        double w = fmin(x1, r.x1) - fmax(x0, r.x0), h = r.y1 - fmax(top, r.y0);
        if (w > 0 && h > 0) ink += w * h;
    }
    return ink;
}

static void draw_hist_panel(cairo_t *cr, const chart_hist *hp, rect box, int bins, double lo, double hi, double ref,
                            const char *xlabel, double *frac)
{
    long total = 0;
    for (int b = 0; b < bins; b++) frac[b] = 0;
    for (int i = 0; i < hp->n; i++) {
        double v = hp->v[i];
        if (!isfinite(v)) continue;
        double u = (v - lo) / (hi - lo) * bins;
        int b = u <= 0 ? 0 : u >= bins ? bins - 1 : (int)u;
        frac[b] += 1;
        total++;
    }
    double fmax_ = 0;
    for (int b = 0; b < bins; b++) {
        if (total) frac[b] /= (double)total;
        fmax_ = fmax(fmax_, frac[b]);
    }
    frame f = {.title = hp->title, .xlabel = xlabel, .ylabel = "fraction of values"};
    f.x = (axis){lo, hi, 0, 0};
    f.y = (axis){0, fmax_ > 0 ? fmax_ * 1.08 : 1, 0, 0};
    frame_layout(cr, &f, box);
    frame_draw(cr, &f);
    const rect a = f.area;
    cairo_save(cr);
    clip_to(cr, a);
    rgb fill = palette(1);
    double bw = (a.x1 - a.x0) / bins;
    for (int b = 0; b < bins; b++) {
        if (frac[b] <= 0) continue;
        double x0 = a.x0 + bw * b, top = axis_map(&f.y, frac[b], a.y1, a.y0);
        cairo_rectangle(cr, x0, top, bw, a.y1 - top);
    }
    cairo_set_source_rgba(cr, fill.r, fill.g, fill.b, 0.85);
    cairo_fill_preserve(cr);
    if (bw >= 4) { /* thin separators between bars */
        cairo_set_line_width(cr, 0.6);
        cairo_set_source_rgb(cr, 1, 1, 1);
        cairo_stroke(cr);
    }
    cairo_new_path(cr);
    char reftext[64] = "";
    if (isfinite(ref) && ref >= lo && ref <= hi) {
        double x = axis_map(&f.x, ref, a.x0, a.x1);
        cairo_set_line_width(cr, 1.6);
        dashed(cr, 1);
        set_rgb(cr, palette(0));
        cairo_move_to(cr, x, a.y0);
        cairo_line_to(cr, x, a.y1);
        cairo_stroke(cr);
        dashed(cr, 0);
        char num[48];
        format_short(num, sizeof num, ref);
        snprintf(reftext, sizeof reftext, "ref = %s", num);
    }
    cairo_restore(cr);
    if (total == 0) {
        draw_no_data(cr, a);
        return;
    }
    key k = {reftext, palette(0), KEY_DASH};
    hist_ctx ctx = {&f, frac, bins};
    legend_place(cr, &k, 1, a, hist_ink, &ctx);
}

int chart_histograms(const char *path, const char *title, int npanels, int ncols, const chart_hist *panels,
                     int bins, double lo, double hi, double ref, const char *xlabel, char *err, size_t errcap)
{
    if (npanels < 1 || !panels || ncols < 1) {
        set_err(err, errcap, "chart_histograms: need at least one panel and one column");
        return 0;
    }
    if (bins < 1 || bins > 100000) {
        set_err(err, errcap, "chart_histograms: bins = %d outside [1, 100000]", bins);
        return 0;
    }
    for (int p = 0; p < npanels; p++)
        if (panels[p].n < 0 || (panels[p].n > 0 && !panels[p].v)) {
            set_err(err, errcap, "chart_histograms: panel %d: bad values", p);
            return 0;
        }
    if (!isfinite(lo) || !isfinite(hi) || lo > hi) {
        set_err(err, errcap, "chart_histograms: bad range [%g, %g]", lo, hi);
        return 0;
    }
    if (lo == hi) { /* the data's range, shared by all panels */
        lo = HUGE_VAL;
        hi = -HUGE_VAL;
        for (int p = 0; p < npanels; p++)
            for (int i = 0; i < panels[p].n; i++)
                if (isfinite(panels[p].v[i])) {
                    lo = fmin(lo, panels[p].v[i]);
                    hi = fmax(hi, panels[p].v[i]);
                }
        if (!(lo <= hi)) {
            lo = 0;
            hi = 1;
        }
        widen_range(&lo, &hi, 0);
    }
    if (!isfinite(hi - lo)) {
        set_err(err, errcap, "chart_histograms: range [%g, %g] too wide", lo, hi);
        return 0;
    }
    int cols = ncols < npanels ? ncols : npanels, rows = (npanels + cols - 1) / cols;
    if (cols > CHART_MAX_DIM / CHART_PANEL_W || rows > CHART_MAX_DIM / CHART_PANEL_H) {
        set_err(err, errcap, "chart_histograms: too many panels (%d)", npanels);
        return 0;
    }
    double *frac = malloc((size_t)bins * sizeof *frac);
    if (!frac) {
        set_err(err, errcap, "chart_histograms: out of memory");
        return 0;
    }
    int band = title_band(title);
    canvas cv;
    if (!canvas_open(&cv, path, cols * CHART_PANEL_W, band + rows * CHART_PANEL_H, err, errcap)) {
        free(frac);
        return 0;
    }
    draw_figure_title(cv.cr, title, cols * CHART_PANEL_W);
    for (int p = 0; p < npanels; p++) {
        double x0 = (p % cols) * CHART_PANEL_W, y0 = band + (p / cols) * CHART_PANEL_H;
        rect box = {x0, y0, x0 + CHART_PANEL_W, y0 + CHART_PANEL_H};
        draw_hist_panel(cv.cr, &panels[p], box, bins, lo, hi, ref, xlabel, frac);
    }
    free(frac);
    return canvas_close(&cv, err, errcap);
}

/* ---- heat-maps ------------------------------------------------------------------------------ */

enum { MAP_TOP = 30, MAP_LEFT = 12, BAR_GAP = 8, BAR_W = 10 };

/* min and max of the finite cells (NAN, NAN when there are none) */
static void map_range(const chart_map *m, double *lo, double *hi)
{
    *lo = HUGE_VAL;
    *hi = -HUGE_VAL;
    size_t cells = (size_t)m->w * (size_t)m->h;
    for (size_t i = 0; i < cells; i++)
        if (isfinite(m->data[i])) {
            *lo = fmin(*lo, m->data[i]);
            *hi = fmax(*hi, m->data[i]);
        }
    if (*lo > *hi) *lo = *hi = NAN;
}

/* An image of the map at its drawn size, each pixel the colour of the cell it falls in (nearest). */
static cairo_surface_t *map_image(const chart_map *m, int dw, int dh)
{
    cairo_surface_t *img = cairo_image_surface_create(CAIRO_FORMAT_RGB24, dw, dh);
    if (cairo_surface_status(img) != CAIRO_STATUS_SUCCESS) return img;
    double lo, hi;
    map_range(m, &lo, &hi);
    cairo_surface_flush(img);
    unsigned char *base = cairo_image_surface_get_data(img);
    int stride = cairo_image_surface_get_stride(img);
    for (int py = 0; py < dh; py++) {
        uint32_t *row = (uint32_t *)(void *)(base + (size_t)py * (size_t)stride);
        const float *src = m->data + (size_t)((int64_t)py * m->h / dh) * (size_t)m->w;
        for (int px = 0; px < dw; px++) {
            double v = src[(int64_t)px * m->w / dw];
            rgb c;
            if (!isfinite(v))
                c = MISSING;
            else if (m->grey) {
                double g = v < 0 ? 0 : v > 1 ? 1 : v;
                c = (rgb){g, g, g};
            } else
                c = colormap(hi > lo ? (v - lo) / (hi - lo) : 0.5);
            row[px] = pixel24(c);
        }
    }
    cairo_surface_mark_dirty(img);
    return img;
}

/* the colour bar of a map: its colours from top (max) to bottom (min), and the two values */
static cairo_surface_t *bar_image(int grey, int dh)
{
    cairo_surface_t *img = cairo_image_surface_create(CAIRO_FORMAT_RGB24, BAR_W, dh);
    if (cairo_surface_status(img) != CAIRO_STATUS_SUCCESS) return img;
    cairo_surface_flush(img);
    unsigned char *base = cairo_image_surface_get_data(img);
    int stride = cairo_image_surface_get_stride(img);
    for (int py = 0; py < dh; py++) {
        double t = dh > 1 ? 1 - (double)py / (dh - 1) : 0.5;
        uint32_t c = pixel24(grey ? (rgb){t, t, t} : colormap(t));
        uint32_t *row = (uint32_t *)(void *)(base + (size_t)py * (size_t)stride);
        for (int px = 0; px < BAR_W; px++) row[px] = c;
    }
    cairo_surface_mark_dirty(img);
    return img;
}

/* paints an image 1:1 at integer device coordinates, pixelated; 0 when the image failed */
static int paint_image(cairo_t *cr, cairo_surface_t *img, double x, double y)
{
    int ok = cairo_surface_status(img) == CAIRO_STATUS_SUCCESS;
    if (ok) {
        cairo_save(cr);
        cairo_set_source_surface(cr, img, x, y);
        cairo_pattern_set_filter(cairo_get_source(cr), CAIRO_FILTER_NEAREST);
        cairo_rectangle(cr, x, y, cairo_image_surface_get_width(img), cairo_image_surface_get_height(img));
        cairo_fill(cr);
        cairo_restore(cr);
    }
    cairo_surface_destroy(img);
    return ok;
}

/* drawn size: an integer cell size when the map fits the box, else scaled down to it */
static void map_size(int w, int h, int *dw, int *dh)
{
    int big = w > h ? w : h;
    if (big <= CHART_MAP_BOX) {
        int c = CHART_MAP_BOX / big;
        *dw = w * c;
        *dh = h * c;
    } else {
        *dw = (int)fmax(1, round((double)w * CHART_MAP_BOX / big));
        *dh = (int)fmax(1, round((double)h * CHART_MAP_BOX / big));
    }
}

static int draw_map_panel(cairo_t *cr, const chart_map *m, rect box)
{
    if (!m->data) return 1;
    int dw, dh;
    map_size(m->w, m->h, &dw, &dh);
    double x = box.x0 + MAP_LEFT + (CHART_MAP_BOX - dw) / 2, y = box.y0 + MAP_TOP + (CHART_MAP_BOX - dh) / 2;
    if (!paint_image(cr, map_image(m, dw, dh), x, y)) return 0;
    cairo_save(cr);
    cairo_set_line_width(cr, 1);
    set_rgb(cr, AXIS_INK);
    cairo_rectangle(cr, x - 0.5, y - 0.5, dw + 1, dh + 1);
    cairo_stroke(cr);
    cairo_restore(cr);

    double bx = box.x0 + MAP_LEFT + CHART_MAP_BOX + BAR_GAP;
    if (!paint_image(cr, bar_image(m->grey, dh), bx, y)) return 0;
    char top[48], bottom[48];
    if (m->grey) {
        snprintf(top, sizeof top, "1");
        snprintf(bottom, sizeof bottom, "0");
    } else {
        double lo, hi;
        map_range(m, &lo, &hi);
        format_short(top, sizeof top, hi);
        format_short(bottom, sizeof bottom, lo);
    }
    double room = box.x1 - (bx + BAR_W + 4) - 2;
    draw_text_fit(cr, top, bx + BAR_W + 4, y, FONT_TICK, room, 0, 0, INK);
    draw_text_fit(cr, bottom, bx + BAR_W + 4, y + dh, FONT_TICK, room, 0, 1, INK);
    if (m->title && *m->title) {
        draw_text_fit(cr, m->title, box.x0 + MAP_LEFT + CHART_MAP_BOX / 2.0, y - 6, FONT_PANEL, CHART_MAP_W - 8,
                      0.5, 1, INK);
    }
    return 1;
}

int chart_heatmaps(const char *path, const char *title, int rows, int cols, const char *const *row_labels,
                   const chart_map *panels, char *err, size_t errcap)
{
    if (rows < 1 || cols < 1 || !panels) {
        set_err(err, errcap, "chart_heatmaps: need at least one row and one column of panels");
        return 0;
    }
    for (int p = 0; p < rows * cols; p++)
        if (panels[p].data && (panels[p].w < 1 || panels[p].h < 1 || panels[p].w > 32768 || panels[p].h > 32768)) {
            set_err(err, errcap, "chart_heatmaps: panel %d: bad size %d x %d", p, panels[p].w, panels[p].h);
            return 0;
        }
    int lw = row_labels ? CHART_LABEL_W : 0, band = title_band(title);
    if (cols > (CHART_MAX_DIM - lw) / CHART_MAP_W || rows > CHART_MAX_DIM / CHART_MAP_H) {
        set_err(err, errcap, "chart_heatmaps: too many panels (%d x %d)", rows, cols);
        return 0;
    }
    canvas cv;
    if (!canvas_open(&cv, path, lw + cols * CHART_MAP_W, band + rows * CHART_MAP_H, err, errcap)) return 0;
    draw_figure_title(cv.cr, title, lw + cols * CHART_MAP_W);
    for (int r = 0; r < rows; r++) {
        double y0 = band + r * CHART_MAP_H;
        if (row_labels && row_labels[r]) {
            /* one line per '\n'-separated part (up to 4), centred on the row */
            char part[4][256];
            int nl = 0;
            for (const char *q = row_labels[r]; nl < 4;) {
                size_t len = strcspn(q, "\n");
                snprintf(part[nl++], sizeof part[0], "%.*s", (int)(len < 255 ? len : 255), q);
                if (!q[len]) break;
                q += len + 1;
            }
            const double lh = text_height(cv.cr, FONT_PANEL) + 5;
            for (int i = 0; i < nl; i++)
                draw_text_fit(cv.cr, part[i], lw - 6, y0 + MAP_TOP + CHART_MAP_BOX / 2.0 + (i - 0.5 * (nl - 1)) * lh,
                              FONT_PANEL, lw - 12, 1, 0.5, INK);
        }
        for (int c = 0; c < cols; c++) {
            rect box = {lw + c * CHART_MAP_W, y0, lw + (c + 1) * CHART_MAP_W, y0 + CHART_MAP_H};
            if (!draw_map_panel(cv.cr, &panels[r * cols + c], box)) {
                set_err(err, errcap, "cannot draw %s: out of memory", path);
                canvas_abort(&cv);
                return 0;
            }
        }
    }
    return canvas_close(&cv, err, errcap);
}

/* ---- transport plans ------------------------------------------------------------------------ */

/* maps data coordinates to a square-scaled plot area */
typedef struct {
    double cx, cy, scale, ox, oy;
} view;

static void view_point(const view *v, double x, double y, double *px, double *py)
{
    *px = v->ox + (x - v->cx) * v->scale;
    *py = v->oy - (y - v->cy) * v->scale;
}

static int point2_ok(const float *p)
{
    return isfinite(p[0]) && isfinite(p[1]);
}

/* the bounding box of the finite points, widened when degenerate */
static void points_bounds(int n, const float *x, int m, const float *y, double b[4])
{
    b[0] = b[1] = HUGE_VAL;
    b[2] = b[3] = -HUGE_VAL;
    for (int k = 0; k < n + m; k++) {
        const float *p = k < n ? x + 2 * k : y + 2 * (k - n);
        if (!point2_ok(p)) continue;
        b[0] = fmin(b[0], p[0]);
        b[1] = fmin(b[1], p[1]);
        b[2] = fmax(b[2], p[0]);
        b[3] = fmax(b[3], p[1]);
    }
    if (!(b[0] <= b[2])) {
        b[0] = b[1] = 0;
        b[2] = b[3] = 1;
    }
    widen_range(&b[0], &b[2], 0);
    widen_range(&b[1], &b[3], 0);
}

enum { PLAN_TOP = 32, PLAN_KEYS = 20, PLAN_MARGIN = 12 };
static const double PLAN_MAX_WIDTH = 3.0;

static void draw_plan_panel(cairo_t *cr, const chart_plan *pl, rect box, int n, const float *x, int m,
                            const float *y, const double bounds[4])
{
    if (pl->title && *pl->title) {
        draw_text_fit(cr, pl->title, 0.5 * (box.x0 + box.x1), box.y0 + PLAN_TOP - 8, FONT_PANEL, box.x1 - box.x0 - 16,
                      0.5, 1, INK);
    }
    const key keys[3] = {{"x", palette(1), KEY_CIRCLE}, {"y", palette(0), KEY_TRIANGLE}, {"plan", PLAN_INK, KEY_LINE}};
    double kw, kh;
    legend_size(cr, keys, 3, 1, &kw, &kh);
    legend_draw(cr, keys, 3, 1, round(0.5 * (box.x0 + box.x1 - kw)), box.y0 + PLAN_TOP);

    rect a = {box.x0 + PLAN_MARGIN, box.y0 + PLAN_TOP + PLAN_KEYS + 6, box.x1 - PLAN_MARGIN, box.y1 - PLAN_MARGIN};
    cairo_save(cr);
    cairo_set_line_width(cr, 1);
    set_rgb(cr, (rgb){0.82, 0.82, 0.82});
    cairo_rectangle(cr, a.x0 + 0.5, a.y0 + 0.5, a.x1 - a.x0 - 1, a.y1 - a.y0 - 1);
    cairo_stroke(cr);
    cairo_restore(cr);

    /* equal aspect: the data box plus 8% on every side, fitted to the area */
    double dx = bounds[2] - bounds[0], dy = bounds[3] - bounds[1], pad = 0.08 * fmax(dx, dy);
    view v = {0.5 * (bounds[0] + bounds[2]), 0.5 * (bounds[1] + bounds[3]), 0, 0.5 * (a.x0 + a.x1),
              0.5 * (a.y0 + a.y1)};
    v.scale = fmin((a.x1 - a.x0) / (dx + 2 * pad), (a.y1 - a.y0) / (dy + 2 * pad));

    cairo_save(cr);
    clip_to(cr, a);
    if (pl->P) {
        double pmax = 0;
        for (size_t k = 0; k < (size_t)n * (size_t)m; k++)
            if (isfinite(pl->P[k])) pmax = fmax(pmax, pl->P[k]);
        cairo_set_line_cap(cr, CAIRO_LINE_CAP_ROUND);
        for (int i = 0; pmax > 0 && i < n; i++) {
            if (!point2_ok(x + 2 * i)) continue;
            for (int j = 0; j < m; j++) {
                double p = pl->P[(size_t)i * (size_t)m + (size_t)j];
                if (!(p > 1e-3 * pmax) || !isfinite(p) || !point2_ok(y + 2 * j)) continue;
                double wgt = p / pmax, x0, y0, x1, y1;
                view_point(&v, x[2 * i], x[2 * i + 1], &x0, &y0);
                view_point(&v, y[2 * j], y[2 * j + 1], &x1, &y1);
                cairo_set_line_width(cr, PLAN_MAX_WIDTH * wgt);
                cairo_set_source_rgba(cr, PLAN_INK.r, PLAN_INK.g, PLAN_INK.b, 0.1 + 0.7 * wgt);
                cairo_move_to(cr, x0, y0);
                cairo_line_to(cr, x1, y1);
                cairo_stroke(cr);
            }
        }
    }
    for (int k = 0; k < n + m; k++) {
        const float *p = k < n ? x + 2 * k : y + 2 * (k - n);
        if (!point2_ok(p)) continue;
        double px, py;
        view_point(&v, p[0], p[1], &px, &py);
        draw_marker(cr, k < n ? KEY_CIRCLE : KEY_TRIANGLE, px, py, 4.5, k < n ? palette(1) : palette(0));
    }
    cairo_restore(cr);
}

int chart_transport(const char *path, const char *title, int n, const float *x, int m, const float *y,
                    int nplans, const chart_plan *plans, char *err, size_t errcap)
{
    if (n < 1 || m < 1 || !x || !y) {
        set_err(err, errcap, "chart_transport: need at least one point on each side");
        return 0;
    }
    if (nplans < 1 || !plans) {
        set_err(err, errcap, "chart_transport: need at least one plan");
        return 0;
    }
    if (nplans > CHART_MAX_DIM / CHART_PLAN_W) {
        set_err(err, errcap, "chart_transport: too many plans (%d)", nplans);
        return 0;
    }
    double bounds[4];
    points_bounds(n, x, m, y, bounds);
    int band = title_band(title);
    canvas cv;
    if (!canvas_open(&cv, path, nplans * CHART_PLAN_W, band + CHART_PLAN_H, err, errcap)) return 0;
    draw_figure_title(cv.cr, title, nplans * CHART_PLAN_W);
    for (int k = 0; k < nplans; k++) {
        rect box = {k * CHART_PLAN_W, band, (k + 1) * CHART_PLAN_W, band + CHART_PLAN_H};
        draw_plan_panel(cv.cr, &plans[k], box, n, x, m, y, bounds);
    }
    return canvas_close(&cv, err, errcap);
}
