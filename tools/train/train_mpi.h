/* train_mpi.h -- `birkhoff train`'s processes under mpirun (mpi.c). */
#ifndef BK_TRAIN_MPI_H
#define BK_TRAIN_MPI_H
#include "../cli.h"

/* When a launcher announced several processes: MPI_Init (*started = 1) and
 * comm over MPI_COMM_WORLD; otherwise comm->size = 1. CLI_FAIL after a
 * message when MPI cannot start, or when this build has no MPI. */
int cli_mpi_start(int *argc, char ***argv, bk_train_comm *comm, int *started);
/* The start-up agreement of several processes (comm->size > 1; otherwise
 * rc): every rank passes its status and whether it is ready to train (its
 * arguments, config and checkpoints checked). CLI_OK when every rank is
 * ready; a rank that is not gets its own rc back (it said why); a ready rank,
 * when another is not, that rank's status (CLI_FAIL if it was 0: a --help),
 * rank 0 naming the rank. Collective: every rank calls it once, before the
 * first collective of training. When MPI itself fails, MPI_Abort. */
int cli_mpi_agree(const bk_train_comm *comm, int rc, int ready);
/* Ends every process of the run (MPI_Abort with rc; exit(rc) without MPI):
 * for failures the ranks cannot agree on. */
void cli_mpi_abort(int rc);
/* MPI_Finalize when cli_mpi_start started MPI */
void cli_mpi_stop(int started);
/* 1 when built with MPI */
int cli_mpi_built(void);

#endif
