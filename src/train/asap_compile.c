/* asap_compile.c -- ASAP compilation of a trained model: calibrate every
 * Sinkhorn layer on unlabelled training inputs and write the model that runs
 * ASAP at inference (birkhoff/train.h, docs/TRAINING.md). */
#include "../core/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

bk_asap_compile_config bk_asap_compile_config_default(void)
{
    bk_asap_compile_config c;
    memset(&c, 0, sizeof c);
    c.samples = 512;
    c.batch = 64;
    c.slices = 32;
    c.seed = 1;
    c.lambda = 1e-3f;
    c.fit = BK_ASAP_FIT_LS;
    return c;
}

bk_status bk_asap_compile(const char *ckpt, const char *out, const bk_asap_compile_config *cc,
                          bk_asap_compile_callback cb, void *user)
{
    bki_clear_error();
    if (!ckpt || !out || !cc) return bki_fail(BK_ERR_NULL, "bk_asap_compile: NULL argument");
    if (cc->samples < 1 || cc->batch < 1 || cc->slices < 1 || !(cc->lambda >= 0) ||
        (cc->fit != BK_ASAP_FIT_LS && cc->fit != BK_ASAP_FIT_KL))
        return bki_fail(BK_ERR_PARAM, "bk_asap_compile: samples, batch, slices >= 1, lambda >= 0, fit LS or KL");
    /* the compiled model names its teacher by path: writing it over the
     * teacher would make it its own teacher */
    struct stat si, so;
    if (stat(ckpt, &si) == 0 && stat(out, &so) == 0 && si.st_dev == so.st_dev && si.st_ino == so.st_ino)
        return bki_fail(BK_ERR_PARAM, "%s: the output is the teacher checkpoint itself (the compiled model records "
                                      "its teacher by path); write it to another file",
                        out);
    bk_model *m = NULL, *am = NULL;
    bk_run_config r;
    char *extra = NULL;
    bk_status st = bk_run_load(ckpt, cc->batch, &m, &r, &extra);
    if (st != BK_OK) return st;
    const bk_model_config *c = bk_model_get_config(m);
    bk_dataset *ds = NULL;
    bk_data_batch b = {0};
    bk_asap_calib **cal = calloc((size_t)(c->depth > 0 ? c->depth : 1), sizeof *cal);
    char *ex2 = NULL;
    if (!cal) {
        st = bki_fail(BK_ERR_NOMEM, "out of memory");
        goto done;
    }
    if (strcmp(bk_attn_kind_name(c->attn), "sinkhorn")) { /* (ASAP's teacher is Sinkhorn by definition) */
        st = bki_fail(BK_ERR_PARAM, "%s uses %s attention; ASAP compiles Sinkhorn attention", ckpt,
                      bk_attn_kind_name(c->attn));
        goto done;
    }
    if ((st = bk_run_open_data(&r, NULL, cc->data_dir, BK_SPLIT_TRAIN, cc->samples, c, &ds)) != BK_OK) goto done;
    const bk_dataset_info *in = bk_data_info(ds);
    bk_asap_config ac = bk_model_asap_config(m);
    ac.slices = cc->slices;
    ac.seed = cc->seed;
    ac.lambda = cc->lambda;
    for (int l = 0; l < c->depth; l++)
        if ((st = bk_asap_calib_create(&ac, cc->fit == BK_ASAP_FIT_KL, &cal[l])) != BK_OK) goto done;
    if (bk_data_batch_init(&b, ds, cc->batch) != BK_OK) {
        st = bki_fail(BK_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int64_t s = 0; s < in->n; s += cc->batch) {
        const int B = (int)(in->n - s < cc->batch ? in->n - s : cc->batch);
        for (int i = 0; i < B; i++) b.idx[i] = s + i;
        bk_batch bt;
        if (bk_data_batch_fill(&b, ds, B, &bt) != BK_OK) {
            st = bki_fail(BK_ERR_IO, "cannot read the calibration samples");
            goto done;
        }
        bt.labels = NULL; /* unlabelled: only the inputs are used */
        if ((st = bk_model_forward(m, &bt, 0, 0.0f, NULL, NULL)) != BK_OK) goto done;
        for (int l = 0; l < c->depth; l++)
            if ((st = bk_model_calib_add(m, l, cal[l])) != BK_OK) goto done;
    }
    bk_model_config acfg = *c;
    static const char *const ENDINGS[] = {"auto", "zero", "column", "row"};
    if ((st = bk_model_config_set(&acfg, "attn", "asap")) != BK_OK ||
        (st = bk_model_config_set(&acfg, "attn.variant",
                                  cc->ending >= BK_ASAP_AUTO && cc->ending <= BK_ASAP_ROW ? ENDINGS[cc->ending] : "?")) != BK_OK)
        goto done;
    if ((st = bk_model_create(&acfg, 1, 1, &am)) != BK_OK) goto done;
    memcpy(bk_model_params(am), bk_model_params(m), sizeof(float) * (size_t)bk_model_num_params(m));
    bk_asap_compile_event ev = {-1, c->depth, in->n, in->version, NULL};
    if (cb) cb(user, &ev);
    for (int l = 0; l < c->depth; l++) {
        bk_asap_layer ly;
        bk_asap_fit_report rep;
        bk_asap_kl_config ko = bk_asap_kl_config_default();
        if ((st = bk_asap_calib_fit(cal[l], cc->fit, &ko, &ly, &rep)) != BK_OK) {
            char msg[480];
            snprintf(msg, sizeof msg, "%s", bk_last_error());
            bki_fail(st, "layer %d: %s", l, msg);
            goto done;
        }
        st = bk_model_set_asap(am, l, &ly);
        bk_asap_layer_free(&ly);
        if (st != BK_OK) goto done;
        ev.layer = l;
        ev.report = &rep;
        if (cb) cb(user, &ev);
    }
    {
        /* the run config (attn=asap) and the teacher travel with the model */
        r.model = acfg;
        size_t n = bk_run_config_format(&r, NULL, 0);
        char *cfg = malloc(n + 1);
        size_t n2 = n + strlen(ckpt) + 512;
        ex2 = cfg ? malloc(n2) : NULL;
        if (!ex2) {
            free(cfg);
            st = bki_fail(BK_ERR_NOMEM, "out of memory");
            goto done;
        }
        bk_run_config_format(&r, cfg, n + 1);
        snprintf(ex2, n2, "pos_epoch=0\npos_batch=0\npos_step=0\nteacher=%s\ncalib_samples=%lld\n%s", ckpt,
                 (long long)in->n, cfg);
        free(cfg);
    }
    st = bk_checkpoint_save(out, am, NULL, ex2);
done:
    for (int l = 0; cal && l < c->depth; l++) bk_asap_calib_free(cal[l]);
    free(cal);
    free(ex2);
    free(extra);
    bk_data_batch_free(&b);
    bk_data_close(ds);
    bk_model_free(am);
    bk_model_free(m);
    return st;
}
