/* optim.c -- AdamW / Adam / SGD with momentum, learning-rate schedules,
 * global-norm clipping and the training step with gradient accumulation
 * (docs/MODEL.md). PyTorch's update formulas, float32 state. */
#include "nn.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const OPT_NAMES[] = {"adamw", "adam", "sgd", NULL};
static const char *const SCHED_NAMES[] = {"constant", "step", "cosine", "invsqrt", NULL};

#define F(field, ty) {.name = #field, .type = ty, .offset = offsetof(bk_optim_config, field), .names = NULL, .list_len = 0}
static const bki_field OPT_FIELDS[] = {
    {.name = "kind", .type = BKI_F_ENUM, .offset = offsetof(bk_optim_config, kind), .names = OPT_NAMES, .list_len = 0},
    F(lr, BKI_F_FLOAT),
    F(beta1, BKI_F_FLOAT),
    F(beta2, BKI_F_FLOAT),
    F(eps, BKI_F_FLOAT),
    F(weight_decay, BKI_F_FLOAT),
    F(momentum, BKI_F_FLOAT),
    F(nesterov, BKI_F_INT),
    F(clip, BKI_F_FLOAT),
    {.name = "sched", .type = BKI_F_ENUM, .offset = offsetof(bk_optim_config, sched), .names = SCHED_NAMES, .list_len = 0},
    F(warmup, BKI_F_INT),
    F(total_steps, BKI_F_I64),
    F(lr_min, BKI_F_FLOAT),
    F(gamma, BKI_F_FLOAT),
    {.name = "milestones", .type = BKI_F_LIST, .offset = offsetof(bk_optim_config, milestones), .names = NULL, .list_len = 8},
    F(decay_embed, BKI_F_INT),
};
#undef F
#define NOPT ((int)(sizeof OPT_FIELDS / sizeof OPT_FIELDS[0]))

bk_optim_config bk_optim_config_default(void)
{
    bk_optim_config c;
    memset(&c, 0, sizeof c);
    c.kind = BK_OPT_ADAMW;
    c.lr = 1e-3f;
    c.beta1 = 0.9f;
    c.beta2 = 0.999f;
    c.eps = 1e-8f;
    c.weight_decay = 0.01f;
    c.sched = BK_SCHED_CONSTANT;
    c.gamma = 0.1f;
    return c;
}

bk_status bk_optim_config_set(bk_optim_config *c, const char *key, const char *value)
{
    return bki_cfg_set(c, OPT_FIELDS, NOPT, "optimiser config", key, value);
}
bk_status bk_optim_config_parse(bk_optim_config *c, const char *text)
{
    return bki_cfg_parse(c, OPT_FIELDS, NOPT, "optimiser config", text);
}
size_t bk_optim_config_format(const bk_optim_config *c, char *buf, size_t cap)
{
    return bki_cfg_format(c, OPT_FIELDS, NOPT, buf, cap);
}

static bk_status check_cfg(const bk_optim_config *c)
{
#define NEED(cond, ...)                                                                                            \
    do {                                                                                                           \
        if (!(cond)) return bki_fail(BK_ERR_PARAM, "optimiser config: " __VA_ARGS__);                              \
    } while (0)
    NEED(c->kind >= BK_OPT_ADAMW && c->kind <= BK_OPT_SGD, "unknown optimiser %d", (int)c->kind);
    NEED(c->lr > 0.0f && isfinite(c->lr), "lr must be > 0 (got %g)", (double)c->lr);
    NEED(c->beta1 >= 0.0f && c->beta1 < 1.0f && c->beta2 >= 0.0f && c->beta2 < 1.0f, "betas must be in [0, 1)");
    NEED(c->eps > 0.0f, "eps must be > 0");
    NEED(c->weight_decay >= 0.0f, "weight_decay must be >= 0");
    NEED(c->momentum >= 0.0f && c->momentum < 1.0f, "momentum must be in [0, 1)");
    NEED(c->nesterov == 0 || (c->nesterov == 1 && c->momentum > 0.0f), "nesterov needs momentum > 0");
    NEED(c->clip >= 0.0f, "clip must be >= 0");
    NEED(c->sched >= BK_SCHED_CONSTANT && c->sched <= BK_SCHED_INVSQRT, "unknown schedule %d", (int)c->sched);
    NEED(c->warmup >= 0, "warmup must be >= 0 (-1, a run's automatic warm-up, is resolved when the run starts)");
    NEED(c->decay_embed == 0 || c->decay_embed == 1, "decay_embed is a 0/1 switch (got %d)", c->decay_embed);
    NEED(c->total_steps >= 0, "total_steps must be >= 0 (got %lld)", (long long)c->total_steps);
    NEED(c->sched != BK_SCHED_COSINE || c->total_steps > c->warmup, "cosine needs total_steps > warmup");
    NEED(c->lr_min >= 0.0f && c->lr_min <= c->lr, "lr_min must be in [0, lr]");
    NEED(c->gamma > 0.0f, "gamma must be > 0");
    for (int i = 1; i < 8 && c->milestones[i] > 0; i++)
        NEED(c->milestones[i] > c->milestones[i - 1], "milestones must increase");
#undef NEED
    return BK_OK;
}

void bki_optim_plan(bk_optim_config *c, int64_t run_steps)
{
    if (c->sched == BK_SCHED_COSINE && c->total_steps == 0) c->total_steps = run_steps;
    if (c->warmup != -1) return; /* (only -1 is automatic: another negative is refused by the check) */
    const int64_t steps = c->sched == BK_SCHED_COSINE ? c->total_steps : run_steps;
    const int64_t w = steps / BKI_WARMUP_DIV;
    c->warmup = (int)(w < BKI_WARMUP_MAX ? w : BKI_WARMUP_MAX);
}

float bk_optim_lr(const bk_optim_config *c, int64_t step)
{
    if (!c) return 0.0f;
    if (step < c->warmup) return c->lr * (float)(step + 1) / (float)c->warmup;
    switch (c->sched) {
    case BK_SCHED_CONSTANT: return c->lr;
    case BK_SCHED_STEP: {
        double lr = c->lr;
        for (int i = 0; i < 8 && c->milestones[i] > 0; i++)
            if (step >= c->milestones[i]) lr *= c->gamma;
        return (float)lr;
    }
    case BK_SCHED_INVSQRT: /* fairseq's inverse_sqrt: lr sqrt(warmup / (step + 1)) after the warm-up */
        return (float)((double)c->lr * sqrt((double)(c->warmup > 0 ? c->warmup : 1) / (double)(step + 1)));
    case BK_SCHED_COSINE: {
        if (step >= c->total_steps) return c->lr_min;
        const double t = (double)(step - c->warmup) / (double)(c->total_steps - c->warmup);
        return (float)(c->lr_min + (c->lr - c->lr_min) * 0.5 * (1.0 + cos(3.14159265358979323846 * t)));
    }
    }
    return c->lr;
}

struct bk_optim {
    bk_optim_config c;
    int64_t step, P;
    float *s0, *s1; /* m / momentum buffer, v */
};

int bki_optim_slots(const bk_optim *o) { return o->c.kind == BK_OPT_SGD ? (o->c.momentum > 0.0f ? 1 : 0) : 2; }
const char *bki_optim_slot_name(const bk_optim *o, int slot)
{
    if (o->c.kind == BK_OPT_SGD) return "buf";
    return slot == 0 ? "m" : "v";
}
float *bki_optim_slot(bk_optim *o, int slot) { return slot == 0 ? o->s0 : o->s1; }
void bki_optim_set_step(bk_optim *o, int64_t step) { o->step = step; }
int64_t bk_optim_step_count(const bk_optim *o) { return o ? o->step : 0; }
const bk_optim_config *bk_optim_get_config(const bk_optim *o) { return o ? &o->c : NULL; }

bk_status bk_optim_create(const bk_optim_config *c, const bk_model *m, bk_optim **out)
{
    if (!c || !m || !out) return bki_fail(BK_ERR_NULL, "bk_optim_create: NULL argument");
    *out = NULL;
    bk_status st = check_cfg(c);
    if (st) return st;
    bk_optim *o = calloc(1, sizeof *o);
    if (!o) return bki_fail(BK_ERR_NOMEM, "bk_optim_create: out of memory");
    o->c = *c;
    o->P = bk_model_num_params(m);
    const int slots = bki_optim_slots(o);
    if (slots >= 1) o->s0 = bki_calloc((size_t)o->P, sizeof(float));
    if (slots >= 2) o->s1 = bki_calloc((size_t)o->P, sizeof(float));
    if ((slots >= 1 && !o->s0) || (slots >= 2 && !o->s1)) {
        bk_optim_free(o);
        return bki_fail(BK_ERR_NOMEM, "bk_optim_create: out of memory for the state");
    }
    *out = o;
    return BK_OK;
}

void bk_optim_free(bk_optim *o)
{
    if (!o) return;
    free(o->s0);
    free(o->s1);
    free(o);
}

/* the sum of squares of the gradient, in double: fixed blocks of
 * NORM_BLOCK floats (a function of P only), each summed in vector lanes,
 * the block sums added in block order (an ordered loop): the same bits on
 * any thread count. (A serial chain of P dependent adds ran on one thread
 * while the others waited: 0.6 ms of a 60 ms training step.) */
#define NORM_BLOCK 16384
typedef struct {
    const float *g;
    int64_t P;
    double ss;
} grad_sumsq_args;

static void grad_sumsq_member(void *arg)
{
    grad_sumsq_args *a = arg;
    const float *g = a->g;
    const int64_t P = a->P;
    const bki_team tm = bki_region_team();
    bki_claims cl = bki_claims_open_ordered(&tm, (P + NORM_BLOCK - 1) / NORM_BLOCK);
    for (int64_t blk; bki_claims_next(&cl, &blk);) {
        const int64_t i0 = blk * NORM_BLOCK, i1 = i0 + NORM_BLOCK < P ? i0 + NORM_BLOCK : P;
        double s = 0.0;
#pragma omp simd reduction(+ : s)
        for (int64_t i = i0; i < i1; i++) s += (double)g[i] * g[i];
        bki_ordered_begin(&cl, blk);
        a->ss += s;
        bki_ordered_end(&cl, blk);
    }
}

static double grad_sumsq(const float *g, int64_t P, int nt)
{
    grad_sumsq_args a = {g, P, 0.0};
    bki_parallel_claimed(P > 65536 ? nt : 1, grad_sumsq_member, &a);
    return a.ss;
}

/* the updates of elements [a, b) of the flat arrays (m0, m1: the state,
 * NULL where the kind keeps none) */
static void sgd_range(const bk_optim_config *c, int first, float lr, float wd, float gs, float *pw, const float *pg,
                      float *m0, int64_t a, int64_t b)
{
    const float mu = c->momentum;
    for (int64_t i = a; i < b; i++) {
        float gi = pg[i] * gs;
        if (wd > 0.0f) gi += wd * pw[i];
        if (mu > 0.0f) {
            m0[i] = first ? gi : mu * m0[i] + gi;
            gi = c->nesterov ? gi + mu * m0[i] : m0[i];
        }
        pw[i] -= lr * gi;
    }
}

static void adam_range(const bk_optim_config *c, int adamw, float lr, float wd, float gs, float step_size, float bc2s,
                       float *pw, const float *pg, float *m0, float *m1, int64_t a, int64_t b)
{
    const float b1 = c->beta1, b2 = c->beta2, eps = c->eps;
    for (int64_t i = a; i < b; i++) {
        float gi = pg[i] * gs;
        if (adamw)
            pw[i] *= 1.0f - lr * wd;
        else if (wd > 0.0f)
            gi += wd * pw[i];
        m0[i] = b1 * m0[i] + (1.0f - b1) * gi;
        m1[i] = b2 * m1[i] + (1.0f - b2) * gi * gi;
        const float denom = sqrtf(m1[i]) / bc2s + eps;
        pw[i] -= step_size * (m0[i] / denom);
    }
}

/* The update over the flat parameter array in blocks of whole 64-byte
 * lines taken at run time (about 8 a member; each element's update is the
 * same arithmetic wherever it runs); a block walks the tensors it
 * overlaps. (One region a tensor, each below 65536 floats serial, left the
 * other threads idle for the whole update.) */
typedef struct {
    const bk_optim *o;
    const bki_param *tab;
    int np;
    float *w;
    const float *g;
    float gs, lr, step_size, bc2s;
} update_args;

static void update_member(void *arg)
{
    const update_args *u = arg;
    const bk_optim *o = u->o;
    const bk_optim_config *c = &o->c;
    const bki_team tm = bki_region_team();
    const int64_t P = o->P, want = 8 * (int64_t)tm.nt;
    int64_t chunk = P > 0 ? P : 1;
    if (tm.nt > 1) {
        chunk = ((P + want - 1) / want + 15) / 16 * 16;
        if (chunk < 4096) chunk = 4096;
    }
    bki_claims cl = bki_claims_open(&tm, (P + chunk - 1) / chunk);
    for (int64_t blk; bki_claims_next(&cl, &blk);) {
        const int64_t lo = blk * chunk, hi = lo + chunk < P ? lo + chunk : P;
        for (int pi = 0; pi < u->np; pi++) {
            const bki_param *p = &u->tab[pi];
            const int64_t a = p->off > lo ? p->off : lo, b = p->off + p->count < hi ? p->off + p->count : hi;
            if (a >= b) continue;
            const int decays = p->decay == BK_DECAY_WEIGHT || (p->decay == BK_DECAY_EMBED && c->decay_embed);
            const float wd = decays ? c->weight_decay : 0.0f;
            if (c->kind == BK_OPT_SGD)
                sgd_range(c, o->step == 0, u->lr, wd, u->gs, u->w, u->g, o->s0, a, b);
            else
                adam_range(c, c->kind == BK_OPT_ADAMW, u->lr, wd, u->gs, u->step_size, u->bc2s, u->w, u->g, o->s0,
                           o->s1, a, b);
        }
    }
}

bk_status bk_optim_step(bk_optim *o, bk_model *m, double *gnorm)
{
    if (!o || !m) return bki_fail(BK_ERR_NULL, "bk_optim_step: NULL argument");
    if (bk_model_num_params(m) != o->P)
        return bki_fail(BK_ERR_SHAPE, "bk_optim_step: the optimiser was made for %lld parameters, the model has %lld",
                        (long long)o->P, (long long)bk_model_num_params(m));
    float *w = bk_model_params(m), *g = bk_model_grads(m);
    int np;
    const bki_param *tab = bki_model_table(m, &np);
    const int nt = bki_threads();
    const double norm = sqrt(grad_sumsq(g, o->P, nt));
    if (gnorm) *gnorm = norm;
    if (!isfinite(norm)) return bki_fail(BK_ERR_NONFINITE, "bk_optim_step: non-finite gradient norm; update refused");
    const bk_optim_config *c = &o->c;
    float gs = 1.0f;
    if (c->clip > 0.0f && norm > c->clip) gs = (float)(c->clip / (norm + 1e-6));
    const float lr = bk_optim_lr(c, o->step);
    const int64_t t = o->step + 1;
    const float bc1 = 1.0f - powf(c->beta1, (float)t), bc2 = 1.0f - powf(c->beta2, (float)t);
    const float bc2s = sqrtf(bc2), step_size = lr / bc1;
    update_args u = {o, tab, np, w, g, gs, lr, step_size, bc2s};
    bki_parallel_claimed(o->P > 65536 ? nt : 1, update_member, &u);
    o->step++;
    bki_model_post_update(m);
    return BK_OK;
}

/* samples [s, s + n) of a batch */
/* Micro-batches [k0, k1) of chunk samples of b (the last may be shorter):
 * chunk k runs with the dropout counter base + k (base: the counter on
 * entry), its gradient ADDED with weight w_k / total_w (w: samples, or a
 * seq2seq chunk's target tokens), its mean loss times w_k added to
 * *loss_sum and (hits not NULL) its argmax hits to *hits; the counter is
 * left at base + nchunks of the whole batch, as one process running every
 * chunk leaves it. bk_train_step runs every chunk; the training loop's rank
 * its share. */
bk_status bki_train_accumulate(bk_model *m, const bk_batch *b, int chunk, int k0, int k1, int64_t total_w, float ls,
                               double *loss_sum, int64_t *hits)
{
    const int nchunks = (b->B + chunk - 1) / chunk;
    const uint64_t count0 = bki_model_fwd_count(m);
    bk_status st = BK_OK;
    for (int k = k0; k < k1 && st == BK_OK; k++) {
        const int b0 = k * chunk, n = b->B - b0 < chunk ? b->B - b0 : chunk;
        bki_model_set_fwd_count(m, count0 + (uint64_t)k);
        const bk_batch part = bki_batch_slice(m, b, b0, n);
        const int64_t w = bki_batch_weight(m, &part);
        double l = 0.0;
        int64_t hit = 0;
        if ((st = bk_model_forward(m, &part, 1, ls, NULL, &l)) != BK_OK ||
            (st = bk_model_backward(m, (float)w / (float)total_w)) != BK_OK ||
            (hits && (st = bk_model_token_stats(m, NULL, &hit)) != BK_OK))
            break;
        *loss_sum += l * (double)w;
        if (hits) *hits += hit;
    }
    bki_model_set_fwd_count(m, count0 + (uint64_t)nchunks);
    return st;
}

bk_status bk_train_step(bk_model *m, bk_optim *o, const bk_batch *b, int micro, float ls, double *loss, double *gnorm)
{
    if (!m || !o || !b) return bki_fail(BK_ERR_NULL, "bk_train_step: NULL argument");
    if (micro < 0) return bki_fail(BK_ERR_PARAM, "bk_train_step: micro must be >= 0");
    if (b->B < 1) return bki_fail(BK_ERR_SHAPE, "bk_train_step: empty batch");
    const int mb = micro > 0 && micro < b->B ? micro : b->B;
    /* a micro-batch's weight: its samples (classifier) or its target
     * tokens (seq2seq: the loss averages over tokens) */
    const int64_t total_w = bki_batch_weight(m, b);
    if (total_w < 1) return bki_fail(BK_ERR_LENGTH, "bk_train_step: no target tokens in the batch");
    bk_model_zero_grad(m);
    double total = 0.0;
    const bk_status st = bki_train_accumulate(m, b, mb, 0, (b->B + mb - 1) / mb, total_w, ls, &total, NULL);
    if (st) return st;
    if (loss) *loss = total / (double)total_w;
    return bk_optim_step(o, m, gnorm);
}
