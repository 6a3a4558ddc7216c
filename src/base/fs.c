#include "base/fs.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/checked.h"
#include "base/err.h"
#include "base/log.h"

// What a path is when it is not a regular file, for messages.
static const char *file_kind(mode_t m) {
    return S_ISDIR(m)    ? "a directory"
           : S_ISFIFO(m) ? "a FIFO"
           : S_ISSOCK(m) ? "a socket"
           : S_ISCHR(m)  ? "a character device"
           : S_ISBLK(m)  ? "a block device"
                         : "not a regular file";
}

// Opens an input file for reading, refusing anything but a regular file
// before it could block: stat first (a FIFO's open waits for a writer, a
// directory or device has no size to read), then open non-blocking and check
// the opened file again (the path may have changed in between). *size is its size.
static int open_regular(const char *path, int *fd_out, size_t *size) {
    struct stat st;
    if (stat(path, &st) != 0)
        return err_set(errno == ENOENT || errno == ENOTDIR ? ERR_INPUT : ERR_IO, "%s: cannot open: %s", path,
                       strerror(errno));
    if (!S_ISREG(st.st_mode)) return err_set(ERR_INPUT, "%s: is %s, not a regular file", path, file_kind(st.st_mode));
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return err_set(errno == ENOENT ? ERR_INPUT : ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return err_set(ERR_INPUT, "%s: not a regular file", path);
    }
    *fd_out = fd;
    *size = (size_t)st.st_size;
    return 0;
}

void mfile_release(const mfile_t *mf, size_t off, size_t len) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (!mf->data || off >= mf->size) return;
    if (len > mf->size - off) len = mf->size - off;
    size_t lo = (off + page - 1) / page * page, hi = (off + len) / page * page;
    if (off + len == mf->size) hi = (mf->size + page - 1) / page * page;   // the last page is the file's own
    if (hi > lo) madvise((void *)(mf->data + lo), hi - lo, MADV_DONTNEED); // advice only: failure is harmless
}

int mfile_open(mfile_t *mf, const char *path) {
    memset(mf, 0, sizeof *mf);
    mf->fd = -1;
    snprintf(mf->path, sizeof mf->path, "%s", path);
    int fd;
    TRY(open_regular(path, &fd, &mf->size));
    mf->fd = fd;
    if (mf->size == 0) return 0;
    void *p = mmap(NULL, mf->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
        close(fd);
        mf->fd = -1;
        return err_set(ERR_IO, "%s: mmap of %zu bytes failed: %s", path, mf->size, strerror(errno));
    }
    mf->data = p;
    return 0;
}

void mfile_close(mfile_t *mf) {
    if (mf->data) munmap((void *)mf->data, mf->size);
    if (mf->fd >= 0) close(mf->fd);
    mf->data = NULL;
    mf->fd = -1;
}

int fs_read_all(const char *path, char **out, size_t *len) {
    *out = NULL;
    int fd;
    size_t n;
    TRY(open_regular(path, &fd, &n));
    if (n > (size_t)LIM_TEXT_BYTES) {
        close(fd);
        return err_set(ERR_INPUT, "%s: %zu bytes, more than the %lld a file read whole may have", path, n,
                       (long long)LIM_TEXT_BYTES);
    }
    char *buf = malloc(n + 1);
    if (!buf) {
        close(fd);
        return err_set(ERR_NOMEM, "%s: out of memory reading %zu bytes", path, n);
    }
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    if (got != n) {
        free(buf);
        return err_set(ERR_IO, "%s: short read (%zu of %zu bytes)", path, got, n);
    }
    buf[n] = 0;
    *out = buf;
    if (len) *len = n;
    return 0;
}

int fs_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

int fs_is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int fs_mkdir_p(const char *path) {
    char buf[1024];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof buf) return err_set(ERR_INPUT, "bad directory path '%s'", path);
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] == '/' || buf[i] == 0) {
            char c = buf[i];
            buf[i] = 0;
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                return err_set(ERR_IO, "%s: cannot create directory: %s", buf, strerror(errno));
            buf[i] = c;
        }
    }
    if (!fs_is_dir(path)) return err_set(ERR_IO, "%s: exists and is not a directory", path);
    return 0;
}

int fs_join(char *out, size_t cap, const char *dir, const char *name) {
    int n = snprintf(out, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap) return err_set(ERR_INPUT, "path too long: %s/%s", dir, name);
    return 0;
}

// ---- temporaries -------------------------------------------------------------

#define TMP_TAG ".hylo-tmp."

// Removes a file, or a folder with everything in it (symbolic links are
// removed, not followed). Best effort: what cannot be removed stays.
static void remove_tree(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) return;
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        if (d) {
            struct dirent *e;
            char p[2048];
            while ((e = readdir(d))) {
                if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
                if (snprintf(p, sizeof p, "%s/%s", path, e->d_name) < (int)sizeof p) remove_tree(p);
            }
            closedir(d);
        }
        rmdir(path);
    } else {
        unlink(path);
    }
}

void fs_remove_tree(const char *path) { remove_tree(path); }

// "DIR/BASE" -> dir "DIR" (or "."), base "BASE".
static void split_path(const char *path, char *dir, size_t dcap, const char **base) {
    const char *sl = strrchr(path, '/');
    if (!sl) {
        snprintf(dir, dcap, ".");
        *base = path;
    } else if (sl == path) {
        snprintf(dir, dcap, "/");
        *base = sl + 1;
    } else {
        snprintf(dir, dcap, "%.*s", (int)(sl - path), path);
        *base = sl + 1;
    }
}

void fs_tmp_name(char *out, size_t cap, const char *path) {
    snprintf(out, cap, "%s" TMP_TAG "%d", path, (int)getpid());
}

int fs_remove_stale(const char *path) {
    char dir[1024];
    const char *base;
    split_path(path, dir, sizeof dir, &base);
    size_t bl = strlen(base), tl = strlen(TMP_TAG);
    DIR *d = opendir(dir);
    if (!d) return 0;
    int removed = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *n = e->d_name;
        if (strncmp(n, base, bl) || strncmp(n + bl, TMP_TAG, tl)) continue;
        const char *digits = n + bl + tl;
        char *end;
        long pid = strtol(digits, &end, 10);
        if (!*digits || *end || pid <= 0 || pid > INT32_MAX) continue;
        // Alive (or not ours to ask about): left alone. A pid of this process
        // is a leftover of an earlier process that had the same pid.
        if (pid != (long)getpid() && !(kill((pid_t)pid, 0) != 0 && errno == ESRCH)) continue;
        char p[2048];
        if (snprintf(p, sizeof p, "%s/%s", dir, n) >= (int)sizeof p) continue;
        remove_tree(p);
        log_warn("removed %s, left behind by an interrupted run (process %ld is gone)", p, pid);
        removed++;
    }
    closedir(d);
    return removed;
}

int fs_atomic_open(afile_t *af, const char *path) {
    memset(af, 0, sizeof *af);
    snprintf(af->path, sizeof af->path, "%s", path);
    fs_tmp_name(af->tmp, sizeof af->tmp, path);
    fs_remove_stale(path);
    // Created non-blocking and never through a link, so whatever sits at the
    // temporary name cannot make the open block or write elsewhere.
    int fd = open(af->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
    struct stat st;
    if (fd >= 0 && (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))) {
        close(fd);
        return err_set(ERR_IO, "%s: cannot create: something that is not a regular file is in the way", af->tmp);
    }
    if (fd < 0 || !(af->f = fdopen(fd, "wb"))) {
        int e = errno;
        if (fd >= 0) close(fd);
        af->tmp[0] = 0; // nothing of ours to remove
        return err_set(ERR_IO, "%s: cannot create: %s", path, strerror(e));
    }
    return 0;
}

// ---- output folders ------------------------------------------------------------

static int dir_is_empty(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    int empty = 1;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) empty = 0;
    closedir(d);
    return empty;
}

int fs_outdir_begin(outdir_t *o, const char *dir) {
    memset(o, 0, sizeof *o);
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') // "out/" is "out"
        n--;
    if (n == 0) return err_set(ERR_INPUT, "the output folder path is empty");
    if (n >= sizeof o->path - 32) return err_set(ERR_INPUT, "%s: output folder path too long", dir);
    memcpy(o->path, dir, n);
    o->path[n] = 0;
    struct stat st;
    if (lstat(o->path, &st) == 0) {
        if (!S_ISDIR(st.st_mode)) return err_set(ERR_INPUT, "%s: output folder exists and is not a folder", o->path);
        if (!dir_is_empty(o->path)) return err_set(ERR_INPUT, "%s: output folder exists and is not empty", o->path);
    } else if (errno != ENOENT) {
        return err_set(ERR_INPUT, "%s: output folder cannot be used: %s", o->path, strerror(errno));
    }
    char parent[1024];
    const char *base;
    split_path(o->path, parent, sizeof parent, &base);
    if (!*base || !strcmp(base, ".") || !strcmp(base, ".."))
        return err_set(ERR_INPUT, "%s: not a folder name the output can be renamed onto", o->path);
    TRY(fs_mkdir_p(parent));
    fs_remove_stale(o->path);
    // The temporary is made now, before any work: a parent that cannot be
    // written (read-only, no permission, full) fails here, not at the end.
    fs_tmp_name(o->tmp, sizeof o->tmp, o->path);
    remove_tree(o->tmp); // an earlier process's, with our pid
    if (mkdir(o->tmp, 0755) != 0) {
        int e = errno;
        o->tmp[0] = 0;
        return err_set(e == ENOENT || e == ENOTDIR ? ERR_INPUT : ERR_IO, "%s: cannot create the output folder: %s",
                       o->path, strerror(e));
    }
    return 0;
}

int fs_outdir_commit(outdir_t *o) {
    struct stat st;
    // The folder may have appeared meanwhile: an empty one is replaced, anything else is kept.
    if (lstat(o->path, &st) == 0) {
        if (!S_ISDIR(st.st_mode) || !dir_is_empty(o->path) || rmdir(o->path) != 0) {
            fs_outdir_abort(o);
            return err_set(ERR_IO, "%s: output folder appeared while writing and is not empty", o->path);
        }
    }
    if (rename(o->tmp, o->path) != 0) {
        int e = errno;
        fs_outdir_abort(o);
        return err_set(ERR_IO, "%s: cannot rename the finished output onto it: %s", o->path, strerror(e));
    }
    o->tmp[0] = 0;
    return 0;
}

void fs_outdir_abort(outdir_t *o) {
    if (o->tmp[0]) remove_tree(o->tmp);
    o->tmp[0] = 0;
}

int fs_write(afile_t *af, const void *data, size_t len) {
    if (len && fwrite(data, 1, len, af->f) != len)
        return err_set(ERR_IO, "%s: write failed: %s", af->tmp, strerror(errno));
    return 0;
}

int fs_atomic_commit(afile_t *af) {
    int bad = fflush(af->f) != 0 || fsync(fileno(af->f)) != 0;
    bad |= fclose(af->f) != 0;
    af->f = NULL;
    if (bad) {
        unlink(af->tmp);
        return err_set(ERR_IO, "%s: write failed: %s", af->path, strerror(errno));
    }
    if (rename(af->tmp, af->path) != 0) {
        unlink(af->tmp);
        return err_set(ERR_IO, "%s: rename failed: %s", af->path, strerror(errno));
    }
    return 0;
}

void fs_atomic_abort(afile_t *af) {
    if (af->f) fclose(af->f);
    af->f = NULL;
    if (af->tmp[0]) unlink(af->tmp);
}

int fs_write_all(const char *path, const void *data, size_t len) {
    afile_t af;
    TRY(fs_atomic_open(&af, path));
    int rc = fs_write(&af, data, len);
    if (rc < 0) {
        fs_atomic_abort(&af);
        return rc;
    }
    return fs_atomic_commit(&af);
}
