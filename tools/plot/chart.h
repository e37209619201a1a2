/* chart.h -- static charts for `birkhoff plot`, drawn with cairo.
 *
 * Four kinds of figure: line charts (training curves), histograms (e.g. row/column sums of attention
 * plans), heat-maps (attention matrices, pictures) and transport plans between two 2-D point sets.
 *
 * Common rules of every chart_* drawing function:
 *   - The format follows the extension of `path` (case-insensitive): ".png" (raster, 1 unit = 1 pixel)
 *     or ".svg" (vector, same size in px). Any other extension is an error.
 *   - The output is written atomically: the figure is drawn into "<path>.tmp.XXXXXX" (mode 0644) in the
 *     same directory, which is renamed onto `path` only when everything succeeded. On failure no
 *     output is created, an existing file at `path` is left untouched, and the temporary is removed.
 *   - Return 1 on success, 0 on failure with a one-line human-readable message in err (errcap bytes,
 *     always NUL-terminated; err may be NULL). Messages name the path, e.g.
 *     "cannot write out/x.png: Permission denied" or "unsupported extension '.jpg' (use .png or .svg)".
 *   - Non-finite data never fail a call: non-finite points are skipped, degenerate ranges (all values
 *     equal) are widened. Strings may be NULL or "" (nothing drawn for them).
 *   - Thread-safe: no global state; concurrent calls must write to different paths.
 *
 * Link with $(pkg-config --libs cairo) -lm; compile with $(pkg-config --cflags cairo).
 */
#ifndef BK_CHART_H
#define BK_CHART_H

#include <stddef.h>

/* Figure geometry (pixels). A figure title, when non-empty, adds a band of CHART_TITLE_H on top.
 *   chart_lines:      width npanels * CHART_PANEL_W,             height band + CHART_PANEL_H
 *   chart_histograms: width c * CHART_PANEL_W,                   height band + r * CHART_PANEL_H
 *                     (c = min(ncols, npanels) columns, r = ceil(npanels / c) rows)
 *   chart_heatmaps:   width [CHART_LABEL_W] + cols * CHART_MAP_W, height band + rows * CHART_MAP_H
 *                     (the label column only when row_labels != NULL)
 *   chart_transport:  width nplans * CHART_PLAN_W,               height band + CHART_PLAN_H
 * A figure larger than CHART_MAX_DIM on a side is refused. */
enum {
    CHART_PANEL_W = 420,
    CHART_PANEL_H = 320,
    CHART_TITLE_H = 40,
    CHART_MAP_W = 340,
    CHART_MAP_H = 300,
    CHART_MAP_BOX = 256, /* heat-maps are drawn inside a CHART_MAP_BOX square */
    CHART_LABEL_W = 110,
    CHART_PLAN_W = 420,
    CHART_PLAN_H = 440,
    CHART_MAX_DIM = 16384
};

/* The series colours (a 10-colour qualitative palette, cycled): series i of a line chart is drawn
 * in colour chart_palette(i) in every panel. Colour 0 is red, 1 blue, 2 green, 3 orange.
 * Components in [0, 1]. */
void chart_palette(int i, double *r, double *g, double *b);

/* ---- line charts ---------------------------------------------------------------------------- */

typedef struct {
    const char *name;    /* legend label (NULL or "": not in the legend) */
    int n;               /* number of points (>= 0) */
    const double *x, *y; /* n points; non-finite points are skipped and break the line */
} chart_series;

/* One panel: its own axes, labels and legend. logy: log10 y axis (points with y <= 0 are skipped).
 * The x range is the data's (plus 2%), the y range the data's (plus 5%); ticks at 1-2-5 steps (decades,
 * with 2 and 5 in between for short log ranges); xint: x values are counts (epochs), ticks only at
 * whole numbers. Lines get point markers when a series has at most 30 points; isolated points
 * (neighbours skipped) always get a marker. The legend goes in the corner of the plot area with the
 * least data under it; when every corner has data, the y range grows at the top until the legend fits
 * above the lines (it never covers them). */
typedef struct {
    const char *title; /* panel title */
    const char *xlabel, *ylabel;
    int logy;
    int nseries; /* >= 0 */
    const chart_series *series;
    int xint;
} chart_panel;

/* Panels side by side (npanels >= 1), e.g. "loss" and "accuracy". */
int chart_lines(const char *path, const char *title, int npanels, const chart_panel *panels, char *err,
                size_t errcap);

/* ---- histograms ----------------------------------------------------------------------------- */

typedef struct {
    const char *title;
    int n;           /* >= 0 */
    const double *v; /* n values; non-finite ones are excluded (fractions are of the finite ones) */
} chart_hist;

/* A grid of histogram panels, ncols columns (>= 1), filled row by row. Each panel: `bins` (1..100000)
 * equal bins over [lo, hi]; values outside go to the end bins. lo == hi: the range is the min and max of
 * the finite values of all panels (shared, so panels are comparable); otherwise lo < hi is required.
 * y axis: "fraction of values" (per panel). ref finite: a vertical dashed line at ref (in the legend
 * as "ref = <ref>"); NAN: none. xlabel: the x axis label of every panel. */
int chart_histograms(const char *path, const char *title, int npanels, int ncols, const chart_hist *panels,
                     int bins, double lo, double hi, double ref, const char *xlabel, char *err,
                     size_t errcap);

/* ---- heat-maps ------------------------------------------------------------------------------ */

typedef struct {
    const char *title; /* above the panel, e.g. "head 0" */
    int w, h;          /* columns and rows (>= 1 each, <= 32768) when data != NULL */
    const float *data; /* h rows of w values, row-major; NULL: the panel is left blank */
    int grey;          /* 1: a greyscale picture, values in [0, 1] (clamped) */
} chart_map;

/* A rows x cols grid of heat-maps (panels row-major, rows*cols of them). Each map has square cells,
 * fills at most a CHART_MAP_BOX square, nearest-neighbour (pixelated) with an integer cell size when it
 * fits; colours from a viridis-like sequential map normalised to the panel's own [min, max] (shown on a
 * colour bar at its right), or grey levels for grey panels. Non-finite cells are drawn pink. The map is
 * rendered as an image at its drawn size (embedded as such in SVG), so it stays sharp in every viewer.
 * row_labels: rows strings drawn left of each row (NULL: no label column); a '\n' starts a new line
 * (up to 4 lines, each fitted to the column's width). */
int chart_heatmaps(const char *path, const char *title, int rows, int cols, const char *const *row_labels,
                   const chart_map *panels, char *err, size_t errcap);

/* ---- transport plans ------------------------------------------------------------------------ */

typedef struct {
    const char *title; /* e.g. "Sinkhorn eps=0.1", "ESP" */
    const float *P;    /* [n x m] row-major, non-negative; NULL: points only */
} chart_plan;

/* Plans between points x [n, 2] (blue circles, chart_palette(1)) and y [m, 2] (red triangles,
 * chart_palette(0)), one panel per plan (nplans >= 1), side by side, the same points in each, equal
 * aspect ratio. Every pair with P[i*m+j] > 1e-3 * max P is joined by a dark slate segment whose width
 * (up to 3 px) and opacity grow with P[i,j] / max P. Non-finite points and non-finite or negative
 * entries of P are skipped. n, m >= 1. */
int chart_transport(const char *path, const char *title, int n, const float *x, int m, const float *y,
                    int nplans, const chart_plan *plans, char *err, size_t errcap);

#endif
