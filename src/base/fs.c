#include "base/fs.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/checked.h"
#include "base/err.h"

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

int fs_atomic_open(afile_t *af, const char *path) {
    memset(af, 0, sizeof *af);
    snprintf(af->path, sizeof af->path, "%s", path);
    snprintf(af->tmp, sizeof af->tmp, "%s.tmp.%d", path, (int)getpid());
    af->f = fopen(af->tmp, "wb");
    if (!af->f) return err_set(ERR_IO, "%s: cannot create: %s", af->tmp, strerror(errno));
    return 0;
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
