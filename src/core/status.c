/* status.c -- status strings and the thread-local last-error message. */
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char last_msg[512];

const char *bk_version(void)
{
    return BK_STR(BK_VERSION_MAJOR) "." BK_STR(BK_VERSION_MINOR) "." BK_STR(BK_VERSION_PATCH);
}

const char *bk_status_str(bk_status s)
{
    switch (s) {
    case BK_OK: return "ok";
    case BK_ERR_NULL: return "null pointer";
    case BK_ERR_SHAPE: return "invalid shape";
    case BK_ERR_STRIDE: return "invalid or overlapping strides";
    case BK_ERR_LENGTH: return "valid length out of range";
    case BK_ERR_PARAM: return "parameter out of range";
    case BK_ERR_NONFINITE: return "non-finite input";
    case BK_ERR_NOMEM: return "out of memory";
    case BK_ERR_WORKSPACE: return "workspace too small";
    case BK_ERR_TAPE: return "invalid tape";
    case BK_ERR_IO: return "i/o error";
    case BK_ERR_FORMAT: return "malformed file";
    case BK_ERR_NUMERIC: return "numerical failure";
    case BK_ERR_UNSUPPORTED: return "unsupported";
    case BK_ERR_OVERFLOW: return "float32 overflow";
    }
    return "unknown status";
}

const char *bk_last_error(void) { return last_msg; }

void bki_clear_error(void) { last_msg[0] = '\0'; }

bk_status bki_fail(bk_status s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_msg, sizeof last_msg, fmt, ap);
    va_end(ap);
    return s;
}
