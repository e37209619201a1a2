/* attn.c -- `birkhoff attn`: run an attention operator on .npy files.
 *
 * Nothing here knows an operator: `--op NAME` is found in the registry
 * (birkhoff/ops.h), its options are its schema's parameters (`--KEY VALUE`,
 * older spellings through the keys' aliases) and arrays (inputs such as
 * `--pivots Z.npy`, extra outputs such as `--diag D.npy`), and the help and
 * `--list` table are generated from the same schema. An operator registered
 * in src/ops/registry.c is usable here with no edit of this file. */
#include "../cli.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAXP = 64, MAXA = 16 };

/* the options every operator has */
typedef struct {
    const char *op, *q, *k, *v, *out, *qlen, *klen, *attn, *dout, *dq, *dk, *dv, *threads;
    int list, markdown;
} attn_common;

/* what the command line asks of the operator */
typedef struct {
    const bk_op *op;
    const char *preset;             /* the preset's key=value text, or NULL   */
    int nkeys;
    const char *key_flag[MAXP], *key_val[MAXP];
    int key_idx[MAXP];
    const char *arr_flag[MAXA], *arr_path[MAXA];
    int narr;
    bk_op_array ai[MAXA];
} attn_ask;

static const char *const COMMON_HELP =
    "Inputs are float32 .npy arrays: Q [B,H,Nq,d], K [B,H,Nk,d], V [B,H,Nk,dv].\n"
    "Writes O [B,H,Nq,dv]. Every output file is written atomically (all or none).\n"
    "\n"
    "options of every operator:\n"
    "  --q-len L.npy     int32 [B] valid query lengths (padding)\n"
    "  --k-len L.npy     int32 [B] valid key lengths\n"
    "  --attn A.npy      also write the attention matrix [B,H,Nq,Nk]\n"
    "  --dout dO.npy     upstream gradient [B,H,Nq,dv]: run the backward too, writing\n"
    "  --dq F --dk F --dv F   the gradients (any subset)\n"
    "  --threads N       threads (default: all cores); results do not depend on it\n";

static void attn_usage(FILE *f)
{
    fprintf(f, "usage: birkhoff attn --op NAME --q Q.npy --k K.npy --v V.npy --out O.npy [options]\n"
               "       birkhoff attn --op NAME --help     the operator's options\n"
               "       birkhoff attn --list [--markdown]  the operator table (docs/OPERATORS.md)\n\n%s\n"
               "operators (the registry's):\n",
            COMMON_HELP);
    for (int i = 0; i < bk_op_count(); i++) {
        const bk_op *op = bk_op_at(i);
        fprintf(f, "  %-12s %s\n", bk_op_name(op), bk_op_doc(op));
        for (int j = 0; j < bk_op_preset_count(op); j++) {
            bk_op_preset pr;
            if (bk_op_preset_info(op, j, &pr) == BK_OK) fprintf(f, "  %-12s %s (%s)\n", pr.name, pr.doc, pr.params);
        }
    }
}

/* "--KEY" of a key: '_' written '-' */
static void flag_of(const char *key, char *buf, size_t cap)
{
    snprintf(buf, cap, "--%s", key);
    for (char *c = buf; *c; c++)
        if (*c == '_') *c = '-';
}

static const char *const CAP_NAMES[] = {"cross-attention", "padding", "causal", "attention matrix", "model kind"};

static void caps_text(unsigned caps, char *buf, size_t cap, const char *sep)
{
    buf[0] = 0;
    for (int b = 0; b < 5; b++)
        if (caps & (1u << b)) {
            if (buf[0]) strncat(buf, sep, cap - strlen(buf) - 1);
            strncat(buf, CAP_NAMES[b], cap - strlen(buf) - 1);
        }
}

static const char *kind_text(unsigned kind)
{
    if (kind & BK_OP_ARRAY_FILE) return kind & BK_OP_ARRAY_REQUIRED ? "input file (required)" : "input file";
    if (kind & BK_OP_ARRAY_IN) return kind & BK_OP_ARRAY_REQUIRED ? "input (required)" : "input";
    return kind & BK_OP_ARRAY_BWD ? "backward output" : "forward output";
}

/* a parameter's values in words: "unrolled|implicit", or its type */
static void values_text(const bk_op_param *p, char *buf, size_t cap)
{
    if (!p->values) {
        snprintf(buf, cap, "%s", p->type);
        return;
    }
    buf[0] = 0;
    for (int i = 0; p->values[i]; i++) {
        if (i) strncat(buf, "|", cap - strlen(buf) - 1);
        strncat(buf, p->values[i], cap - strlen(buf) - 1);
    }
}

/* `birkhoff attn --op NAME --help` */
static void op_usage(FILE *f, const bk_op *op)
{
    char caps[128], fl[64], vals[128];
    caps_text(bk_op_caps(op), caps, sizeof caps, ", ");
    fprintf(f, "usage: birkhoff attn --op %s --q Q.npy --k K.npy --v V.npy --out O.npy [options]\n\n%s: %s\n",
            bk_op_name(op), bk_op_name(op), bk_op_doc(op));
    fprintf(f, "capabilities: %s%s\n\n%s", caps[0] ? caps : "none", bk_op_has_backward(op) ? ", backward" : "",
            COMMON_HELP);
    if (bk_op_config_count(op)) fprintf(f, "\nparameters of --op %s:\n", bk_op_name(op));
    for (int i = 0; i < bk_op_config_count(op); i++) {
        bk_op_param p;
        if (bk_op_param_info(op, i, &p)) continue;
        flag_of(p.key, fl, sizeof fl);
        values_text(&p, vals, sizeof vals);
        fprintf(f, "  %-16s %s\n  %-16s (%s; default %s%s%s", fl, p.doc, "", vals, p.def, p.range[0] ? "; in " : "",
                p.range);
        if (p.alias) fprintf(f, "; also --%s", p.alias);
        fprintf(f, ")\n");
    }
    if (bk_op_array_count(op)) fprintf(f, "\narrays of --op %s (float32 .npy files unless said):\n", bk_op_name(op));
    for (int i = 0; i < bk_op_array_count(op); i++) {
        bk_op_array a;
        if (bk_op_array_info(op, i, &a)) continue;
        flag_of(a.name, fl, sizeof fl);
        fprintf(f, "  %-16s %s %s: %s%s%s%s\n", fl, kind_text(a.kind), a.shape, a.doc,
                a.kind & BK_OP_ARRAY_BWD ? " (with --dout)" : "", a.alias ? "; also --" : "", a.alias ? a.alias : "");
    }
}

/* ---- the operator table (--list; docs/OPERATORS.md is its --markdown) ---- */
static void list_plain(FILE *f)
{
    char caps[128];
    for (int i = 0; i < bk_op_count(); i++) {
        const bk_op *op = bk_op_at(i);
        caps_text(bk_op_caps(op), caps, sizeof caps, ", ");
        fprintf(f, "%-12s %s\n%-12s keys:", bk_op_name(op), bk_op_doc(op), "");
        for (int j = 0; j < bk_op_config_count(op); j++) fprintf(f, " %s", bk_op_config_key(op, j));
        fprintf(f, "\n%-12s arrays:", "");
        for (int j = 0; j < bk_op_array_count(op); j++) {
            bk_op_array a;
            if (bk_op_array_info(op, j, &a) == BK_OK) fprintf(f, " %s", a.name);
        }
        fprintf(f, "\n%-12s %s%s\n", "", caps, bk_op_has_backward(op) ? ", backward" : ", no backward");
    }
}

/* a table cell: '|' escaped */
static void md(FILE *f, const char *s)
{
    for (; *s; s++) {
        if (*s == '|') fputc('\\', f);
        fputc(*s, f);
    }
}

static void list_markdown_op(FILE *f, const bk_op *op)
{
    char vals[128], fl[64];
    fprintf(f, "\n### %s\n\n%s.\n", bk_op_name(op), bk_op_doc(op));
    if (bk_op_config_count(op)) fprintf(f, "\n| key | values | default | range | meaning |\n|---|---|---|---|---|\n");
    for (int j = 0; j < bk_op_config_count(op); j++) {
        bk_op_param p;
        if (bk_op_param_info(op, j, &p)) continue;
        values_text(&p, vals, sizeof vals);
        fprintf(f, "| `%s`%s%s%s | ", p.key, p.alias ? " (`--" : "", p.alias ? p.alias : "", p.alias ? "`)" : "");
        md(f, vals);
        fprintf(f, " | %s | %s | ", p.def, p.range);
        md(f, p.doc);
        fprintf(f, " |\n");
    }
    if (bk_op_array_count(op)) fprintf(f, "\n| array | kind | shape | meaning |\n|---|---|---|---|\n");
    for (int j = 0; j < bk_op_array_count(op); j++) {
        bk_op_array a;
        if (bk_op_array_info(op, j, &a)) continue;
        flag_of(a.name, fl, sizeof fl);
        fprintf(f, "| `%s` | %s | %s | ", fl, kind_text(a.kind), a.shape);
        md(f, a.doc);
        fprintf(f, " |\n");
    }
    for (int j = 0; j < bk_op_preset_count(op); j++) {
        bk_op_preset pr;
        if (bk_op_preset_info(op, j, &pr) == BK_OK)
            fprintf(f, "\nPreset `%s`: %s (`%s`).\n", pr.name, pr.doc, pr.params);
    }
    if (bk_op_bench_count(op)) fprintf(f, "\nBench cases (B:H:Nq:Nk:d:dv, parameters):");
    for (int j = 0; j < bk_op_bench_count(op); j++) {
        bk_op_bench_case bc;
        if (bk_op_bench_info(op, j, &bc) == BK_OK)
            fprintf(f, "%s %s%s%d:%d:%d:%d:%d:%d%s%s%s", j ? ";" : "", bc.name, bc.name[0] ? " " : "", bc.B, bc.H,
                    bc.Nq, bc.Nk, bc.d, bc.dv, bc.params[0] ? " `" : "", bc.params, bc.params[0] ? "`" : "");
    }
    if (bk_op_bench_count(op)) fprintf(f, ".\n");
}

static void list_markdown(FILE *f)
{
    char caps[128];
    fprintf(f, "| operator | computes | backward | capabilities |\n|---|---|---|---|\n");
    for (int i = 0; i < bk_op_count(); i++) {
        const bk_op *op = bk_op_at(i);
        caps_text(bk_op_caps(op), caps, sizeof caps, ", ");
        fprintf(f, "| [`%s`](#%s) | ", bk_op_name(op), bk_op_name(op));
        md(f, bk_op_doc(op));
        fprintf(f, " | %s | %s |\n", bk_op_has_backward(op) ? "yes" : "no", caps);
    }
    for (int i = 0; i < bk_op_count(); i++) list_markdown_op(f, bk_op_at(i));
}

/* ---- parsing ---------------------------------------------------------- */
/* the operator of --op NAME (a registry name or a preset), or NULL */
static const bk_op *find_op(const char *name, const char **preset)
{
    *preset = NULL;
    const bk_op *op = bk_op_find(name);
    return op ? op : bk_op_find_preset(name, preset);
}

static int unknown_op(const char *name)
{
    char names[512] = "";
    for (int i = 0; i < bk_op_count(); i++) {
        const bk_op *op = bk_op_at(i);
        if (i) strncat(names, ", ", sizeof names - strlen(names) - 1);
        strncat(names, bk_op_name(op), sizeof names - strlen(names) - 1);
        for (int j = 0; j < bk_op_preset_count(op); j++) {
            bk_op_preset pr;
            if (bk_op_preset_info(op, j, &pr)) continue;
            strncat(names, ", ", sizeof names - strlen(names) - 1);
            strncat(names, pr.name, sizeof names - strlen(names) - 1);
        }
    }
    fprintf(stderr, "birkhoff attn: unknown --op '%s' (%s)\n", name, names);
    return CLI_USAGE;
}

/* an option of other operators but not of this one: says which */
static int not_this_op(const char *flag, const char *opname)
{
    char names[256] = "";
    int n = 0;
    for (int i = 0; i < bk_op_count(); i++) {
        const bk_op *o = bk_op_at(i);
        if (bk_op_param_find(o, flag + 2) < 0 && bk_op_array_find(o, flag + 2) < 0) continue;
        if (n++) strncat(names, ", ", sizeof names - strlen(names) - 1);
        strncat(names, bk_op_name(o), sizeof names - strlen(names) - 1);
    }
    if (!n) return 0;
    fprintf(stderr, "birkhoff attn: %s applies to --op %s only (not to --op %s; see birkhoff attn --op %s --help)\n",
            flag, names, opname, opname);
    return 1;
}

static const char **common_slot(attn_common *c, const char *flag)
{
    static const char *const names[] = {"--op", "--q", "--k", "--v", "--out", "--q-len", "--k-len",
                                        "--attn", "--dout", "--dq", "--dk", "--dv", "--threads"};
    const char **slots[] = {&c->op, &c->q, &c->k, &c->v, &c->out, &c->qlen, &c->klen,
                            &c->attn, &c->dout, &c->dq, &c->dk, &c->dv, &c->threads};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(flag, names[i])) return slots[i];
    return NULL;
}

/* Sorts argv into the common options and the operator's keys and arrays;
 * CLI_OK, CLI_USAGE after a message, or CLI_OK with *done (help printed). */
static int parse_args(int argc, char **argv, attn_common *c, attn_ask *ask, int *done)
{
    *done = 0;
    for (int i = 1; i + 1 < argc; i++) /* the operator first: its options depend on it */
        if (!strcmp(argv[i], "--op")) c->op = argv[i + 1];
    ask->op = c->op ? find_op(c->op, &ask->preset) : NULL;
    if (c->op && !ask->op) {
        for (int i = 1; i < argc; i++)
            if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
                attn_usage(stdout);
                *done = 1;
                return CLI_OK;
            }
        return unknown_op(c->op);
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            if (ask->op) op_usage(stdout, ask->op);
            else attn_usage(stdout);
            *done = 1;
            return CLI_OK;
        }
        if (!strcmp(a, "--list") || !strcmp(a, "--markdown")) {
            *(!strcmp(a, "--list") ? &c->list : &c->markdown) = 1;
            continue;
        }
        const char **slot = common_slot(c, a);
        const int pi = ask->op && strncmp(a, "--", 2) == 0 ? bk_op_param_find(ask->op, a + 2) : -1;
        const int ai = ask->op && strncmp(a, "--", 2) == 0 && pi < 0 ? bk_op_array_find(ask->op, a + 2) : -1;
        if (!slot && pi < 0 && ai < 0) {
            if (ask->op && strncmp(a, "--", 2) == 0 && not_this_op(a, c->op)) return CLI_USAGE;
            fprintf(stderr, "birkhoff attn: unknown option '%s'\n", a);
            if (ask->op) op_usage(stderr, ask->op);
            else attn_usage(stderr);
            return CLI_USAGE;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "birkhoff attn: %s needs a value\n", a);
            return CLI_USAGE;
        }
        const char *val = argv[++i];
        if (slot) {
            *slot = val;
        } else if (pi >= 0) {
            if (ask->nkeys == MAXP) {
                fprintf(stderr, "birkhoff attn: too many options\n");
                return CLI_USAGE;
            }
            ask->key_flag[ask->nkeys] = a;
            ask->key_val[ask->nkeys] = val;
            ask->key_idx[ask->nkeys++] = pi;
        } else if (ai < MAXA) {
            ask->arr_flag[ai] = a;
            ask->arr_path[ai] = val;
        }
    }
    return CLI_OK;
}

/* the checks of the command line that need no file (usage errors) */
static int check_args(const attn_common *c, attn_ask *ask)
{
    const bk_op *op = ask->op;
    const char *name = c->op;
    ask->narr = bk_op_array_count(op) < MAXA ? bk_op_array_count(op) : MAXA;
    for (int i = 0; i < ask->narr; i++) bk_op_array_info(op, i, &ask->ai[i]);
    if (!bk_op_has_backward(op) && (c->dout || c->dq || c->dk || c->dv)) {
        fprintf(stderr, "birkhoff attn: --op %s is inference only (no backward; --dout/--dq/--dk/--dv)\n", name);
        return CLI_USAGE;
    }
    for (int i = 0; i < ask->narr; i++) {
        char fl[64];
        flag_of(ask->ai[i].name, fl, sizeof fl);
        if ((ask->ai[i].kind & BK_OP_ARRAY_REQUIRED) && !ask->arr_path[i]) {
            fprintf(stderr, "birkhoff attn: --op %s needs %s %s (%s)\n", name, fl,
                    ask->ai[i].kind & BK_OP_ARRAY_FILE ? ask->ai[i].shape : "F.npy", ask->ai[i].doc);
            return CLI_USAGE;
        }
        if ((ask->ai[i].kind & BK_OP_ARRAY_BWD) && ask->arr_path[i] && !c->dout) {
            fprintf(stderr, "birkhoff attn: %s: the backward's outputs need --dout\n", ask->arr_flag[i]);
            return CLI_USAGE;
        }
        for (int k = 0; ask->ai[i].dim_key && ask->arr_path[i] && k < ask->nkeys; k++)
            if (bk_op_param_find(op, ask->ai[i].dim_key) == ask->key_idx[k]) {
                fprintf(stderr, "birkhoff attn: give either %s or %s, not both (the array sets %s)\n",
                        ask->arr_flag[i], ask->key_flag[k], ask->ai[i].dim_key);
                return CLI_USAGE;
            }
    }
    if ((c->dq || c->dk || c->dv) && !c->dout) {
        fprintf(stderr, "birkhoff attn: --dq/--dk/--dv need --dout\n");
        return CLI_USAGE;
    }
    if (c->threads) {
        int nt;
        if (!cli_parse_int(c->threads, &nt) || nt < 1 || nt > 4096) {
            fprintf(stderr, "birkhoff attn: --threads must be an integer in [1, 4096]\n");
            return CLI_USAGE;
        }
        bk_set_num_threads(nt);
    }
    return CLI_OK;
}

/* the parameters: the defaults, the preset, the keys in order; then their
 * checks that need no shapes */
static int set_params(const attn_common *c, const attn_ask *ask, void *par)
{
    bk_op_config_default(ask->op, par);
    if (ask->preset && bk_op_config_parse(ask->op, par, ask->preset) != BK_OK) {
        fprintf(stderr, "birkhoff attn: --op %s: %s\n", c->op, bk_last_error());
        return CLI_FAIL;
    }
    for (int i = 0; i < ask->nkeys; i++) {
        bk_op_param p;
        bk_op_param_info(ask->op, ask->key_idx[i], &p);
        if (bk_op_config_set(ask->op, par, p.key, ask->key_val[i]) != BK_OK) {
            fprintf(stderr, "birkhoff attn: %s %s: %s\n", ask->key_flag[i], ask->key_val[i], bk_last_error());
            return CLI_USAGE;
        }
    }
    if (bk_op_config_check(ask->op, par) != BK_OK) {
        fprintf(stderr, "birkhoff attn: --op %s: %s\n", c->op, bk_last_error());
        return CLI_USAGE;
    }
    return CLI_OK;
}

/* ---- running ------------------------------------------------------------ */
typedef struct {
    bk_npy Q, K, V, QL, KL, DO;
    bk_npy in[MAXA];      /* input arrays           */
    void *obj[MAXA];      /* file inputs            */
    float *buf[MAXA];     /* output arrays          */
    int64_t dims[MAXA][4];
    int rank[MAXA];
    float *O, *A, *dQ, *dK, *dV;
    void *tape;
} attn_data;

static int load4(const char *what, const char *path, bk_npy *a) { return cli_load_f32("attn", what, path, 4, a); }

static int shape_is(const bk_npy *a, int64_t s0, int64_t s1, int64_t s2, int64_t s3)
{
    return a->shape[0] == s0 && a->shape[1] == s1 && a->shape[2] == s2 && a->shape[3] == s3;
}

/* Q, K, V, the lengths and dO: the call's shapes in *desc */
static int load_qkv(const attn_common *c, attn_data *x, bk_attn_desc *desc)
{
    if (!load4("Q", c->q, &x->Q) || !load4("K", c->k, &x->K) || !load4("V", c->v, &x->V)) return 0;
    const int B = (int)x->Q.shape[0], H = (int)x->Q.shape[1], Nq = (int)x->Q.shape[2], d = (int)x->Q.shape[3];
    const int Nk = (int)x->K.shape[2], dv = (int)x->V.shape[3];
    const bk_npy *K = &x->K, *V = &x->V;
    if (!shape_is(K, B, H, Nk, d)) {
        fprintf(stderr, "birkhoff attn: K has shape [%lld,%lld,%lld,%lld], expected [%d,%d,Nk,%d] to match Q\n",
                (long long)K->shape[0], (long long)K->shape[1], (long long)K->shape[2], (long long)K->shape[3], B, H,
                d);
        return 0;
    }
    if (!shape_is(V, B, H, Nk, dv)) {
        fprintf(stderr, "birkhoff attn: V has shape [%lld,%lld,%lld,%lld], expected [%d,%d,%d,dv] to match K\n",
                (long long)V->shape[0], (long long)V->shape[1], (long long)V->shape[2], (long long)V->shape[3], B, H,
                Nk);
        return 0;
    }
    if (c->qlen && !cli_load_len("attn", "--q-len", c->qlen, B, &x->QL)) return 0;
    if (c->klen && !cli_load_len("attn", "--k-len", c->klen, B, &x->KL)) return 0;
    if (c->dout) {
        if (!load4("dO", c->dout, &x->DO)) return 0;
        if (!shape_is(&x->DO, B, H, Nq, dv)) {
            fprintf(stderr, "birkhoff attn: dO must have shape [%d,%d,%d,%d] like the output\n", B, H, Nq, dv);
            return 0;
        }
    }
    const bk_attn_desc dd = {B, H, Nq, Nk, d, dv, x->QL.data, x->KL.data};
    *desc = dd;
    return 1;
}

/* the operator's input arrays and files, attached to the parameters */
static int load_inputs(const attn_ask *ask, attn_data *x, const bk_attn_desc *desc, void *par)
{
    for (int i = 0; i < ask->narr; i++) {
        const bk_op_array *a = &ask->ai[i];
        if (!(a->kind & BK_OP_ARRAY_IN) || !ask->arr_path[i]) continue;
        const char *fl = ask->arr_flag[i], *path = ask->arr_path[i];
        if (a->kind & BK_OP_ARRAY_FILE) {
            if (bk_op_config_load(ask->op, par, i, path, &x->obj[i]) != BK_OK) {
                fprintf(stderr, "birkhoff attn: %s: %s\n", fl, bk_last_error());
                return 0;
            }
            continue;
        }
        if (bk_npy_read(path, &x->in[i]) != BK_OK) {
            fprintf(stderr, "birkhoff attn: %s\n", bk_last_error());
            return 0;
        }
        if (x->in[i].dtype != BK_F32 || x->in[i].ndim > 4) {
            fprintf(stderr, "birkhoff attn: %s (%s) must be a float32 array %s\n", fl, path, a->shape);
            return 0;
        }
        if (bk_op_config_set_array(ask->op, par, desc, i, x->in[i].data, x->in[i].ndim, x->in[i].shape) != BK_OK) {
            fprintf(stderr, "birkhoff attn: %s (%s): %s\n", fl, path, bk_last_error());
            return 0;
        }
    }
    return 1;
}

/* allocates an output array i of its shape (0: out of memory) */
static int alloc_array(const attn_ask *ask, attn_data *x, const bk_attn_desc *desc, const void *par, int i)
{
    x->rank[i] = bk_op_array_shape(ask->op, i, desc, par, x->dims[i]);
    size_t n = 1;
    for (int j = 0; j < x->rank[i]; j++) n *= (size_t)(x->dims[i][j] > 0 ? x->dims[i][j] : 1);
    x->buf[i] = malloc(sizeof(float) * n);
    return x->buf[i] != NULL;
}

static int oom(void)
{
    fprintf(stderr, "birkhoff attn: out of memory\n");
    return 0;
}

/* the forward, then the backward when asked */
static int run_op(const attn_common *c, const attn_ask *ask, attn_data *x, const bk_attn_desc *desc, const void *par)
{
    const int B = desc->B, H = desc->H, Nq = desc->Nq, Nk = desc->Nk, d = desc->d, dv = desc->dv;
    const size_t nq = (size_t)B * H * Nq, nk = (size_t)B * H * Nk;
    x->O = malloc(nq * dv * sizeof(float));
    if (c->attn) x->A = malloc(nq * Nk * sizeof(float));
    for (int i = 0; i < ask->narr; i++)
        if ((ask->ai[i].kind & BK_OP_ARRAY_FWD) && ask->arr_path[i] && !alloc_array(ask, x, desc, par, i)) return oom();
    const size_t tsz = bk_op_tape_size(ask->op, desc, par);
    if (c->dout) x->tape = malloc(tsz ? tsz : 1);
    if (!x->O || (c->attn && !x->A) || (c->dout && !x->tape)) return oom();
    bk_tensor tq = bk_tensor_bhnd(x->Q.data, H, Nq, d), tk = bk_tensor_bhnd(x->K.data, H, Nk, d);
    bk_tensor tv = bk_tensor_bhnd(x->V.data, H, Nk, dv), to = bk_tensor_bhnd(x->O, H, Nq, dv);
    bk_tensor ta = bk_tensor_bhnd(x->A, H, Nq, Nk);
    bk_status s = bk_op_forward_arrays(ask->op, desc, par, &tq, &tk, &tv, &to, x->tape, x->A ? &ta : NULL, x->buf,
                                       NULL, 0);
    if (s != BK_OK) {
        fprintf(stderr, "birkhoff attn: forward failed: %s: %s\n", bk_status_str(s), bk_last_error());
        return 0;
    }
    if (!c->dout) return 1;
    x->dQ = malloc(nq * d * sizeof(float));
    x->dK = malloc(nk * d * sizeof(float));
    x->dV = malloc(nk * dv * sizeof(float));
    if (!x->dQ || !x->dK || !x->dV) return oom();
    for (int i = 0; i < ask->narr; i++)
        if ((ask->ai[i].kind & BK_OP_ARRAY_BWD) && ask->arr_path[i] && !alloc_array(ask, x, desc, par, i)) return oom();
    bk_tensor tdo = bk_tensor_bhnd(x->DO.data, H, Nq, dv), tdq = bk_tensor_bhnd(x->dQ, H, Nq, d);
    bk_tensor tdk = bk_tensor_bhnd(x->dK, H, Nk, d), tdv = bk_tensor_bhnd(x->dV, H, Nk, dv);
    s = bk_op_backward_arrays(ask->op, desc, par, &tq, &tk, &tv, &tdo, x->tape, &tdq, &tdk, &tdv, x->buf, NULL, 0);
    if (s != BK_OK) {
        fprintf(stderr, "birkhoff attn: backward failed: %s: %s\n", bk_status_str(s), bk_last_error());
        return 0;
    }
    return 1;
}

/* the larger of two values, NaN when either is (a NaN error is never
 * printed as 0) */
static float max_nan(float a, float b) { return isnan(a) || isnan(b) ? NAN : (a > b ? a : b); }

/* a summary array's column maxima on stderr */
static void summarize(const char *opname, const bk_op_array *a, const float *D, const int64_t *dims)
{
    const int P = (int)(dims[0] * dims[1]), k = (int)dims[2];
    char line[512];
    int n = snprintf(line, sizeof line, "%s: %d problems", opname, P);
    const char *col = a->cols, *note = strchr(a->cols, ';');
    for (int j = 0; j < k && j < 8 && col && n < (int)sizeof line; j++) {
        const size_t len = strcspn(col, ",;");
        float m = 0.0f;
        for (int p = 0; p < P; p++) m = max_nan(m, D[(size_t)p * k + j]);
        if (col[0] == '#') /* a count */
            n += snprintf(line + n, sizeof line - (size_t)n, ", max %.*s %d", (int)len - 1, col + 1, (int)m);
        else
            n += snprintf(line + n, sizeof line - (size_t)n, ", max %.*s %.3g", (int)len, col, (double)m);
        col = col[len] == ',' ? col + len + 1 : NULL;
    }
    fprintf(stderr, "%s%s%s\n", line, note ? " " : "", note ? note + 1 : "");
}

/* every result is computed: now write the files (all or none) */
static int write_all(const attn_common *c, const attn_ask *ask, attn_data *x, const bk_attn_desc *desc)
{
    const int64_t B = desc->B, H = desc->H, Nq = desc->Nq, Nk = desc->Nk, d = desc->d, dv = desc->dv;
    int64_t so[4] = {B, H, Nq, dv}, sa[4] = {B, H, Nq, Nk}, sq[4] = {B, H, Nq, d}, sk[4] = {B, H, Nk, d};
    int64_t sv[4] = {B, H, Nk, dv};
    cli_output outs[6 + MAXA] = {{c->out, 4, so, x->O}, {x->A ? c->attn : NULL, 4, sa, x->A},
                                 {c->dq, 4, sq, x->dQ}, {c->dk, 4, sk, x->dK}, {c->dv, 4, sv, x->dV}};
    int n = 5;
    for (int i = 0; i < ask->narr; i++)
        if (x->buf[i]) {
            const cli_output o = {ask->arr_path[i], x->rank[i], x->dims[i], x->buf[i]};
            outs[n++] = o;
        }
    if (!cli_write_outputs("attn", n, outs)) return 0;
    for (int i = 0; i < ask->narr; i++)
        if (x->buf[i] && (ask->ai[i].kind & BK_OP_ARRAY_SUMMARY) && x->rank[i] == 3)
            summarize(c->op, &ask->ai[i], x->buf[i], x->dims[i]);
    return 1;
}

static void free_data(const attn_ask *ask, attn_data *x)
{
    bk_npy_free(&x->Q); bk_npy_free(&x->K); bk_npy_free(&x->V); bk_npy_free(&x->QL); bk_npy_free(&x->KL);
    bk_npy_free(&x->DO);
    for (int i = 0; i < MAXA; i++) {
        bk_npy_free(&x->in[i]);
        free(x->buf[i]);
        if (x->obj[i]) bk_op_config_unload(ask->op, i, x->obj[i]);
    }
    free(x->O); free(x->A); free(x->dQ); free(x->dK); free(x->dV); free(x->tape);
}

int cmd_attn(int argc, char **argv)
{
    attn_common c;
    attn_ask ask;
    memset(&c, 0, sizeof c);
    memset(&ask, 0, sizeof ask);
    int done = 0, rc = parse_args(argc, argv, &c, &ask, &done);
    if (rc != CLI_OK || done) return rc;
    if (c.list) {
        if (c.markdown) list_markdown(stdout);
        else list_plain(stdout);
        return CLI_OK;
    }
    if (!c.op || !c.q || !c.k || !c.v || !c.out) {
        fprintf(stderr, "birkhoff attn: --op, --q, --k, --v and --out are required\n");
        attn_usage(stderr);
        return CLI_USAGE;
    }
    if (!ask.op) return unknown_op(c.op);
    if ((rc = check_args(&c, &ask)) != CLI_OK) return rc;
    void *par = calloc(1, bk_op_config_size(ask.op) + 1);
    if (!par) {
        fprintf(stderr, "birkhoff attn: out of memory\n");
        return CLI_FAIL;
    }
    attn_data x;
    memset(&x, 0, sizeof x);
    bk_attn_desc desc;
    rc = set_params(&c, &ask, par);
    if (rc == CLI_OK)
        rc = load_qkv(&c, &x, &desc) && load_inputs(&ask, &x, &desc, par) && run_op(&c, &ask, &x, &desc, par) &&
                     write_all(&c, &ask, &x, &desc)
                 ? CLI_OK
                 : CLI_FAIL;
    free_data(&ask, &x);
    free(par);
    return rc;
}
