/* pool.c -- the library's threads: parallel regions on pools of worker
 * threads, the region's barrier, blocks claimed at run time, ordered
 * sections. Every wait spins a few microseconds and then sleeps in the
 * kernel (futex), so a waiting thread never holds a core that another
 * process, or a member of its own region that the kernel descheduled, could
 * use; the library does not depend on OMP_WAIT_POLICY or any other setting
 * of the user's environment. docs/ARCHITECTURE.md, "Threads", says why this
 * replaced OpenMP's runtime. */
#define _GNU_SOURCE
#include "internal.h"

#include <errno.h>
#include <immintrin.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h> /* sched_yield */
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* How long a waiting thread spins before it sleeps, at most. Short: a wait
 * longer than this is either real imbalance or a member the kernel
 * descheduled, and then the core is better given away. Workers between
 * regions spin a little longer, since regions of a training step follow
 * each other within tens of microseconds. When a region has more members
 * than the process has CPUs, a member that spins only keeps the one it
 * waits for off a core: 2 us. */
#define SPIN_NS_BARRIER 30000
#define SPIN_NS_IDLE 150000
#define SPIN_NS_OVER 2000
/* The budget adapts (a spin is a budget of the pool's): halved when a spin
 * ran out (the awaited thread was descheduled: other processes hold the
 * cores), grown by half again when one succeeded, between SPIN_NS_MIN and
 * the maximum above. Past SPIN_NS_YIELD a spinning thread also yields, so
 * that a member the kernel queued behind it on this CPU runs at once. */
#define SPIN_NS_MIN 1000
#define SPIN_NS_YIELD 3000

/* ---- waiting: spin, then futex -------------------------------------- */

static void futex_wait(_Atomic uint32_t *w, uint32_t v)
{
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT_PRIVATE, v, NULL, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *w)
{
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* a futex word with the count of threads asleep on it */
typedef struct {
    _Atomic uint32_t v;
    _Atomic uint32_t sleepers;
} word;

/* a spin budget: the current one and its ceiling */
typedef struct {
    _Atomic int64_t ns, max;
} budget;

/* returns once w->v != old: spins up to the budget, then sleeps */
static void wait_while(word *w, uint32_t old, budget *b)
{
    if (atomic_load(&w->v) != old) return;
    const int64_t t0 = now_ns(), ns = atomic_load_explicit(&b->ns, memory_order_relaxed);
    for (int i = 1;; i++) {
        _mm_pause();
        if (atomic_load_explicit(&w->v, memory_order_acquire) != old) {
            const int64_t mx = atomic_load_explicit(&b->max, memory_order_relaxed);
            if (ns < mx) atomic_store_explicit(&b->ns, ns + ns / 2 < mx ? ns + ns / 2 : mx, memory_order_relaxed);
            return;
        }
        if ((i & 31) == 0) {
            const int64_t el = now_ns() - t0;
            if (el > ns) break;
            if (el > SPIN_NS_YIELD) sched_yield();
        }
    }
    atomic_store_explicit(&b->ns, ns / 2 > SPIN_NS_MIN ? ns / 2 : SPIN_NS_MIN, memory_order_relaxed);
    atomic_fetch_add(&w->sleepers, 1);
    while (atomic_load(&w->v) == old) futex_wait(&w->v, old);
    atomic_fetch_sub(&w->sleepers, 1);
}

/* after changing w->v: wakes its sleepers, if any */
static void wake(word *w)
{
    if (atomic_load(&w->sleepers)) futex_wake(&w->v);
}

/* ---- pools ---------------------------------------------------------- */

struct pool;
/* a member's position in the tickets of claimed loops: tickets number the
 * blocks of all the loops of a region one after another, so the position
 * only grows and needs no reset between loops */
typedef struct {
    _Alignas(64) _Atomic int64_t t;
} slot;
/* a worker's part in the current region */
enum { IDLE, SIGNALLED, RUNNING, SKIPPED };
typedef struct {
    _Alignas(64) word go; /* bumped by the caller: run member tid of the job */
    _Atomic int state;    /* SIGNALLED -> RUNNING (the worker) or SKIPPED (the caller) */
    int tid;
    struct pool *p;
} worker;

typedef struct pool {
    /* the job, written by the caller before it signals the members */
    bki_region_fn fn;
    void *arg;
    int nt;
    _Alignas(64) word left;       /* members 1..nt-1 still running  */
    _Alignas(64) word bar_gen;    /* the barrier's generation        */
    _Atomic uint32_t bar_count;   /* members arrived at the barrier  */
    _Alignas(64) _Atomic int64_t onext; /* ordered loops: next ticket */
    _Alignas(64) word ord;        /* ordered sections passed          */
    slot *pos;                    /* cap + 1: each member's next ticket */
    budget spin, idle;            /* waits in a region, workers between regions */
    worker **w;                   /* cap workers: members 1..cap      */
    int cap, busy;
    struct pool *link;
} pool;

/* the calling thread's membership: the pool of its region (NULL outside
 * a region or in a region of one), its index, the region's size, and the
 * tickets and ordered sections its loops have passed */
typedef struct {
    pool *p;
    int tid, nt, in_region;
    int64_t tickets, ords;
} member;
static _Thread_local member me = {NULL, 0, 1, 0, 0, 0};

int bki_thread_id(void) { return me.tid; }
int bki_region_size(void) { return me.nt; }

static void run_member(pool *p, int tid)
{
    const member saved = me;
    me = (member){p->nt > 1 ? p : NULL, tid, p->nt, 1, 0, 0};
    const unsigned mode = bki_region_enter();
    p->fn(p->arg);
    bki_region_leave(&mode);
    me = saved;
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    uint32_t seen = 0;
    for (;;) {
        wait_while(&w->go, seen, &w->p->idle);
        seen = atomic_load_explicit(&w->go.v, memory_order_acquire);
        int st = SIGNALLED;
        if (!atomic_compare_exchange_strong(&w->state, &st, RUNNING)) continue; /* skipped (or a stale wake) */
        pool *p = w->p;
        run_member(p, w->tid);
        atomic_store(&w->state, IDLE); /* before the caller can signal the next region */
        if (atomic_fetch_sub(&p->left.v, 1) == 1) wake(&p->left);
    }
    return NULL;
}

/* The pools: a region takes a free one (or makes one) and gives it back.
 * Two threads of the caller running regions at once get two pools. */
static pthread_mutex_t pools_mu = PTHREAD_MUTEX_INITIALIZER;
static pool *pools;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void fork_prepare(void) { pthread_mutex_lock(&pools_mu); }
static void fork_parent(void) { pthread_mutex_unlock(&pools_mu); }
/* the child has none of the workers: it forgets the pools (their memory is
 * left, as a child of a threaded process must not free what a worker may
 * have been using) and makes new ones when it needs them */
static void fork_child(void)
{
    pools = NULL;
    pthread_mutex_unlock(&pools_mu);
}
static void atfork_init(void) { pthread_atfork(fork_prepare, fork_parent, fork_child); }

/* adds workers until the pool has `want`; returns how many it has */
static int grow(pool *p, int want)
{
    if (want <= p->cap) return p->cap;
    worker **nw = realloc(p->w, sizeof *nw * (size_t)want);
    if (!nw) return p->cap;
    p->w = nw;
    slot *np = aligned_alloc(64, sizeof *np * (size_t)(want + 1));
    if (!np) return p->cap;
    free(p->pos);
    p->pos = np;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old); /* workers take no signals */
    while (p->cap < want) {
        worker *w = aligned_alloc(64, sizeof *w);
        if (!w) break;
        *w = (worker){.tid = p->cap + 1, .p = p};
        atomic_init(&w->go.v, 0);
        atomic_init(&w->go.sleepers, 0);
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        pthread_t th;
        const int rc = pthread_create(&th, &at, worker_main, w);
        pthread_attr_destroy(&at);
        if (rc != 0) {
            free(w);
            break;
        }
        pthread_setname_np(th, "birkhoff"); /* as top -H and gdb show it */
        p->w[p->cap++] = w;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return p->cap;
}

static pool *acquire(int workers, int *got)
{
    pthread_once(&atfork_once, atfork_init);
    pthread_mutex_lock(&pools_mu);
    pool *p = pools, *spare = NULL;
    for (; p; p = p->link) {
        if (p->busy) continue;
        if (p->cap >= workers) break;
        if (!spare) spare = p;
    }
    if (!p) p = spare;
    if (!p) {
        p = aligned_alloc(64, sizeof *p);
        if (p) {
            memset(p, 0, sizeof *p);
            p->link = pools;
            pools = p;
        }
    }
    if (p) {
        p->busy = 1;
        *got = grow(p, workers);
    }
    pthread_mutex_unlock(&pools_mu);
    return p;
}

static void release(pool *p)
{
    pthread_mutex_lock(&pools_mu);
    p->busy = 0;
    pthread_mutex_unlock(&pools_mu);
}

/* fn on nt members; claimed: members that have not started when the caller
 * has run fn are skipped (bki_parallel_claimed) */
static void parallel(int nt, bki_region_fn fn, void *arg, int claimed)
{
    int got = 0;
    pool *p = nt > 1 && !me.in_region ? acquire(nt - 1, &got) : NULL;
    if (!p || got < 1) { /* a region of one: nested, asked, or no threads */
        if (p) release(p);
        pool solo = {.fn = fn, .arg = arg, .nt = 1};
        run_member(&solo, 0);
        return;
    }
    nt = got + 1 < nt ? got + 1 : nt; /* fewer threads: the same results */
    const int over = nt > bki_cpus();
    const int64_t smax = over ? SPIN_NS_OVER : SPIN_NS_BARRIER, imax = over ? SPIN_NS_OVER : SPIN_NS_IDLE;
    if (atomic_load(&p->spin.max) != smax) { /* a new pool, or another CPU count */
        atomic_store(&p->spin.max, smax), atomic_store(&p->spin.ns, smax);
        atomic_store(&p->idle.max, imax), atomic_store(&p->idle.ns, imax);
    }
    p->fn = fn;
    p->arg = arg;
    p->nt = nt;
    atomic_store(&p->bar_count, 0);
    atomic_store(&p->onext, 0);
    for (int t = 0; t < nt; t++) atomic_store(&p->pos[t].t, 0);
    atomic_store(&p->ord.v, 0);
    atomic_store(&p->left.v, (uint32_t)(nt - 1));
    for (int t = 1; t < nt; t++) {
        worker *w = p->w[t - 1];
        atomic_store(&w->state, SIGNALLED);
        atomic_fetch_add_explicit(&w->go.v, 1, memory_order_release);
        wake(&w->go);
    }
    run_member(p, 0);
    if (claimed) /* every block is taken: a member not yet started would find none */
        for (int t = 1; t < nt; t++) {
            int st = SIGNALLED;
            if (atomic_compare_exchange_strong(&p->w[t - 1]->state, &st, SKIPPED)) atomic_fetch_sub(&p->left.v, 1);
        }
    for (uint32_t left; (left = atomic_load(&p->left.v)) != 0;) wait_while(&p->left, left, &p->spin);
    release(p);
}

void bki_parallel(int nt, bki_region_fn fn, void *arg) { parallel(nt, fn, arg, 0); }

void bki_parallel_claimed(int nt, bki_region_fn fn, void *arg) { parallel(nt, fn, arg, 1); }

/* ---- inside a region ------------------------------------------------ */

void bki_region_barrier(void)
{
    pool *p = me.p;
    if (!p) return;
    const uint32_t g = atomic_load(&p->bar_gen.v);
    if (atomic_fetch_add(&p->bar_count, 1) == (uint32_t)me.nt - 1) {
        atomic_store(&p->bar_count, 0);
        atomic_fetch_add(&p->bar_gen.v, 1);
        wake(&p->bar_gen);
    } else {
        wait_while(&p->bar_gen, g, &p->spin);
    }
}

bki_claims bki_claims_open(const bki_team *tm, int64_t n)
{
    bki_claims c = {0};
    c.n = c.total = n < 0 ? 0 : n;
    c.chunk = 1;
    c.tid = tm->tid;
    c.nt = tm->nt;
    c.v = tm->tid;
    if (tm->nt > 1 && me.p && tm->nt == me.nt && tm->tid == me.tid) {
        c.shared = 1;
        c.base = me.tickets;
        me.tickets += c.n;
    } else if (tm->nt > 1) { /* a part of the region: its static share */
        c.lo = c.n * tm->tid / tm->nt;
        c.hi = c.n * (tm->tid + 1) / tm->nt;
    } else {
        c.hi = c.n;
    }
    return c;
}

/* the next block of member v's share that nobody has started, or -1. A
 * member whose loop the others finished finds every position past it (the
 * positions only grow), so it takes nothing. */
static int64_t take(const bki_claims *c, int v)
{
    const int64_t lo = c->base + c->n * v / c->nt, hi = c->base + c->n * (v + 1) / c->nt;
    _Atomic int64_t *pos = &me.p->pos[v].t;
    int64_t t = atomic_load_explicit(pos, memory_order_relaxed);
    for (;;) {
        const int64_t q = t < lo ? lo : t;
        if (q >= hi) return -1;
        if (atomic_compare_exchange_weak_explicit(pos, &t, q + 1, memory_order_acq_rel, memory_order_relaxed))
            return q - c->base;
    }
}

static int64_t take_ordered(const bki_claims *c)
{
    _Atomic int64_t *next = &me.p->onext;
    int64_t t = atomic_load_explicit(next, memory_order_relaxed);
    for (;;) {
        const int64_t q = t < c->lo ? c->lo : t;
        if (q >= c->lo + c->n) return -1;
        if (atomic_compare_exchange_weak_explicit(next, &t, q + 1, memory_order_acq_rel, memory_order_relaxed))
            return q - c->lo;
    }
}

int bki_claims_next(bki_claims *c, int64_t *blk)
{
    if (!c->shared) {
        if (c->lo >= c->hi) return 0;
        *blk = c->lo++;
        return 1;
    }
    if (c->shared == 2) { /* ordered: one counter, blocks in order */
        const int64_t b = take_ordered(c);
        if (b < 0) return 0;
        *blk = b;
        return 1;
    }
    /* its own share first, then the others' in turn */
    for (int k = (c->v - c->tid + c->nt) % c->nt; k < c->nt; k++) {
        const int v = (c->tid + k) % c->nt;
        const int64_t b = take(c, v);
        if (b >= 0) {
            c->v = v;
            *blk = b;
            return 1;
        }
    }
    c->v = (c->tid + c->nt - 1) % c->nt; /* all taken: stays so */
    return 0;
}

bki_claims bki_claims_open_ordered(const bki_team *tm, int64_t n)
{
    bki_claims c = bki_claims_open(tm, n);
    if (c.shared) {
        me.tickets -= c.n; /* ordered loops count their own tickets */
        c.shared = 2;
        c.lo = me.ords; /* the ordered sections before this loop */
        me.ords += c.n;
    }
    return c;
}

void bki_ordered_begin(const bki_claims *c, int64_t k)
{
    if (c->shared != 2) return; /* one member takes its blocks in order */
    const uint32_t want = (uint32_t)(c->lo + k);
    for (uint32_t cur; (cur = atomic_load(&me.p->ord.v)) != want;) wait_while(&me.p->ord, cur, &me.p->spin);
}

void bki_ordered_end(const bki_claims *c, int64_t k)
{
    (void)k;
    if (c->shared != 2) return;
    atomic_fetch_add(&me.p->ord.v, 1);
    wake(&me.p->ord);
}

bki_claims bki_ranges_open(const bki_team *tm, int64_t n, int64_t width)
{
    const int64_t total = n < 0 ? 0 : n, w = width < 1 ? 1 : width;
    bki_claims c = bki_claims_open(tm, (total + w - 1) / w);
    c.chunk = w;
    c.total = total;
    return c;
}

int bki_ranges_next(bki_claims *c, int64_t *i0, int64_t *i1)
{
    int64_t b;
    if (!bki_claims_next(c, &b)) return 0;
    *i0 = b * c->chunk;
    *i1 = *i0 + c->chunk < c->total ? *i0 + c->chunk : c->total;
    return 1;
}

/* BKI_FOR's ranges: about 8 a member (a member that the kernel deschedules
 * holds at most one range; more of them only add claims); one member takes
 * everything at once */
bki_claims bki_for_open(int64_t n)
{
    const int nt = me.nt;
    const int64_t total = n < 0 ? 0 : n, want = 8 * (int64_t)nt;
    const int64_t chunk = nt < 2 ? (total > 0 ? total : 1) : total > want ? (total + want - 1) / want : 1;
    return bki_ranges_open(&(bki_team){me.tid, nt}, total, chunk);
}
