"""Shared by the reproduction tables (scripts/repro/*_table.py): how a statistic over seeds is
printed."""
import statistics


def fmt(vals, f="%.2f"):
    """median [min, max] of vals in format f ('-' when empty)"""
    if not vals:
        return "-"
    return (f + " [" + f + ", " + f + "]") % (statistics.median(vals), min(vals), max(vals))


def epoch_rows(out, pattern):
    """{key: [rows of each run's epochs.csv]} for the run folders of out whose name fully
    matches the regular expression pattern; key = the match's groups except the last (the
    seed)"""
    import os
    import re
    runs = {}
    for d in sorted(os.listdir(out)):
        m = re.fullmatch(pattern, d)
        csv = os.path.join(out, d, "epochs.csv")
        if m and os.path.exists(csv):
            rows = [line.strip().split(",") for line in open(csv)][1:]
            if rows:
                key = m.groups()[:-1]
                runs.setdefault(key if len(key) > 1 else key[0], []).append(rows)
    return runs


def loglog_svg(series, xlabel, ylabel, title, width=560, height=380):
    """A log-log line chart as SVG text: series = [(label, [(x, y), ...]), ...] (x, y > 0);
    decade grid lines, one colour per series, a legend"""
    import math
    pts = [p for _, ps in series for p in ps]
    lx = [math.log10(x) for x, _ in pts]
    ly = [math.log10(y) for _, y in pts]
    x0, x1 = math.floor(min(lx)), math.ceil(max(lx))
    y0, y1 = math.floor(min(ly)), math.ceil(max(ly))
    x1, y1 = max(x1, x0 + 1), max(y1, y0 + 1)
    L, R, T, B = 70, 20, 40, 50
    W, H = width - L - R, height - T - B

    def px(x):
        return L + W * (math.log10(x) - x0) / (x1 - x0)

    def py(y):
        return T + H * (1 - (math.log10(y) - y0) / (y1 - y0))

    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" '
           'font-size="12">' % (width, height),
           '<rect width="100%" height="100%" fill="white"/>',
           '<text x="%d" y="20" text-anchor="middle" font-size="14">%s</text>' % (width // 2, title)]
    for e in range(x0, x1 + 1):
        x = L + W * (e - x0) / (x1 - x0)
        out.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>' % (x, T, x, T + H))
        out.append('<text x="%.1f" y="%d" text-anchor="middle">1e%d</text>' % (x, T + H + 16, e))
    for e in range(y0, y1 + 1):
        y = T + H * (1 - (e - y0) / (y1 - y0))
        out.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>' % (L, y, L + W, y))
        out.append('<text x="%d" y="%.1f" text-anchor="end">1e%d</text>' % (L - 6, y + 4, e))
    out.append('<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="black"/>' % (L, T, W, H))
    out.append('<text x="%d" y="%d" text-anchor="middle">%s</text>' % (L + W // 2, height - 10, xlabel))
    out.append('<text x="16" y="%d" text-anchor="middle" transform="rotate(-90 16 %d)">%s</text>'
               % (T + H // 2, T + H // 2, ylabel))
    colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]
    for i, (label, ps) in enumerate(series):
        c = colours[i % len(colours)]
        path = " ".join("%.1f,%.1f" % (px(x), py(y)) for x, y in sorted(ps))
        out.append('<polyline points="%s" fill="none" stroke="%s" stroke-width="2"/>' % (path, c))
        for x, y in ps:
            out.append('<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>' % (px(x), py(y), c))
        out.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"/>'
                   % (L + 10, T + 14 + 16 * i, L + 30, T + 14 + 16 * i, c))
        out.append('<text x="%d" y="%d">%s</text>' % (L + 36, T + 18 + 16 * i, label))
    out.append("</svg>\n")
    return "\n".join(out)
