/* CHECK(call): a libfabric call that must return 0; otherwise the program
 * says which call failed and why, and exits with 1. Define PROG (the
 * program's name, a string literal) before including this. Shared by the
 * benchmark programs of this directory. */
#ifndef RDMX_BENCH_CHECK_H
#define RDMX_BENCH_CHECK_H
#include <rdma/fi_errno.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(x)                                                                   \
    do {                                                                           \
        int _r = (int)(x);                                                         \
        if (_r) {                                                                  \
            fprintf(stderr, PROG ": %s: %s (%d)\n", #x, fi_strerror(-_r), _r);     \
            exit(1);                                                               \
        }                                                                          \
    } while (0)

#endif
