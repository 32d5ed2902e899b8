/* An LD_PRELOAD library that makes CLOCK_MONOTONIC (and its raw and coarse variants) run
 * behind the real clock by the number of nanoseconds stored in the file named by
 * ANYLOCK_TEST_MONOTONIC_SKIP_FILE (8 bytes, native endian, mapped shared, so a test can
 * change it while the process runs). CLOCK_BOOTTIME and the wall clock are left alone.
 *
 * A test stops a process with SIGSTOP, stores the stopped time in the file, and continues
 * it: the process then sees what a machine suspend looks like, where the monotonic clock
 * skips the suspended time and the boot clock does not (test-kit's `suspend` module). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static int (*real_clock_gettime)(clockid_t, struct timespec *);
static volatile const int64_t *skip;

__attribute__((constructor)) static void init(void) {
    real_clock_gettime = dlsym(RTLD_NEXT, "clock_gettime");
    const char *path = getenv("ANYLOCK_TEST_MONOTONIC_SKIP_FILE");
    if (path == NULL) {
        return;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return;
    }
    void *map = mmap(NULL, sizeof(int64_t), PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (map != MAP_FAILED) {
        skip = map;
    }
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
    int rc = real_clock_gettime(clock, ts);
    int monotonic = clock == CLOCK_MONOTONIC || clock == CLOCK_MONOTONIC_RAW ||
                    clock == CLOCK_MONOTONIC_COARSE;
    if (rc != 0 || skip == NULL || !monotonic) {
        return rc;
    }
    int64_t ns = (int64_t)ts->tv_sec * 1000000000 + ts->tv_nsec - *skip;
    ts->tv_sec = ns / 1000000000;
    ts->tv_nsec = ns % 1000000000;
    return rc;
}
