/* spm.cc -- SentencePiece through its C++ library behind a C shim (the bk_spm_*
 * functions of birkhoff/data.h): training a unigram model from texts in
 * memory (deterministic: one thread, every input sentence, no sampling),
 * loading a serialized model, encoding and decoding. Every call catches
 * every exception and turns it into a bk_status with a message
 * (bk_last_error); nothing here has state of its own but the bk_spm. */
#include "birkhoff/data.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

/* from src/core/internal.h (a C11 header C++ cannot include: _Atomic) */
extern "C" {
bk_status bki_fail(bk_status s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void bki_clear_error(void);
long bki_bad_utf8(const char *s);
bk_status bki_data_read_file(const char *path, size_t maxb, void **buf, size_t *len); /* (src/data/dataset.h) */
}

struct bk_spm {
    sentencepiece::SentencePieceProcessor sp;
};

namespace {

/* the texts as SentencePiece's trainer reads them, one sentence each */
class TextIterator : public sentencepiece::SentenceIterator {
  public:
    TextIterator(const char *const *t, int64_t n) : texts_(t), n_(n) { load(); }
    bool done() const override { return i_ >= n_; }
    void Next() override
    {
        i_++;
        load();
    }
    const std::string &value() const override { return cur_; }
    sentencepiece::util::Status status() const override { return sentencepiece::util::Status(); }

  private:
    void load()
    {
        if (i_ < n_) cur_.assign(texts_[i_]);
    }
    const char *const *texts_;
    int64_t n_, i_ = 0;
    std::string cur_;
};

bk_status fail_exception(const char *what, const std::exception *e)
{
    if (e && dynamic_cast<const std::bad_alloc *>(e)) return bki_fail(BK_ERR_NOMEM, "%s: out of memory", what);
    return bki_fail(BK_ERR_FORMAT, "%s: SentencePiece failed (%s)", what, e ? e->what() : "an unknown exception");
}

} // namespace

extern "C" {

bk_status bk_spm_train(const char *const *texts, int64_t n, int vocab, void **model, size_t *model_len)
{
    bki_clear_error();
    if (!texts || !model || !model_len) return bki_fail(BK_ERR_NULL, "bk_spm_train: NULL argument");
    if (n < 1) return bki_fail(BK_ERR_SHAPE, "bk_spm_train: %lld texts (at least 1)", (long long)n);
    if (vocab < BK_SPM_MIN_VOCAB || vocab > BK_SPM_MAX_VOCAB)
        return bki_fail(BK_ERR_PARAM, "bk_spm_train: vocab %d outside [%d, %d]", vocab, BK_SPM_MIN_VOCAB,
                        BK_SPM_MAX_VOCAB);
    int64_t bytes = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!texts[i]) return bki_fail(BK_ERR_NULL, "bk_spm_train: text %lld is NULL", (long long)i);
        const size_t L = strlen(texts[i]);
        const long bad = bki_bad_utf8(texts[i]);
        if (bad >= 0)
            return bki_fail(BK_ERR_FORMAT, "bk_spm_train: text %lld, byte %lld: invalid UTF-8", (long long)i,
                            (long long)bad + 1);
        bytes += static_cast<int64_t>(L);
    }
    if (bytes == 0) return bki_fail(BK_ERR_SHAPE, "bk_spm_train: every text is empty");
    try {
        /* scripts/data.sh's recipe (spm_fit): unigram, every character,
         * byte fallback (any UTF-8 text encodes and decodes back), text kept
         * as written (identity normalisation, whitespace kept), one thread and
         * every sentence in order (deterministic), the ids of BK_SEQ_* */
        const std::unordered_map<std::string, std::string> kw = {
            {"model_type", "unigram"},
            {"vocab_size", std::to_string(vocab)},
            {"hard_vocab_limit", "false"},
            {"character_coverage", "1.0"},
            {"byte_fallback", "true"},
            {"normalization_rule_name", "identity"},
            {"remove_extra_whitespaces", "false"},
            {"num_threads", "1"},
            {"input_sentence_size", "0"},
            {"shuffle_input_sentence", "false"},
            {"max_sentence_length", std::to_string(BK_TEXT_MAX_LINE)},
            {"unk_id", std::to_string(BK_SEQ_UNK)},
            {"bos_id", std::to_string(BK_SEQ_BOS)},
            {"eos_id", std::to_string(BK_SEQ_EOS)},
            {"pad_id", std::to_string(BK_SEQ_PAD)},
            {"minloglevel", "2"},
        };
        TextIterator it(texts, n);
        std::string out;
        sentencepiece::util::Status st = sentencepiece::SentencePieceTrainer::Train(kw, &it, &out);
        if (!st.ok()) {
            const char *m = st.error_message();
            if (strstr(m, "Vocabulary size is smaller than required_chars"))
                return bki_fail(BK_ERR_PARAM,
                                "bk_spm_train: vocab %d is too small for these texts: it needs room for the 4 special "
                                "pieces, the 256 byte pieces and every distinct character (SentencePiece: %s)",
                                vocab, m);
            return bki_fail(BK_ERR_FORMAT, "bk_spm_train: SentencePiece refused the texts (%s)", m);
        }
        void *buf = malloc(out.size() ? out.size() : 1);
        if (!buf) return bki_fail(BK_ERR_NOMEM, "bk_spm_train: out of memory");
        memcpy(buf, out.data(), out.size());
        *model = buf;
        *model_len = out.size();
        return BK_OK;
    } catch (const std::exception &e) {
        return fail_exception("bk_spm_train", &e);
    } catch (...) {
        return fail_exception("bk_spm_train", nullptr);
    }
}

bk_status bk_spm_load(const void *model, size_t len, bk_spm **out)
{
    bki_clear_error();
    if (!model || !out) return bki_fail(BK_ERR_NULL, "bk_spm_load: NULL argument");
    try {
        bk_spm *s = new bk_spm;
        sentencepiece::util::Status st =
            s->sp.LoadFromSerializedProto(std::string(static_cast<const char *>(model), len));
        if (!st.ok() || s->sp.GetPieceSize() < 1) {
            delete s;
            return bki_fail(BK_ERR_FORMAT, "bk_spm_load: not a SentencePiece model (%zu bytes; %s)", len,
                            st.ok() ? "no pieces" : st.error_message());
        }
        *out = s;
        return BK_OK;
    } catch (const std::exception &e) {
        return fail_exception("bk_spm_load", &e);
    } catch (...) {
        return fail_exception("bk_spm_load", nullptr);
    }
}

bk_status bk_spm_load_file(const char *path, bk_spm **out)
{
    bki_clear_error();
    if (!path || !out) return bki_fail(BK_ERR_NULL, "bk_spm_load_file: NULL argument");
    void *buf = nullptr;
    size_t n = 0;
    bk_status st = bki_data_read_file(path, static_cast<size_t>(BK_SPM_MAX_MODEL), &buf, &n);
    if (st != BK_OK) return st;
    st = bk_spm_load(buf, n, out);
    free(buf);
    if (st != BK_OK) {
        char m[512];
        snprintf(m, sizeof m, "%s", bk_last_error());
        return bki_fail(st, "%s: %s", path, m);
    }
    return BK_OK;
}

int bk_spm_vocab(const bk_spm *s) { return s ? s->sp.GetPieceSize() : 0; }

bk_status bk_spm_encode(const bk_spm *s, const char *text, int32_t *ids, int cap, int *n)
{
    bki_clear_error();
    if (!s || !text || !n || (!ids && cap > 0)) return bki_fail(BK_ERR_NULL, "bk_spm_encode: NULL argument");
    if (cap < 0) return bki_fail(BK_ERR_SHAPE, "bk_spm_encode: cap %d is negative", cap);
    const size_t L = strlen(text);
    const long bad = bki_bad_utf8(text);
    if (bad >= 0)
        return bki_fail(BK_ERR_FORMAT, "byte %lld: invalid UTF-8 (byte 0x%02x)", (long long)bad + 1,
                        static_cast<unsigned char>(text[bad]));
    try {
        std::vector<int> v;
        sentencepiece::util::Status st = s->sp.Encode(std::string(text, L), &v);
        if (!st.ok()) return bki_fail(BK_ERR_FORMAT, "bk_spm_encode: %s", st.error_message());
        if (v.size() > static_cast<size_t>(INT32_MAX))
            return bki_fail(BK_ERR_SHAPE, "bk_spm_encode: more than 2^31 ids");
        const int k = static_cast<int>(v.size());
        for (int i = 0; i < k && i < cap; i++) ids[i] = v[static_cast<size_t>(i)];
        *n = k;
        return BK_OK;
    } catch (const std::exception &e) {
        return fail_exception("bk_spm_encode", &e);
    } catch (...) {
        return fail_exception("bk_spm_encode", nullptr);
    }
}

bk_status bk_spm_decode(const bk_spm *s, const int32_t *ids, int n, char **text)
{
    bki_clear_error();
    if (!s || !text || (!ids && n > 0)) return bki_fail(BK_ERR_NULL, "bk_spm_decode: NULL argument");
    if (n < 0) return bki_fail(BK_ERR_SHAPE, "bk_spm_decode: n = %d", n);
    const int V = s->sp.GetPieceSize();
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V)
            return bki_fail(BK_ERR_PARAM, "bk_spm_decode: id %d (position %d) outside the vocabulary [0, %d)",
                            (int)ids[i], i, V);
    try {
        std::vector<int> v(ids, ids + n);
        std::string out;
        sentencepiece::util::Status st = s->sp.Decode(v, &out);
        if (!st.ok()) return bki_fail(BK_ERR_FORMAT, "bk_spm_decode: %s", st.error_message());
        /* a NUL byte (the byte piece <0x00>) would end the C string: U+FFFD */
        std::string clean;
        clean.reserve(out.size());
        for (char ch : out) {
            if (ch) clean.push_back(ch);
            else clean.append("\xef\xbf\xbd");
        }
        char *buf = static_cast<char *>(malloc(clean.size() + 1));
        if (!buf) return bki_fail(BK_ERR_NOMEM, "bk_spm_decode: out of memory");
        memcpy(buf, clean.data(), clean.size());
        buf[clean.size()] = 0;
        *text = buf;
        return BK_OK;
    } catch (const std::exception &e) {
        return fail_exception("bk_spm_decode", &e);
    } catch (...) {
        return fail_exception("bk_spm_decode", nullptr);
    }
}

int bk_spm_special(const bk_spm *s, int which)
{
    if (!s) return -1;
    switch (which) {
    case BK_SEQ_UNK: return s->sp.unk_id();
    case BK_SEQ_BOS: return s->sp.bos_id();
    case BK_SEQ_EOS: return s->sp.eos_id();
    case BK_SEQ_PAD: return s->sp.pad_id();
    default: return -1;
    }
}

void bk_spm_free(bk_spm *s) { delete s; }

} /* extern "C" */
