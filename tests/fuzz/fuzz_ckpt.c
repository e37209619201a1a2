/* fuzz_ckpt.c -- libFuzzer target for bk_checkpoint_load (src/nn/ckpt.c):
 * the input is a safetensors checkpoint, written to a file and loaded with
 * max_batch 1 (model, optimiser and extra metadata).
 * Invariants on success: the header's strings are strict JSON (RFC 8259:
 * no raw control character U+0000..U+001F, only the defined escapes; and,
 * as ckpt.c documents, no \u0000 and no \u escape above U+007F); the model
 * has parameters; saving it (with its optimiser and extra text) with
 * bk_checkpoint_save and loading that file again succeeds with the same
 * configuration, parameter count, parameter bytes, optimiser configuration
 * and step, and extra text.
 *
 * Checkpoints carry an FNV-1a-64 checksum of their data section and their
 * header (files of earlier versions: of the data section and the compiled
 * ASAP layers in the metadata): random mutations would almost never get
 * past it, so the custom mutator below recomputes the stored checksum (1 in
 * 8 times the earlier kind) after most mutations, letting the fuzzer reach
 * the config, model-creation, tensor and ASAP-layer code behind it; and
 * since growing or shrinking the JSON header moves the data section (the
 * file starts with the header's length), it mutates header and data as
 * separate parts. */
#include "birkhoff.h"
#include "fuzz_util.h"

size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size);

static uint64_t fnv(uint64_t h, const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static const uint8_t *find(const uint8_t *hay, size_t n, const char *needle)
{
    const size_t k = strlen(needle);
    for (const uint8_t *p = hay; (size_t)(hay + n - p) >= k; p++) {
        p = memchr(p, needle[0], (size_t)(hay + n - p) - k + 1);
        if (!p) return NULL;
        if (memcmp(p, needle, k) == 0) return p;
    }
    return NULL;
}

/* rewrites the "checksum":"<16 hex>" value as ckpt.c computes it: the
 * data section, then the header with these 16 digits as '0's; or (legacy,
 * the checksum of files written before it covered the header) the data
 * section, then the (escape-free) "asap.<l>" metadata strings in layer order
 * (the first string of each layer counts) */
static void fix_checksum(uint8_t *buf, size_t n, int legacy)
{
    if (n < 8) return;
    uint64_t hl = 0;
    for (int i = 0; i < 8; i++) hl |= (uint64_t)buf[i] << (8 * i);
    if (hl > n - 8) return;
    uint8_t *h = buf + 8, *hend = buf + 8 + hl;
    uint8_t *c = (uint8_t *)find(h, (size_t)hl, "\"checksum\":\"");
    if (!c) return;
    c += 12;
    if (c + 16 > hend) return;
    uint64_t v = fnv(0xcbf29ce484222325ull, hend, n - 8 - (size_t)hl);
    if (!legacy) {
        memset(c, '0', 16);
        v = fnv(v, h, (size_t)hl);
    } else {
        enum { MAXL = 64 };
        const uint8_t *lv[MAXL] = {0};
        size_t ll[MAXL] = {0};
        for (const uint8_t *p = h; (p = find(p, (size_t)(hend - p), "\"asap.")) != NULL;) {
            p += 6;
            int l = 0, digits = 0;
            while (p < hend && *p >= '0' && *p <= '9' && digits < 3) l = l * 10 + (*p++ - '0'), digits++;
            if (!digits || l >= MAXL || hend - p < 3 || memcmp(p, "\":\"", 3) != 0 || lv[l]) continue;
            p += 3;
            const uint8_t *e = p;
            while (e < hend && *e != '"' && *e != '\\') e++;
            if (e >= hend || *e != '"') return; /* escapes: leave it */
            lv[l] = p;
            ll[l] = (size_t)(e - p);
        }
        for (int l = 0; l < MAXL; l++)
            if (lv[l]) v = fnv(v, lv[l], ll[l]);
    }
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)v);
    memcpy(c, hex, 16);
}

/* Sets one "key=value" of the "config" (or "optim") metadata string in the
 * header h[0..*nh) (capacity cap) to an interesting value: the model sizes
 * it holds decide what bk_model_create allocates and computes, and a random
 * byte mutation seldom makes a valid, large or extreme number. */
static void tweak_config(uint8_t *h, size_t *nh, size_t cap, unsigned r)
{
    static const char *vals[] = {"0",     "1",      "2",       "3",          "7",           "17",    "18",
                                 "255",   "256",    "4096",    "4097",       "65535",       "65536", "100000",
                                 "46341", "1000000", "16777216", "2147483647", "-1",          "-2147483648",
                                 "0.5",   "1e-30",  "1e30",    "-0",         "3.4028235e38"};
    const char *field = (r & 1) ? "\"optim\":\"" : "\"config\":\"";
    uint8_t *c = (uint8_t *)find(h, *nh, field);
    if (!c) return;
    c += strlen(field);
    uint8_t *end = c;
    while (end < h + *nh && *end != '"') end++;
    /* the entries are separated by the two characters "\\n"; pick one */
    int count = 1;
    for (uint8_t *p = c; p + 1 < end; p++)
        if (p[0] == '\\' && p[1] == 'n') count++;
    int pick = (int)((r >> 1) % (unsigned)count);
    uint8_t *e = c;
    for (int i = 0; i < pick; i++) {
        while (e + 1 < end && !(e[0] == '\\' && e[1] == 'n')) e++;
        e += 2;
    }
    if (e >= end) return;
    uint8_t *eq = e;
    while (eq < end && *eq != '=' && *eq != '\\') eq++;
    if (eq >= end || *eq != '=') return;
    uint8_t *ve = ++eq;
    while (ve < end && *ve != '\\') ve++;
    const char *v = vals[(r >> 9) % (sizeof vals / sizeof vals[0])];
    const size_t vl = strlen(v), old = (size_t)(ve - eq);
    if (*nh - old + vl > cap) return;
    memmove(eq + vl, ve, (size_t)(h + *nh - ve));
    memcpy(eq, v, vl);
    *nh = *nh - old + vl;
}

/* Mutates the JSON header and the data section separately (or the raw
 * bytes, now and then) and reassembles the file with the right header
 * length; then fixes the checksum (but for 1 in 16 mutations). */
size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed)
{
    uint64_t x = seed; /* splitmix64 (the library's): the choices below from the seed */
    x = bk_splitmix64(&x);
    const unsigned raw = x % 8 == 0, what = (x >> 3) % 4, tweak = (x >> 5) % 2, fix = (x >> 6) % 16 != 0;
    const int legacy = (x >> 10) % 8 == 0;
    const unsigned r = (unsigned)(x >> 13);
    uint64_t hl = 0;
    for (int i = 0; i < 8 && i < (int)size; i++) hl |= (uint64_t)data[i] << (8 * i);
    if (!raw && size >= 8 && hl > 0 && hl < size - 8) {
        const size_t ds = size - 8 - (size_t)hl, room = max_size - 8;
        uint8_t *tmp = malloc(room + 1);
        if (!tmp) return size;
        size_t nh = (size_t)hl, nd = ds;
        memcpy(tmp, data + 8, (size_t)hl);
        memcpy(tmp + room - ds, data + 8 + hl, ds); /* header at the front, data at the end */
        /* what: 0, 1 the header (0: half the time a config value); 2 the data; 3 both */
        if (what == 0 && tweak) tweak_config(tmp, &nh, room - nd, r);
        else if (what != 2) nh = LLVMFuzzerMutate(tmp, nh, room - nd);
        memmove(tmp + nh, tmp + room - nd, nd); /* the data follow the header again */
        if (what >= 2) nd = LLVMFuzzerMutate(tmp + nh, nd, room - nh);
        for (int i = 0; i < 8; i++) data[i] = (uint8_t)((uint64_t)nh >> (8 * i));
        memcpy(data + 8, tmp, nh + nd);
        free(tmp);
        size = 8 + nh + nd;
    } else {
        size = LLVMFuzzerMutate(data, size, max_size);
    }
    if (fix) fix_checksum(data, size, legacy);
    return size;
}

/* the first string of the (accepted) JSON header that the loader should
 * have refused, as a message; NULL when every string is strict */
static const char *bad_string(const uint8_t *buf, size_t n, char *why, size_t cap)
{
    if (n < 8) return NULL;
    uint64_t hl = 0;
    for (int i = 0; i < 8; i++) hl |= (uint64_t)buf[i] << (8 * i);
    if (hl > n - 8) return NULL;
    const uint8_t *p = buf + 8, *end = buf + 8 + hl;
    int in = 0;
    for (; p < end; p++) {
        if (!in) {
            in = *p == '"';
            continue;
        }
        const size_t at = (size_t)(p - buf);
        if (*p == '"') {
            in = 0;
        } else if (*p < 0x20) {
            snprintf(why, cap, "raw control character 0x%02x in a string at offset %zu", *p, at);
            return why;
        } else if (*p == '\\') {
            if (++p >= end) break;
            if (*p == 'u') {
                unsigned v = 0;
                for (int k = 1; k <= 4; k++) {
                    const int c = p + k < end ? p[k] : -1;
                    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                                                 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
                    if (d < 0) {
                        snprintf(why, cap, "an invalid \\u escape at offset %zu", at);
                        return why;
                    }
                    v = v * 16 + (unsigned)d;
                }
                if (v == 0 || v > 0x7f) {
                    snprintf(why, cap, "\\u%04x at offset %zu", v, at);
                    return why;
                }
                p += 4;
            } else if (!strchr("\"\\/bfnrt", *p) || *p == 0) {
                snprintf(why, cap, "an invalid escape at offset %zu", at);
                return why;
            }
        }
    }
    return NULL;
}

static char *cfg_text(const bk_model *m)
{
    size_t k = bk_model_config_format(bk_model_get_config(m), NULL, 0);
    char *s = malloc(k + 1);
    if (!s) fz_fail("out of memory");
    bk_model_config_format(bk_model_get_config(m), s, k + 1);
    return s;
}

static char *opt_text(const bk_optim *o)
{
    if (!o) return NULL;
    size_t k = bk_optim_config_format(bk_optim_get_config(o), NULL, 0);
    char *s = malloc(k + 1);
    if (!s) fz_fail("out of memory");
    bk_optim_config_format(bk_optim_get_config(o), s, k + 1);
    return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
    bk_model *m = (bk_model *)1;
    bk_optim *o = (bk_optim *)1;
    char *extra = (char *)1;
    const char *in = fz_write(0, data, n);
    /* a valid checkpoint of a model too large for the fuzzer's 2 GB (the
     * loader itself only refuses more than the machine's memory): what it
     * would cost is known before loading, and it is not loaded */
    bk_model_config cfg;
    size_t need = 0;
    if (bk_checkpoint_config(in, &cfg) == BK_OK && bk_model_memory(&cfg, 1, NULL, &need) == BK_OK &&
        need > ((size_t)256 << 20))
        return 0;
    if (bk_checkpoint_load(in, 1, &m, &o, &extra) != BK_OK) {
        FZ_CHECK(m == NULL && o == NULL && extra == NULL, "ckpt: failed but returned objects");
        FZ_CHECK(bk_last_error()[0] != 0, "ckpt: failed without a message");
        return 0;
    }
    FZ_CHECK(m != NULL, "ckpt: succeeded without a model");
    char why[128];
    const char *bad = bad_string(data, n, why, sizeof why);
    FZ_CHECK(bad == NULL, "ckpt: loaded a header that is not strict JSON: %s", bad);
    const int64_t np = bk_model_num_params(m);
    FZ_CHECK(np > 0, "ckpt: %lld parameters", (long long)np);

    const char *path = fz_tmp(1);
    if (bk_checkpoint_save(path, m, o, extra) != BK_OK) fz_fail("ckpt: cannot save a loaded model: %s", bk_last_error());
    bk_model *m2 = NULL;
    bk_optim *o2 = NULL;
    char *extra2 = NULL;
    if (bk_checkpoint_load(path, 1, &m2, &o2, &extra2) != BK_OK)
        fz_fail("ckpt: the saved checkpoint does not load: %s", bk_last_error());
    FZ_CHECK(bk_model_num_params(m2) == np, "ckpt: %lld parameters after the round trip, %lld before",
             (long long)bk_model_num_params(m2), (long long)np);
    FZ_CHECK(memcmp(bk_model_params(m), bk_model_params(m2), sizeof(float) * (size_t)np) == 0,
             "ckpt: parameters changed in the round trip");
    char *c1 = cfg_text(m), *c2 = cfg_text(m2);
    FZ_CHECK(strcmp(c1, c2) == 0, "ckpt: model config changed in the round trip:\n%s\n---\n%s", c1, c2);
    FZ_CHECK(bk_model_param_count(m) == bk_model_param_count(m2), "ckpt: tensor count changed in the round trip");
    FZ_CHECK((o == NULL) == (o2 == NULL), "ckpt: optimiser %s in the round trip", o ? "lost" : "appeared");
    if (o) {
        char *p1 = opt_text(o), *p2 = opt_text(o2);
        FZ_CHECK(strcmp(p1, p2) == 0, "ckpt: optimiser config changed in the round trip:\n%s\n---\n%s", p1, p2);
        FZ_CHECK(bk_optim_step_count(o) == bk_optim_step_count(o2), "ckpt: optimiser step changed in the round trip");
        free(p1);
        free(p2);
    }
    FZ_CHECK((extra == NULL) == (extra2 == NULL) && (!extra || strcmp(extra, extra2) == 0),
             "ckpt: extra metadata changed in the round trip");
    /* saved again, the reloaded model gives the same file, byte for byte
     * (tensors, optimiser state, ASAP layers, metadata) */
    const char *path2 = fz_tmp(2);
    if (bk_checkpoint_save(path2, m2, o2, extra2) != BK_OK)
        fz_fail("ckpt: cannot save the reloaded model: %s", bk_last_error());
    size_t n1, n2;
    char *f1 = fz_read(path, &n1), *f2 = fz_read(path2, &n2);
    FZ_CHECK(n1 == n2 && memcmp(f1, f2, n1) == 0, "ckpt: saving the reloaded model gives a different file");
    free(f1);
    free(f2);
    free(c1);
    free(c2);
    free(extra);
    free(extra2);
    bk_optim_free(o);
    bk_optim_free(o2);
    bk_model_free(m);
    bk_model_free(m2);
    return 0;
}
