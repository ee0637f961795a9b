"""An LD_PRELOAD fault-injection shim, compiled on first use with the system C compiler.

Environment variables read at each call (so a child may set and clear them between saves):
``SP_FAULT_FLOCK`` (any value): ``flock`` fails with ENOSYS (a file system without locks);
``SP_FAULT_FSYNC=<text>``: ``fsync``/``fdatasync`` fail with EIO on files whose path contains
the text; ``SP_FAULT_FSYNC_DIR``: they fail on directories; ``SP_FAULT_UNLINK=<text>``:
``unlink``/``unlinkat`` fail with EIO on paths containing the text.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

__all__ = ["build_shim"]

_SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int flock(int fd, int op) {
    if (getenv("SP_FAULT_FLOCK")) { errno = ENOSYS; return -1; }
    int (*real)(int, int) = (int (*)(int, int))dlsym(RTLD_NEXT, "flock");
    return real(fd, op);
}

static int should_fail(int fd) {
    struct stat st;
    if (getenv("SP_FAULT_FSYNC_DIR") && fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) return 1;
    const char *pat = getenv("SP_FAULT_FSYNC");
    if (!pat) return 0;
    char link[64], target[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n <= 0) return 0;
    target[n] = 0;
    return strstr(target, pat) != NULL;
}

int fsync(int fd) {
    if (should_fail(fd)) { errno = EIO; return -1; }
    int (*real)(int) = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    return real(fd);
}

static int unlink_fails(const char *path) {
    const char *pat = getenv("SP_FAULT_UNLINK");
    return pat && path && strstr(path, pat) != NULL;
}

int unlink(const char *path) {
    if (unlink_fails(path)) { errno = EIO; return -1; }
    int (*real)(const char *) = (int (*)(const char *))dlsym(RTLD_NEXT, "unlink");
    return real(path);
}

int unlinkat(int dirfd, const char *path, int flags) {
    if (unlink_fails(path)) { errno = EIO; return -1; }
    int (*real)(int, const char *, int) = (int (*)(int, const char *, int))dlsym(RTLD_NEXT, "unlinkat");
    return real(dirfd, path, flags);
}

int fdatasync(int fd) {
    if (should_fail(fd)) { errno = EIO; return -1; }
    int (*real)(int) = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    return real(fd);
}
"""


def build_shim(directory: str) -> str:
    """Compile the shim into ``directory``; returns the path of the shared object."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the fault-injection shim")
    src, lib = os.path.join(directory, "shim.c"), os.path.join(directory, "shim.so")
    with open(src, "w") as f:
        f.write(_SHIM)
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", lib, src, "-ldl"], check=True)
    return lib
