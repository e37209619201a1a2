/* text.h -- the labelled-text parser of the tsv: and csv: readers (text.c),
 * internal to src/data; tests/fuzz/fuzz_labelled.c fuzzes it. */
#ifndef BK_DATA_TEXT_H
#define BK_DATA_TEXT_H

#include <stddef.h>
#include <stdint.h>

#include "birkhoff/core.h"

/* The rows of a labelled-text file: row i's label is buf + label[i], its
 * text buf + text[i] (NUL-terminated UTF-8, CSV quotes removed), found on
 * line line[i] (1-based; a CSV record with quoted newlines: its first). */
typedef struct {
    char *buf;
    int64_t *label, *text, *line;
    int64_t n;
} bki_ltable;

/* Parses b[0..n) (the whole file; name names it in messages) as TSV (csv 0:
 * fields split by TAB, no quoting) or CSV (csv 1: RFC 4180, fields split by
 * ',', a field in double quotes may hold ',', '"' written '""', and line
 * ends), taking columns label_col and text_col (1-based, different) of every
 * record; header 1 skips the first record. Line ends "\n" or "\r\n" (the
 * last one optional). Refused with BK_ERR_FORMAT naming "name:LINE" (and
 * ":BYTE" in the line, 1-based, for a bad byte): invalid UTF-8, a control
 * character (TAB and, inside CSV quotes, line ends excepted), a CR not
 * before a LF, an empty line, a record without the label or text column,
 * an empty label (spaces around a label are removed) or a blank text, an
 * unterminated quote, text after a closing quote, a quote inside an
 * unquoted CSV field; no record (an empty file, or only a header). *out is
 * filled on success only (free with bki_ltable_free). */
bk_status bki_parse_labelled(const char *b, size_t n, const char *name, int csv, int label_col, int text_col,
                             int header, bki_ltable *out);
void bki_ltable_free(bki_ltable *t);

#endif
