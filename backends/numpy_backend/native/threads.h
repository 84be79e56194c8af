/* The OpenMP thread of the caller and the team size, or 0 and 1 in a build without OpenMP. */
#ifndef PAGEDSERVE_THREADS_H
#define PAGEDSERVE_THREADS_H

#ifdef _OPENMP
#include <omp.h>
#define THREAD_ID omp_get_thread_num()
#define MAX_THREADS omp_get_max_threads()
#define TEAM_SIZE omp_get_num_threads() /* the enclosing parallel region's */
#else
#define THREAD_ID 0
#define MAX_THREADS 1
#define TEAM_SIZE 1
#endif

#endif
