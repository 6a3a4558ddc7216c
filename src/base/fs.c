#include "base/fs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/err.h"

int mfile_open(mfile_t *mf, const char *path) {
    memset(mf, 0, sizeof *mf);
    mf->fd = -1;
    snprintf(mf->path, sizeof mf->path, "%s", path);
    int fd = open(path, O_RDONLY);
    if (fd < 0) return err_set(errno == ENOENT ? ERR_INPUT : ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return err_set(ERR_INPUT, "%s: not a regular file", path);
    }
    mf->size = (size_t)st.st_size;
    mf->fd = fd;
    if (mf->size == 0) return 0;
    void *p = mmap(NULL, mf->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
        close(fd);
        mf->fd = -1;
        return err_set(ERR_IO, "%s: mmap failed: %s", path, strerror(errno));
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
    FILE *f = fopen(path, "rb");
    if (!f) return err_set(errno == ENOENT ? ERR_INPUT : ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0) {
        fclose(f);
        return err_set(ERR_IO, "%s: cannot seek", path);
    }
    long n = ftell(f);
    rewind(f);
    if (n < 0) {
        fclose(f);
        return err_set(ERR_IO, "%s: cannot size", path);
    }
    char *buf = malloc((size_t)n + 1);
    if (!buf) {
        fclose(f);
        return err_set(ERR_NOMEM, "%s: out of memory reading %ld bytes", path, n);
    }
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        fclose(f);
        return err_set(ERR_IO, "%s: short read", path);
    }
    fclose(f);
    buf[n] = 0;
    *out = buf;
    if (len) *len = (size_t)n;
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

void fs_remove_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[2048];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(dir);
}
