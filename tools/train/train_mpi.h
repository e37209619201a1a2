/* train_mpi.h -- `birkhoff train`'s processes under mpirun (mpi.c). */
#ifndef BK_TRAIN_MPI_H
#define BK_TRAIN_MPI_H
#include "../cli.h"

/* When a launcher announced several processes: MPI_Init (*started = 1) and
 * comm over MPI_COMM_WORLD; otherwise comm->size = 1. CLI_FAIL after a
 * message when MPI cannot start, or when this build has no MPI. */
int cli_mpi_start(int *argc, char ***argv, bk_train_comm *comm, int *started);
/* MPI_Finalize when cli_mpi_start started MPI */
void cli_mpi_stop(int started);
/* 1 when built with MPI */
int cli_mpi_built(void);

#endif
