// Files: read-only mappings, whole-file reads, and atomic writes (temporary name
// in the same folder, renamed when complete, so no partial output is ever left).
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct {
    const uint8_t *data;
    size_t size;
    int fd;
    char path[1024];
} mfile_t;

// Inputs must be regular files: a directory, FIFO, socket or device is
// ERR_INPUT naming it, refused before anything could block on it.
int mfile_open(mfile_t *mf, const char *path);
void mfile_close(mfile_t *mf);
// Gives back the pages of [off, off + len) that a read has touched (whole
// pages inside the range; the mapping stays valid and rereads from the page
// cache). A loader that copies a file's contents elsewhere calls it after
// each part so that the process does not hold the file twice.
void mfile_release(const mfile_t *mf, size_t off, size_t len);

// Reads a whole regular file (at most LIM_TEXT_BYTES) into a malloc'ed,
// NUL-terminated buffer.
int fs_read_all(const char *path, char **out, size_t *len);
int fs_exists(const char *path);
int fs_is_dir(const char *path);
int fs_mkdir_p(const char *path);
// path joining into a caller buffer; returns ERR_INPUT if it would not fit.
int fs_join(char *out, size_t cap, const char *dir, const char *name);

// Temporaries are named "<path>.hylo-tmp.<pid>" (fs_tmp_name), so that one
// left by a killed run is recognisable: fs_remove_stale removes those of path
// whose process is gone (files or folders), each with a warning naming it,
// and returns how many. Both output kinds below call it before they start.
void fs_tmp_name(char *out, size_t cap, const char *path);
int fs_remove_stale(const char *path);
// Removes a file or a folder with everything in it (links are not followed).
void fs_remove_tree(const char *path);

// Atomic output: fs_atomic_open creates the temporary of path and returns a
// FILE*; fs_atomic_commit flushes, fsyncs and renames onto path;
// fs_atomic_abort removes the temporary. Exactly one of commit/abort must
// follow an open.
typedef struct {
    FILE *f;
    char path[1024];
    char tmp[1100];
} afile_t;
int fs_atomic_open(afile_t *af, const char *path);
int fs_atomic_commit(afile_t *af);
void fs_atomic_abort(afile_t *af);
// Writes a whole buffer atomically.
int fs_write_all(const char *path, const void *data, size_t len);
// fwrite with error reporting that names the file.
int fs_write(afile_t *af, const void *data, size_t len);

// An output folder that appears complete or not at all. fs_outdir_begin
// checks it before any work: trailing slashes are dropped ("out/" is "out");
// the path must not exist or be an empty folder (ERR_INPUT otherwise); its
// parent is created if missing; stale temporaries of the path are removed;
// and the temporary folder o->tmp is created now, so an unwritable parent
// fails here. The files go into o->tmp; fs_outdir_commit renames it onto
// o->path; fs_outdir_abort removes it. One of them must follow a begin.
typedef struct {
    char path[1024]; // the output folder, without trailing slashes
    char tmp[1100];  // "<path>.hylo-tmp.<pid>", empty once committed or aborted
} outdir_t;
int fs_outdir_begin(outdir_t *o, const char *dir);
int fs_outdir_commit(outdir_t *o);
void fs_outdir_abort(outdir_t *o);
