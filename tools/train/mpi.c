/* mpi.c -- `birkhoff train` under mpirun: the library's bk_train_comm
 * (birkhoff/train.h) over MPI's blocking collectives on MPI_COMM_WORLD.
 * Built with MPI when the Makefile finds Open MPI (BK_HAVE_MPI); without it,
 * a launch by mpirun (or any launcher that sets the usual rank variables)
 * is refused rather than running N unrelated copies of one run. The library
 * itself never links MPI: C programs with their own MPI set-up pass their
 * own bk_train_comm, as this file does. */
#include "train_mpi.h"

#include <limits.h>
#include <stdio.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#ifdef BK_HAVE_MPI
#include <mpi.h>
#endif

/* the world size a launcher announces to its processes (0: none); a value
 * that is not a plain count in [0, 2^24] still says a launcher started us:
 * 2, so that MPI itself gives the size */
static int launched_size(void)
{
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
        const char *v = getenv(vars[i]);
        if (!v || !*v) continue;
        char *end;
        errno = 0;
        const long n = strtol(v, &end, 10);
        return errno || *end || n < 0 || n > (1L << 24) ? 2 : (int)n;
    }
    return 0;
}

#ifdef BK_HAVE_MPI
/* Byte counts above INT_MAX travel in pieces (broadcasts) or are refused
 * (the library's gathers are of at most 16 MiB per rank). */
enum { MPI_PIECE = 1 << 30 };

static int mpi_bcast(void *user, void *buf, size_t bytes)
{
    (void)user;
    for (size_t o = 0; o < bytes; o += MPI_PIECE) {
        const size_t n = bytes - o < MPI_PIECE ? bytes - o : MPI_PIECE;
        if (MPI_Bcast((char *)buf + o, (int)n, MPI_BYTE, 0, MPI_COMM_WORLD) != MPI_SUCCESS) return 1;
    }
    return 0;
}

static int mpi_allgather(void *user, const void *send, void *recv, size_t bytes)
{
    (void)user;
    if (bytes > INT_MAX) return 1;
    return MPI_Allgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, MPI_COMM_WORLD) != MPI_SUCCESS;
}

static int mpi_alltoall(void *user, const void *send, void *recv, size_t bytes)
{
    (void)user;
    if (bytes > INT_MAX) return 1;
    return MPI_Alltoall(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, MPI_COMM_WORLD) != MPI_SUCCESS;
}
#endif

int cli_mpi_start(int *argc, char ***argv, bk_train_comm *comm, int *started)
{
    memset(comm, 0, sizeof *comm);
    comm->size = 1;
    *started = 0;
    const int n = launched_size();
    if (n <= 1) return CLI_OK;
#ifdef BK_HAVE_MPI
    int ok = 0;
    if (MPI_Init(argc, argv) == MPI_SUCCESS) {
        *started = 1;
        ok = MPI_Comm_rank(MPI_COMM_WORLD, &comm->rank) == MPI_SUCCESS &&
             MPI_Comm_size(MPI_COMM_WORLD, &comm->size) == MPI_SUCCESS;
    }
    if (!ok) {
        fprintf(stderr, "birkhoff train: MPI_Init failed under a launcher announcing %d processes\n", n);
        if (*started) MPI_Abort(MPI_COMM_WORLD, CLI_FAIL); /* (the others cannot learn it otherwise) */
        return CLI_FAIL;
    }
    comm->bcast = mpi_bcast;
    comm->allgather = mpi_allgather;
    comm->alltoall = mpi_alltoall;
    return CLI_OK;
#else
    (void)argc;
    (void)argv;
    fprintf(stderr, "birkhoff train: started as one of %d MPI processes, but this birkhoff was built without MPI "
                    "(install libopenmpi-dev and rebuild: `make` finds it); refusing to run %d unrelated copies of "
                    "one run\n", n, n);
    return CLI_FAIL;
#endif
}

int cli_mpi_agree(const bk_train_comm *comm, int rc, int ready)
{
    if (comm->size <= 1) return rc;
#ifdef BK_HAVE_MPI
    /* each rank's state: -1 ready, else the status it stops with */
    int mine = ready ? -1 : rc, *all = malloc(sizeof(int) * (size_t)comm->size);
    if (!all || MPI_Allgather(&mine, 1, MPI_INT, all, 1, MPI_INT, MPI_COMM_WORLD) != MPI_SUCCESS) {
        fprintf(stderr, "[rank %d] birkhoff train: %s at start-up; ending every process\n", comm->rank,
                all ? "MPI_Allgather failed" : "out of memory");
        MPI_Abort(MPI_COMM_WORLD, CLI_FAIL);
        exit(CLI_FAIL);
    }
    int k = 0;
    while (k < comm->size && all[k] == -1) k++;
    const int first = k < comm->size ? all[k] : -1;
    free(all);
    if (!ready) return rc;  /* this rank's own reason, already said */
    if (first == -1) return CLI_OK;
    if (comm->rank == 0) /* (rank 0 names the rank that stopped; the others say nothing more) */
        fprintf(stderr, "[rank 0] birkhoff train: rank %d stopped before training (status %d; its message is above): "
                        "no process trains\n", k, first);
    return first != CLI_OK ? first : CLI_FAIL;
#else
    (void)ready;
    return rc;
#endif
}

void cli_mpi_abort(int rc)
{
#ifdef BK_HAVE_MPI
    fflush(stdout);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, rc);
#endif
    exit(rc);
}

void cli_mpi_stop(int started)
{
#ifdef BK_HAVE_MPI
    if (started) MPI_Finalize();
#else
    (void)started;
#endif
}

int cli_mpi_built(void)
{
#ifdef BK_HAVE_MPI
    return 1;
#else
    return 0;
#endif
}
