/* worldline.daemon._walk: one pass over a folder tree, for full scans.
 *
 * walk(root_fd, inotify_fd, mask, max_depth, overlay, files, folders, root_sig[, prefix])
 *     -> (records, reused, root)
 *
 * The pure-Python twin, the contract and the tests that hold both to it are in
 * daemon/walk.py and tests/test_walk.py; this file does the same work without an
 * interpreter round trip per entry. Every folder is opened with O_NOFOLLOW relative to
 * its parent's descriptor, watched (when inotify_fd >= 0) through /proc/self/fd before
 * it is listed, then listed with one fstatat(AT_SYMLINK_NOFOLLOW) per entry; those
 * system calls run without the GIL.
 *
 * files is the stat cache (path -> (signature, digest)), folders the folder memos
 * (path -> (signature, tree digest, size, kind)); paths start at prefix. A signature is
 * the 36 bytes of struct.pack("=qqqQI", size, mtime_ns, ctime_ns, ino, mode). A memo holds
 * when the folder's own signature is the memo's, every file in it matches the stat
 * cache, every folder in it is held by its memo, and it holds nothing but files,
 * folders and symlinks. Such a folder gives no record: it is listed in reused as
 * (relpath, wd) and its parent's entry carries the memo.
 *
 * A record is (relpath, wd, opaque, entries), children before their parent. An entry
 * is (name, signature, extra): extra is the child's record index or memo for a folder,
 * the target for a symlink, st_rdev for a device, None otherwise. root is the root's
 * record index or memo. wd is the watch descriptor, minus the errno when the watch
 * could not be added, 0 when not watching. An entry that vanishes while it is read is
 * left out (as os.scandir would); any other failure raises OSError; a folder deeper
 * than max_depth raises RecursionError naming it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#define DIR_FLAGS (O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)

typedef struct {
    size_t name;     /* offset of the NUL-terminated name in the buffer */
    size_t target;   /* offset of a symlink's target, when is_link */
    size_t target_len;
    int is_link;
    struct stat st;
} item_t;

typedef struct {
    item_t *items;
    size_t n, cap;
    char *buf;
    size_t used, size;
    int err;          /* errno of a failure that aborts the walk, 0 if none */
    const char *what; /* which call failed */
} listing_t;

typedef struct {
    PyObject *records; /* folders whose memo does not hold, children first */
    PyObject *reused;  /* (relpath, wd) of folders whose memo holds */
    PyObject *files;   /* path -> (signature, digest): the stat cache */
    PyObject *folders; /* path -> (signature, tree digest, size): folder memos */
    int inotify_fd;
    uint32_t mask;
    int max_depth;
    int overlay;
} walk_t;

static int reserve(listing_t *l, size_t extra) {
    if (l->used + extra <= l->size)
        return 0;
    size_t size = l->size ? l->size : 4096;
    while (l->used + extra > size)
        size *= 2;
    char *buf = realloc(l->buf, size);
    if (buf == NULL)
        return -1;
    l->buf = buf;
    l->size = size;
    return 0;
}

static item_t *push_item(listing_t *l) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 32;
        item_t *items = realloc(l->items, cap * sizeof(item_t));
        if (items == NULL)
            return NULL;
        l->items = items;
        l->cap = cap;
    }
    return &l->items[l->n++];
}

/* Runs without the GIL: watch, then list the folder open at dfd. */
static void list_folder(int dfd, const walk_t *w, listing_t *l, int *wd, int *opaque) {
    *wd = 0;
    *opaque = 0;
    if (w->inotify_fd >= 0) {
        char proc[64];
        snprintf(proc, sizeof proc, "/proc/self/fd/%d", dfd);
        int r = inotify_add_watch(w->inotify_fd, proc, w->mask);
        *wd = r < 0 ? -errno : r;
    }
    if (w->overlay) {
        char value[2];
        ssize_t n = fgetxattr(dfd, "trusted.overlay.opaque", value, sizeof value);
        *opaque = n == 1 && value[0] == 'y';
    }
    int fd = dup(dfd);
    if (fd < 0) {
        l->err = errno;
        l->what = "dup";
        return;
    }
    DIR *dir = fdopendir(fd);
    if (dir == NULL) {
        l->err = errno;
        l->what = "fdopendir";
        close(fd);
        return;
    }
    rewinddir(dir); /* a dup shares its offset with the caller's descriptor */
    struct dirent *de;
    for (;;) {
        errno = 0;
        de = readdir(dir);
        if (de == NULL) {
            if (errno != 0) {
                l->err = errno;
                l->what = "readdir";
            }
            break;
        }
        const char *name = de->d_name;
        if (name[0] == '.' && (name[1] == 0 || (name[1] == '.' && name[2] == 0)))
            continue;
        size_t len = strlen(name);
        item_t *it = push_item(l);
        if (it == NULL || reserve(l, len + 1) < 0) {
            l->err = ENOMEM;
            l->what = "malloc";
            break;
        }
        if (fstatat(dfd, name, &it->st, AT_SYMLINK_NOFOLLOW) < 0) {
            l->n--;
            if (errno == ENOENT)
                continue; /* removed while we looked */
            l->err = errno;
            l->what = "fstatat";
            break;
        }
        it->name = l->used;
        memcpy(l->buf + l->used, name, len + 1);
        l->used += len + 1;
        it->is_link = S_ISLNK(it->st.st_mode);
        if (it->is_link) {
            size_t cap = (size_t)it->st.st_size + 1;
            if (cap < 256)
                cap = 256;
            for (;;) {
                if (reserve(l, cap) < 0) {
                    l->err = ENOMEM;
                    l->what = "malloc";
                    break;
                }
                /* name is re-read from the buffer: reserve may have moved it */
                ssize_t n = readlinkat(dfd, l->buf + it->name, l->buf + l->used, cap);
                if (n < 0) {
                    if (errno == ENOENT) {
                        l->n--;
                    } else {
                        l->err = errno;
                        l->what = "readlinkat";
                    }
                    break;
                }
                if ((size_t)n < cap) {
                    it->target = l->used;
                    it->target_len = (size_t)n;
                    l->used += (size_t)n;
                    break;
                }
                cap *= 2; /* the link grew between fstatat and readlinkat */
            }
            if (l->err)
                break;
        }
    }
    closedir(dir);
}

/* The 36 bytes of struct.pack("=qqqQI", size, mtime_ns, ctime_ns, ino, mode). */
#define SIG_LEN 36
static void signature(const struct stat *st, char out[SIG_LEN]) {
    long long size = (long long)st->st_size;
    long long mtime = (long long)st->st_mtim.tv_sec * 1000000000LL + st->st_mtim.tv_nsec;
    long long ctime = (long long)st->st_ctim.tv_sec * 1000000000LL + st->st_ctim.tv_nsec;
    unsigned long long ino = (unsigned long long)st->st_ino;
    unsigned int mode = (unsigned int)st->st_mode;
    memcpy(out, &size, 8);
    memcpy(out + 8, &mtime, 8);
    memcpy(out + 16, &ctime, 8);
    memcpy(out + 24, &ino, 8);
    memcpy(out + 32, &mode, 4);
}

static void os_error(int err, const char *rel) {
    errno = err;
    PyObject *path = PyUnicode_DecodeFSDefault(*rel ? rel : ".");
    if (path != NULL) {
        PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, path);
        Py_DECREF(path);
    }
}

static char *join(const char *rel, const char *name) {
    size_t a = strlen(rel), b = strlen(name);
    char *out = malloc(a + b + 2);
    if (out == NULL)
        return NULL;
    if (a) {
        memcpy(out, rel, a);
        out[a++] = '/';
    }
    memcpy(out + a, name, b + 1);
    return out;
}

/* 1 when files[path] is (signature, digest) with this signature, 0 if not, -1 on error. */
static int file_matches(walk_t *w, const char *path, const char sig[SIG_LEN]) {
    PyObject *key = PyUnicode_DecodeFSDefault(path);
    if (key == NULL)
        return -1;
    PyObject *known = PyDict_GetItemWithError(w->files, key);
    Py_DECREF(key);
    if (known == NULL)
        return PyErr_Occurred() ? -1 : 0;
    if (!PyTuple_Check(known) || PyTuple_GET_SIZE(known) < 1)
        return 0;
    PyObject *s = PyTuple_GET_ITEM(known, 0);
    return PyBytes_Check(s) && PyBytes_GET_SIZE(s) == SIG_LEN &&
           memcmp(PyBytes_AS_STRING(s), sig, SIG_LEN) == 0;
}

/* Walk the folder open at dfd (relpath rel, own signature sig). Returns a new reference:
 * the index (int) of the folder's record, or its memo (the folders[rel] tuple) when the
 * memo holds for the whole subtree; NULL with an exception set on failure. */
static PyObject *walk_folder(walk_t *w, int dfd, const char *rel, const char sig[SIG_LEN],
                             int depth) {
    if (depth > w->max_depth) {
        PyObject *path = PyUnicode_DecodeFSDefault(rel);
        if (path != NULL) {
            PyErr_SetObject(PyExc_RecursionError, path);
            Py_DECREF(path);
        }
        return NULL;
    }
    listing_t l = {0};
    int wd, opaque;
    Py_BEGIN_ALLOW_THREADS
    list_folder(dfd, w, &l, &wd, &opaque);
    Py_END_ALLOW_THREADS
    PyObject *result = NULL, *children = NULL, *rel_obj = NULL;
    char (*sigs)[SIG_LEN] = NULL;
    if (l.err) {
        os_error(l.err, rel);
        goto done;
    }
    rel_obj = PyUnicode_DecodeFSDefault(rel);
    children = PyList_New((Py_ssize_t)l.n); /* per item: a folder's result, else None */
    sigs = malloc((l.n ? l.n : 1) * SIG_LEN);
    if (rel_obj == NULL || children == NULL || sigs == NULL) {
        if (sigs == NULL)
            PyErr_NoMemory();
        goto done;
    }
    PyObject *memo = PyDict_GetItemWithError(w->folders, rel_obj); /* borrowed */
    if (memo == NULL && PyErr_Occurred())
        goto done;
    int reusable = memo != NULL && PyTuple_Check(memo) && PyTuple_GET_SIZE(memo) == 4 &&
                   PyBytes_Check(PyTuple_GET_ITEM(memo, 0)) &&
                   PyBytes_GET_SIZE(PyTuple_GET_ITEM(memo, 0)) == SIG_LEN &&
                   memcmp(PyBytes_AS_STRING(PyTuple_GET_ITEM(memo, 0)), sig, SIG_LEN) == 0;
    size_t kept = 0;
    for (size_t i = 0; i < l.n; i++) {
        item_t *it = &l.items[i];
        const char *name = l.buf + it->name;
        signature(&it->st, sigs[i]);
        PyObject *child = Py_NewRef(Py_None);
        if (S_ISDIR(it->st.st_mode) || S_ISREG(it->st.st_mode)) {
            char *path = join(rel, name);
            if (path == NULL) {
                Py_DECREF(child);
                PyErr_NoMemory();
                goto done;
            }
            if (S_ISDIR(it->st.st_mode)) {
                int sub;
                Py_BEGIN_ALLOW_THREADS
                sub = openat(dfd, name, DIR_FLAGS);
                Py_END_ALLOW_THREADS
                if (sub < 0) {
                    int err = errno;
                    Py_DECREF(child);
                    if (err == ENOENT) { /* removed while we looked */
                        free(path);
                        it->name = (size_t)-1;
                        PyList_SET_ITEM(children, (Py_ssize_t)i, Py_NewRef(Py_None));
                        continue;
                    }
                    os_error(err, path);
                    free(path);
                    goto done;
                }
                Py_DECREF(child);
                child = walk_folder(w, sub, path, sigs[i], depth + 1);
                close(sub);
                if (child == NULL) {
                    free(path);
                    goto done;
                }
                if (!PyTuple_Check(child))
                    reusable = 0; /* the child folder changed */
            } else if (reusable) {
                int m = file_matches(w, path, sigs[i]);
                if (m < 0) {
                    free(path);
                    Py_DECREF(child);
                    goto done;
                }
                reusable = m;
            }
            free(path);
        } else if (!it->is_link) {
            reusable = 0; /* anything but files, folders and symlinks is looked at again */
        }
        PyList_SET_ITEM(children, (Py_ssize_t)i, child);
        kept++;
    }
    if (reusable) {
        PyObject *pair = Py_BuildValue("(Oi)", rel_obj, wd);
        if (pair == NULL || PyList_Append(w->reused, pair) < 0) {
            Py_XDECREF(pair);
            goto done;
        }
        Py_DECREF(pair);
        result = Py_NewRef(memo);
        goto done;
    }
    PyObject *entries = PyList_New(0);
    if (entries == NULL)
        goto done;
    for (size_t i = 0; i < l.n; i++) {
        item_t *it = &l.items[i];
        if (it->name == (size_t)-1)
            continue;
        PyObject *extra = PyList_GET_ITEM(children, (Py_ssize_t)i);
        if (it->is_link)
            extra = PyUnicode_DecodeFSDefaultAndSize(l.buf + it->target,
                                                     (Py_ssize_t)it->target_len);
        else if (S_ISCHR(it->st.st_mode) || S_ISBLK(it->st.st_mode))
            extra = PyLong_FromUnsignedLongLong((unsigned long long)it->st.st_rdev);
        else
            Py_INCREF(extra);
        PyObject *entry = extra == NULL ? NULL : Py_BuildValue(
            "(Ny#N)", PyUnicode_DecodeFSDefault(l.buf + it->name), sigs[i],
            (Py_ssize_t)SIG_LEN, extra);
        if (entry == NULL || PyList_Append(entries, entry) < 0) {
            Py_XDECREF(entry);
            Py_DECREF(entries);
            goto done;
        }
        Py_DECREF(entry);
    }
    PyObject *record = Py_BuildValue("(OiON)", rel_obj, wd, opaque ? Py_True : Py_False,
                                     entries);
    if (record == NULL || PyList_Append(w->records, record) < 0) {
        Py_XDECREF(record);
        goto done;
    }
    Py_DECREF(record);
    result = PyLong_FromSsize_t(PyList_GET_SIZE(w->records) - 1);
    (void)kept;
done:
    Py_XDECREF(children);
    Py_XDECREF(rel_obj);
    free(sigs);
    free(l.items);
    free(l.buf);
    return result;
}

static PyObject *walk(PyObject *Py_UNUSED(self), PyObject *args) {
    walk_t w;
    unsigned int mask;
    int root_fd;
    const char *root_sig;
    Py_ssize_t root_sig_len;
    PyObject *prefix = NULL; /* bytes, from the optional str */
    if (!PyArg_ParseTuple(args, "iiIipO!O!y#|O&", &root_fd, &w.inotify_fd, &mask,
                          &w.max_depth, &w.overlay, &PyDict_Type, &w.files, &PyDict_Type,
                          &w.folders, &root_sig, &root_sig_len, PyUnicode_FSConverter,
                          &prefix))
        return NULL;
    if (root_sig_len != SIG_LEN) {
        Py_XDECREF(prefix);
        PyErr_SetString(PyExc_ValueError, "the root signature must be 36 bytes");
        return NULL;
    }
    w.mask = mask;
    w.records = PyList_New(0);
    w.reused = PyList_New(0);
    if (w.records == NULL || w.reused == NULL)
        goto fail;
    PyObject *root = walk_folder(&w, root_fd, prefix ? PyBytes_AS_STRING(prefix) : "",
                                 root_sig, 0);
    if (root == NULL)
        goto fail;
    Py_XDECREF(prefix);
    return Py_BuildValue("(NNN)", w.records, w.reused, root);
fail:
    Py_XDECREF(prefix);
    Py_XDECREF(w.records);
    Py_XDECREF(w.reused);
    return NULL;
}

static PyMethodDef methods[] = {
    {"walk", walk, METH_VARARGS,
     "walk(root_fd, inotify_fd, mask, max_depth, overlay, files, folders, root_sig[, prefix])"
     " -> (records, reused, root)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_walk", "One pass over a folder tree, for full scans.", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__walk(void) { return PyModule_Create(&module); }
